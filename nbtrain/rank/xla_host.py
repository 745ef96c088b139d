"""The XLA host process: torch_xla's launcher runs the ordinals here, each reporting as a rank.

Started by ``xla.run_xla`` under the kernel's start method. It prepares the process like any rank
(process group leader, dies with the kernel, fds 1/2 on the kernel's pipes), then hands the
function to ``xmp.spawn`` (always by fork: this process has never touched the XLA runtime). On
XLA:CPU the ordinals are threads of one process; on TPUs, processes of their own with device
threads. torch_xla decides how many: if that is not the count the kernel expects (and shows),
ordinal 0 fails the launch at once, saying both counts, before any user code runs. Each ordinal:

- installs a thread-local ``Runtime`` (rank = XLA ordinal) whose sink is this process's writer on
  the shared event pipe;
- writes ``print`` output through ``OrdinalStream``, which turns each whole line of the ordinal's
  thread into an ``Output`` event with its ordinal (threads share fds 1/2, so lines could not be
  told apart there); output of other threads and of C code still reaches the kernel on fds 1/2;
- reports Started, then Finished or Failed, like any rank (Failed also when its function
  returned after giving up on an XLA collective: ``xla_ordinals.XlaCollectiveAbandoned``).

An ordinal that fails takes its process down after a short grace (the others may wait for it in a
collective forever); the kernel then stops whatever is left.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from nbtrain.rank import debugger, runtime, startup, worker, xla_ordinals
from nbtrain.rank.failures import failure_event
from nbtrain.rank.runtime import Runtime
from nbtrain.shared.events import Event, Finished, Output, PipeWriter, Started
from nbtrain.shared.lines import LineSplitter
from nbtrain.shared.specs import HostSpec, RankInfo

FAILURE_GRACE = 0.5  # seconds a failed ordinal waits (peers' own reports) before ending its process

_events_fd: int | None = None
_writer: tuple[int, PipeWriter] | None = None  # (pid, writer): one writer per process


def process_sink() -> PipeWriter:
    """This process's writer on the event pipe, shared by its ordinal threads (its lock keeps a
    frame's packets together) and made anew in forked children."""
    global _writer
    if _writer is None or _writer[0] != os.getpid():
        assert _events_fd is not None, "the event pipe is set up by host_main"
        _writer = (os.getpid(), PipeWriter(_events_fd))
    return _writer[1]


# ---------------------------------------------------------------------------------------------
# Output per ordinal

_thread = threading.local()  # .ordinal, .sink, .splitters on threads running an ordinal


class OrdinalStream(io.TextIOBase):
    """sys.stdout / sys.stderr of the host: whole lines of ordinal threads become Output events
    of that ordinal; anything else goes to the process's own stream (fd 1 / fd 2)."""

    def __init__(self, kind: str, fallback: Any) -> None:
        self.kind = kind
        self.fallback = fallback

    def write(self, text: str) -> int:
        ordinal = getattr(_thread, "ordinal", None)
        if ordinal is None:
            return int(self.fallback.write(text) or 0)
        splitter: LineSplitter = _thread.splitters[self.kind]
        for line in splitter.feed(text.encode("utf-8", "backslashreplace")):
            _thread.sink.send(Output(ordinal, self.kind, line))
        return len(text)

    def flush(self) -> None:
        if getattr(_thread, "ordinal", None) is None:
            self.fallback.flush()

    def fileno(self) -> int:
        return int(self.fallback.fileno())

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def writable(self) -> bool:
        return True


def install_streams() -> None:
    for name, kind in (("stdout", "stdout"), ("stderr", "stderr")):
        current = getattr(sys, name)
        if not isinstance(current, OrdinalStream):
            setattr(sys, name, OrdinalStream(kind, current))


@contextlib.contextmanager
def ordinal_output(ordinal: int, sink: PipeWriter) -> Iterator[None]:
    _thread.ordinal, _thread.sink = ordinal, sink
    _thread.splitters = {"stdout": LineSplitter(), "stderr": LineSplitter()}
    try:
        yield
    finally:
        for kind, splitter in _thread.splitters.items():
            for line in splitter.flush():
                sink.send(Output(ordinal, kind, line))
        _thread.ordinal = None


# ---------------------------------------------------------------------------------------------
# Entry points

_failures: list[int] = []  # exit codes of this process's failed ordinals


def run_ordinal(index: int, spec: HostSpec, payload: bytes) -> None:
    """torch_xla calls this once per ordinal (xmp.spawn passes the ordinal as ``index``)."""
    import torch_xla
    import torch_xla.runtime as xr

    ordinal, world = xr.global_ordinal(), xr.world_size()
    sink = process_sink()
    if world != spec.ordinals:
        _wrong_count(ordinal, world, spec, sink)
    local = xr.local_ordinal()
    info = RankInfo(ordinal, local, world, world)  # one host: local == global
    device = f"{torch_xla.device()} ({spec.device})"
    sink.send(Started(ordinal, os.getpid(), device, socket.gethostname(), local))
    debugger.install(ordinal, sink, None)  # no prompt for ordinals yet: said, then ignored
    xla_ordinals.ordinal_started(ordinal)
    verdict = _Verdict(ordinal, sink)
    try:
        with (
            runtime.activate(Runtime(info, sink, spec.mixed_precision), thread_only=True),
            ordinal_output(ordinal, sink),
        ):
            code = worker.call_and_report(
                ordinal, payload, verdict, spec.return_all or ordinal == 0
            )
    finally:
        # After its report: a peer waiting for it in a collective now fails fast (collectives
        # can tell a peer that ended from one that is slow).
        xla_ordinals.ordinal_ended(ordinal)
    code = code or verdict.code
    if code:
        _failures.append(code)
        if world > 1:
            # Peers may now wait for this ordinal in a collective forever: end the process (and
            # so the launch) after giving them a moment to report failures of their own.
            time.sleep(FAILURE_GRACE)
            _flush()
            os._exit(code)


class _Verdict:
    """Where the ordinal's Finished or Failed goes. A function that returned after giving up on
    an XLA collective (it caught the timeout or lost-peers error) has left that collective
    pending inside XLA: it is reported as failed, and its process ends like a failed one's."""

    def __init__(self, ordinal: int, sink: PipeWriter) -> None:
        self.ordinal = ordinal
        self.sink = sink
        self.code = 0

    def send(self, event: Event) -> None:
        if isinstance(event, Finished):
            error = xla_ordinals.abandoned(self.ordinal, "returned")
            if error is not None:
                self.code = 1
                event = failure_event(self.ordinal, error, self.code)
        self.sink.send(event)


def _wrong_count(ordinal: int, world: int, spec: HostSpec, sink: PipeWriter) -> NoReturn:
    """torch_xla started another number of ordinals than the kernel counted and shows: stop the
    launch at once, before any user code, with ordinal 0 (always among them) saying why."""
    code = 1
    if ordinal == 0:
        error = RuntimeError(
            f"torch_xla started {world} XLA ordinal(s) on this host, but nbtrain expected "
            f"{spec.ordinals} ({spec.counted}), so the launch was stopped before running your "
            "function. If this host is one of several in a TPU pod slice, run your script on "
            "every host with torch_xla's own launcher. Otherwise pass num_processes=1 to use one "
            "core, or set TPU_ACCELERATOR_TYPE to this TPU's type (e.g. 'v3-8') so nbtrain counts "
            "the cores as torch_xla does."
        )
        sink.send(failure_event(ordinal, error, code))
    _failures.append(code)
    # Ordinal 0 reports, then ends the process; the others (their ranks may be unknown to the
    # kernel) only end theirs, later, if it lives in another process.
    time.sleep(FAILURE_GRACE if ordinal == 0 else 4 * FAILURE_GRACE)
    _flush()
    os._exit(code)


def host_main(
    spec: HostSpec, payload: bytes, stdout: Connection, stderr: Connection, events: Connection
) -> None:
    """Process target under every start method."""
    global _events_fd
    startup.set_up(spec, stdout, stderr)
    _events_fd = events.fileno()
    install_streams()
    code = 0
    try:
        import torch_xla.distributed.xla_multiprocessing as xmp

        nprocs = 1 if spec.ordinals == 1 else None  # torch_xla: one device, or all of them
        xmp.spawn(run_ordinal, args=(spec, payload), nprocs=nprocs, start_method="fork")
    except BaseException as exc:
        # A process of ordinals ended early (their failure was reported) or torch_xla itself
        # failed to start: the latter is said on stderr, the kernel's account of the host.
        # torch_xla's pool of ordinal processes breaks when one of them ends early: a failing
        # ordinal ends its process after reporting, a crash prints its stack (faulthandler).
        if not _failures and not isinstance(exc, BrokenProcessPool):
            import traceback

            print(f"nbtrain XLA host: torch_xla's launcher failed: {exc!r}", file=sys.__stderr__)
            traceback.print_exc(file=sys.__stderr__)
        code = 1
    _flush()
    sys.exit(max(_failures, default=0) or code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            stream.flush()  # type: ignore[union-attr]
