"""Rank entry point: set up the rank's process, run the user's function, report the outcome.

Runs in the child process under every start method. Imports nothing from the display side.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import os
import re
import signal
import socket
import sys
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any

from nbtrain.rank import reporting, runtime, teardown
from nbtrain.rank.runtime import RankInfo, Runtime
from nbtrain.shared import stacks
from nbtrain.shared.events import EventSink, Failed, Finished, PipeWriter, Started
from nbtrain.shared.serialization import pack_exception, pack_result, unpack_call


@dataclass(frozen=True)
class RankSpec:
    """Everything one rank needs to know, decided in the kernel."""

    info: RankInfo
    env: dict[str, str]
    mixed_precision: str | None = None
    send_result: bool = True
    torch_threads: int | None = None
    device: str = "cpu"
    close_fds: tuple[int, ...] = field(default=())
    kernel_env: dict[str, str] | None = None  # forkserver: the kernel's environment at launch
    finalizes: bool = True  # the process runs interpreter finalization at exit (spawn)


# Errors a rank raises only because a *peer* vanished: such a rank is never the root cause
# (Accelerate blames these ranks today). torch.distributed's own error types always qualify; a
# RuntimeError must read like a lost connection *and* come from the collectives' transport
# (gloo / NCCL / c10d, which name the peer's address), so that a user's own "timed out" or
# "connection refused" (an HTTP client, a database) is still a root cause.
_PEER_LOSS = re.compile(
    r"connection (closed|reset) by peer|broken pipe|econnreset|epipe|socket (is )?closed|"
    r"communicator was aborted|connection refused|read error|recv(?:ing)? .* failed|"
    r"connection closed|timed out",
    re.IGNORECASE,
)
_TRANSPORT = re.compile(
    r"gloo|nccl|c10d|processgroup|tcpstore|\[[0-9a-f.:]+\]:\d+", re.IGNORECASE
)
_DIST_ERRORS = {"DistBackendError", "DistNetworkError", "DistStoreError", "DistError"}


def is_collateral(exc: BaseException) -> bool:
    if type(exc).__name__ in _DIST_ERRORS:
        return True
    text = str(exc)
    return (
        isinstance(exc, RuntimeError)
        and bool(_PEER_LOSS.search(text))
        and bool(_TRANSPORT.search(text))
    )


def failure_event(rank: int, exc: BaseException, exitcode: int) -> Failed:
    tb = _from_the_users_code(exc.__traceback__)
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return Failed(
        rank=rank,
        type_name=type(exc).__qualname__,
        message=str(exc),
        traceback=text,
        exception=pack_exception(exc),
        exitcode=exitcode,
        collateral=is_collateral(exc),
    )


def _from_the_users_code(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the first frame that is not this module's: the rank's traceback
    starts where the user's function does (when nothing of theirs ran, it stays whole)."""
    first = tb
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb if tb is not None else first


def exit_code_of(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1  # sys.exit("message") exits with 1 after printing the message


def call_and_report(rank: int, payload: bytes, sink: EventSink, send_result: bool) -> int:
    """Run the function; send Finished or Failed. Returns the exit code for the process."""
    try:
        function, args, kwargs = unpack_call(payload)
        try:
            value = function(*args, **kwargs)
        finally:
            reporting.flush()  # metrics progress()/log() still hold go out before the verdict
        data = pack_result(value) if send_result else None
    except SystemExit as exc:
        code = exit_code_of(exc)
        if code == 0:  # a deliberate clean exit: success without a value
            value = pack_result(None) if send_result else None
            sink.send(Finished(rank, value, lingering=lingering()))
            return 0
        sink.send(failure_event(rank, exc, code))
        return code
    except BaseException as exc:  # KeyboardInterrupt too: an interrupted rank never looks done
        sink.send(failure_event(rank, exc, 1))
        return 1
    sink.send(Finished(rank, data, lingering=lingering()))
    return 0


def lingering() -> tuple[str, ...]:
    """What will keep this process from exiting: interpreter shutdown joins non-daemon threads,
    and multiprocessing joins non-daemon children. Named so the launcher can say what it had
    to stop (most end by themselves within the launcher's wait)."""
    import multiprocessing
    import threading

    main = threading.main_thread()
    names = [
        f"non-daemon thread {thread.name!r}"
        for thread in threading.enumerate()
        if thread is not main and not thread.daemon and thread.is_alive()
    ]
    names += [
        f"non-daemon child process {child.name!r} (pid {child.pid})"
        for child in multiprocessing.active_children()
        if not child.daemon
    ]
    return tuple(names)


def _become_group_leader() -> None:
    # A rank and its DataLoader workers form one process group: the kernel can stop the whole
    # subtree with one killpg, and Jupyter's SIGINT to the kernel's group does not reach ranks
    # (the kernel decides how an interrupt ends the run).
    if hasattr(os, "setpgid"):
        os.setpgid(0, 0)


def _die_with_parent() -> None:
    """Linux: the kernel (or forkserver) dying takes the rank with it: no orphans."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


def _reset_signals() -> None:
    """Forked ranks inherit the kernel's Python signal handlers (torch elastic, for one, installs
    a SIGTERM handler in the launching process). A Python handler only runs between bytecodes, so
    a rank blocked in a C++ collective would ignore the launcher's SIGTERM until SIGKILL: restore
    the default action, and the usual KeyboardInterrupt for SIGINT."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _fork_children_on_linux() -> None:
    """DataLoader workers of a rank fork, as they do in a script started by torchrun.

    A spawn/forkserver rank inherits that start method as its default (multiprocessing forces it
    while bootstrapping the child), so every DataLoader worker would be a fresh interpreter (seconds
    per epoch) and a killed rank would leave its workers' named semaphores in /dev/shm. The rank
    itself is a fresh single-threaded process, so forking from it is safe. A fork rank keeps an
    unset default: user code may still choose its own with set_start_method().
    """
    import multiprocessing

    current = multiprocessing.get_start_method(allow_none=True)
    if sys.platform.startswith("linux") and current in ("spawn", "forkserver"):
        multiprocessing.set_start_method("fork", force=True)


def _redirect_output(stdout_fd: int, stderr_fd: int) -> None:
    """Point fds 1 and 2 (C code too) at the kernel's pipes; Python streams flush per line."""
    # No flush of the inherited streams: under fork they are the kernel's, and whatever they
    # still buffer belongs to the kernel (flushing here would print it twice).
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    _line_buffer_c_stdout()
    sys.stdout = _line_stream(1)
    sys.stderr = _line_stream(2)
    # Code that bypasses sys.stdout (faulthandler, print(file=sys.__stderr__)) must land here too.
    setattr(sys, "__stdout__", sys.stdout)  # noqa: B010 - typeshed marks these Final
    setattr(sys, "__stderr__", sys.stderr)  # noqa: B010


def _line_buffer_c_stdout() -> None:
    """C code's printf is fully buffered on a pipe: what a rank printed just before crashing in
    C (SIGSEGV) would die in the buffer. Line buffering sends every line as it is finished.
    Best effort, where libc's stdout can be found (glibc: ``stdout``, macOS: ``__stdoutp``)."""
    if sys.platform == "win32":
        return
    import ctypes

    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None)
        for symbol in ("stdout", "__stdoutp"):
            with contextlib.suppress(ValueError):
                stream = ctypes.c_void_p.in_dll(libc, symbol)
                if _unbuffered(libc, stream):
                    return  # PYTHONUNBUFFERED / -u: even a partial line goes out at once
                line_buffered = 1  # _IOLBF on glibc and macOS
                libc.setvbuf(stream, None, line_buffered, ctypes.c_size_t(0))
                return


def _unbuffered(libc: Any, stream: Any) -> bool:
    """glibc: an unbuffered stream has a one-byte buffer (elsewhere: unknown, say no)."""
    size = getattr(libc, "__fbufsize", None)
    return size is not None and size(stream) == 1


def _line_stream(fd: int) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(raw, encoding="utf-8", errors="backslashreplace", line_buffering=True)


def _close_fds(fds: tuple[int, ...]) -> None:
    # Under fork a rank inherits the pipe ends of every other rank; holding them would keep
    # those pipes open after their owner died.
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _set_threads(count: int | None) -> None:
    if count is None:
        return
    import torch

    torch.set_num_threads(count)


def rank_main(
    spec: RankSpec, payload: bytes, stdout: Connection, stderr: Connection, events: Connection
) -> None:
    """Process target for every start method."""
    _become_group_leader()
    _die_with_parent()
    _close_fds(spec.close_fds)
    _redirect_output(stdout.fileno(), stderr.fileno())
    stdout.close()
    stderr.close()
    faulthandler.enable(file=sys.stderr, all_threads=True)
    _reset_signals()
    stacks.enable_dumps()
    _fork_children_on_linux()
    adopt_environment(spec.kernel_env, spec.env)
    _set_threads(spec.torch_threads)
    teardown.install()
    sink = PipeWriter(events.fileno())
    info = spec.info
    sink.send(Started(info.rank, os.getpid(), spec.device, socket.gethostname(), info.local_rank))
    with runtime.activate(Runtime(info, sink, spec.mixed_precision)):
        code = call_and_report(info.rank, payload, sink, spec.send_result)
    teardown.release(finalizing=spec.finalizes)
    _flush_streams()
    sys.exit(code)


def adopt_environment(kernel_env: dict[str, str] | None, rank_env: dict[str, str]) -> None:
    """A forkserver child starts with the environment the server had when it started (maybe
    hours ago): take the kernel's current one, so variables set in a cell since then arrive
    (fork and spawn children inherit it at start anyway, and get None here)."""
    if kernel_env is not None:
        os.environ.clear()
        os.environ.update(kernel_env)
    os.environ.update(rank_env)


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def preload() -> Any:
    """Imported by the forkserver so that ranks start with torch already loaded."""
    import torch
    import torch.distributed

    return torch
