"""The watch loop's pipe reading (kernel/group/pipes.py) on real OS pipes: a pass reads at most
READ_BUDGET from one pipe and says when more waits, so the loop does not pause between passes
while a big result comes through a pipe (issue 44's MIN_PASS would make that 13 MB a second)."""

from __future__ import annotations

import fcntl
import os
import threading
from types import SimpleNamespace

from nbtrain.kernel.group.pipes import READ_BUDGET, Pipes


def _pipes_of_one_rank():
    ends = [os.pipe() for _ in range(3)]  # stdout, stderr, events
    for read_end, _ in ends:
        os.set_blocking(read_end, False)
    rank = SimpleNamespace(rank=0, pipes=SimpleNamespace(reader_fds=lambda: [r for r, _ in ends]))
    lines: list[str] = []
    pipes = Pipes([rank], lines=lambda r, kind, got: lines.extend(got),  # type: ignore[list-item]
                  event=lambda r, e: None, flushed=lambda output: None)
    return ends, pipes, lines


def test_a_pipe_holding_more_than_a_pass_reads_says_so_until_it_is_read_out() -> None:
    ends, pipes, lines = _pipes_of_one_rank()
    stdout_r, stdout_w = ends[0]
    with_room = fcntl.F_SETPIPE_SZ if hasattr(fcntl, "F_SETPIPE_SZ") else 1031
    fcntl.fcntl(stdout_w, with_room, 1 << 20)  # room for 1 MiB: written without a reader
    line = b"x" * 1023 + b"\n"
    os.write(stdout_w, line * 1024)  # 1 MiB: four passes' budget
    passes = 1
    while pipes.read(stdout_r):
        passes += 1
    # Four full passes say "more may wait"; the fifth finds the pipe empty: no backlog then.
    assert passes == (1 << 20) // READ_BUDGET + 1
    assert len(lines) == 1024
    os.write(stdout_w, line)
    assert pipes.read(stdout_r) is False  # what one pass reads whole is no backlog
    for read_end, write_end in ends:
        os.close(write_end)
        os.close(read_end)


def test_a_writer_still_writing_keeps_the_backlog_flag_up_while_the_pipe_is_full() -> None:
    ends, pipes, lines = _pipes_of_one_rank()
    stdout_r, stdout_w = ends[0]
    line = b"y" * 63 + b"\n"
    writer = threading.Thread(target=lambda: os.write(stdout_w, line * (1 << 14)))  # 1 MiB
    writer.start()
    backlogged = 0
    while writer.is_alive() or pipes.read(stdout_r):
        backlogged += pipes.read(stdout_r)
    writer.join()
    while pipes.read(stdout_r):
        pass
    assert len(lines) == 1 << 14 and backlogged > 0
    for read_end, write_end in ends:
        os.close(write_end)
        os.close(read_end)
