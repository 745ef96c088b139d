"""Frames and lines survive arbitrary chunking."""

from __future__ import annotations

import os
import pickle

from nbtrain.shared.errors import WorkerError
from nbtrain.shared.events import FrameDecoder, Log, PipeWriter, Progress, encode
from nbtrain.shared.lines import LineSplitter


def test_frames_decode_from_any_chunking():
    events = [Progress(0, i, 100, "train") for i in range(50)] + [Log(1, {"loss": 0.5}, 3)]
    data = b"".join(b"".join(encode(e)) for e in events)
    for size in (1, 3, 7, 64, len(data)):
        decoder = FrameDecoder()
        out = []
        for start in range(0, len(data), size):
            out.extend(decoder.feed(data[start : start + size]))
        assert out == events
        assert decoder.pending == 0


def test_pipe_writer_writes_large_frames_whole():
    read_fd, write_fd = os.pipe()
    big = Log(0, {f"m{i}": float(i) for i in range(20000)})
    pid = os.fork()
    if pid == 0:
        PipeWriter(write_fd).send(big)
        os._exit(0)
    os.close(write_fd)
    decoder, events = FrameDecoder(), []
    while chunk := os.read(read_fd, 4096):
        events.extend(decoder.feed(chunk))
    os.close(read_fd)
    os.waitpid(pid, 0)
    assert events == [big]


def test_processes_sharing_one_pipe_never_interleave_large_frames():
    """torch_xla's per-chip processes or DataLoader workers may share a rank's pipe."""
    read_fd, write_fd = os.pipe()
    writer = PipeWriter(write_fd)
    frames = {w: Log(w, {f"v{i}": float(w * 100000 + i) for i in range(3000)}) for w in range(4)}
    pids = []
    for w in range(4):
        pid = os.fork()
        if pid == 0:
            for _ in range(5):
                writer.send(frames[w])
            os._exit(0)
        pids.append(pid)
    os.close(write_fd)
    decoder, events = FrameDecoder(), []
    while chunk := os.read(read_fd, 65536):
        events.extend(decoder.feed(chunk))
    os.close(read_fd)
    for pid in pids:
        os.waitpid(pid, 0)
    assert sorted(events, key=lambda e: e.rank) == [frames[w] for w in range(4) for _ in range(5)]
    assert decoder.pending == 0


def test_lines_split_whole_across_chunks_and_utf8_boundaries():
    splitter = LineSplitter()
    data = "héllo wörld\nsecond 🚀 line\npartial".encode()
    lines = []
    for byte in data:
        lines.extend(splitter.feed(bytes([byte])))
    assert lines == ["héllo wörld", "second 🚀 line"]
    assert splitter.flush() == ["partial"]


def test_carriage_returns_keep_what_a_terminal_shows():
    splitter = LineSplitter()
    assert splitter.feed(b"10%\r50%\r100%\ndone\n") == ["100%", "done"]


def test_worker_error_pickles():
    err = WorkerError(
        1,
        type_name="ValueError",
        message="boom",
        exitcode=1,
        remote_traceback="tb",
        other_failures={0: "peer lost"},
    )
    back = pickle.loads(pickle.dumps(err))
    assert (back.rank, back.type_name, back.exitcode, back.remote_traceback) == (
        1,
        "ValueError",
        1,
        "tb",
    )
    assert str(back) == str(err)


def test_try_send_never_blocks_on_a_full_pipe_and_send_still_delivers():
    """A kernel that stops reading must not stall a rank's progress updates."""
    read_fd, write_fd = os.pipe()
    writer = PipeWriter(write_fd)
    accepted = sum(writer.try_send(Progress(0, i, 10**6)) for i in range(20000))
    assert 0 < accepted < 20000, "the pipe never filled, or nothing was accepted"
    decoder, events = FrameDecoder(), []
    os.set_blocking(read_fd, False)
    while True:
        try:
            chunk = os.read(read_fd, 65536)
        except BlockingIOError:
            break
        events.extend(decoder.feed(chunk))
    assert len(events) == accepted and decoder.pending == 0
    assert [e.step for e in events] == sorted(e.step for e in events)
    writer.send(Log(0, {"final": 1.0}))  # blocking path still works on the same pipe
    events = decoder.feed(os.read(read_fd, 65536))
    assert events == [Log(0, {"final": 1.0}, events[0].step, time=events[0].time)]
    os.close(read_fd)
    os.close(write_fd)


def test_a_frame_cut_short_is_dropped_not_glued_to_the_next_one():
    big, small = Log(0, {f"m{i}": float(i) for i in range(3000)}), Log(0, {"after": 1.0})
    first_packets = encode(big, writer=7)
    assert len(first_packets) > 2
    decoder = FrameDecoder()
    events = decoder.feed(b"".join(first_packets[:2]))  # the sender was interrupted here
    events += decoder.feed(b"".join(encode(small, writer=7)))
    assert events == [small]
    assert decoder.take_problems() == ["an event from process 7 was cut short and dropped"]
    assert decoder.pending == 0


def test_an_undecodable_frame_is_reported_and_the_next_one_still_decodes():
    good = Progress(1, 5, 10)
    header = encode(good, writer=3)[0][:9]  # a one-packet frame's header: same length
    garbage = b"\x80" * (len(encode(good)[0]) - 9)
    decoder = FrameDecoder()
    events = decoder.feed(header + garbage + b"".join(encode(good, writer=3)))
    assert events == [good]
    [problem] = decoder.take_problems()
    assert problem.startswith("an event from process 3 could not be decoded")


def test_a_keyboard_interrupt_in_the_middle_of_a_send_spoils_only_that_event():
    """The rank's main thread is interrupted (Ctrl-C reaching the rank) while a multi-packet
    frame waits for room in a full pipe; the events it sends afterwards must still arrive."""
    import signal
    import time

    read_fd, write_fd = os.pipe()
    big = Log(0, {f"m{i}": float(i) for i in range(30000)})  # far more than a pipe holds
    after = Log(0, {"after": 1.0})
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the sending rank
        os.close(read_fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        writer = PipeWriter(write_fd)
        try:
            writer.send(big)
            os._exit(2)  # the interrupt never came
        except KeyboardInterrupt:
            writer.send(after)
        os._exit(0)
    os.close(write_fd)
    time.sleep(0.5)  # the pipe is full and the sender blocked inside send()
    os.kill(pid, signal.SIGINT)
    decoder, events = FrameDecoder(), []
    while chunk := os.read(read_fd, 65536):
        events.extend(decoder.feed(chunk))
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert events == [after]
    assert decoder.take_problems() == [f"an event from process {pid} was cut short and dropped"]
