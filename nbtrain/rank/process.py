"""A rank's process, set up before the user's code runs: its own process group, death with its
parent, output to the kernel's pipes (C code too), default signal actions, thread count.

Shared by every rank process (worker.py, session.py) and torch_xla's host process (xla_host.py),
through startup.py's one sequence.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import os
import signal
import sys
from multiprocessing.connection import Connection
from typing import Any

from nbtrain.shared import stacks
from nbtrain.shared.lines import mark_line


def prepare(close_fds: tuple[int, ...], stdout: Connection, stderr: Connection) -> None:
    """Everything a fresh rank or host process does first, in this order."""
    become_group_leader()
    die_with_parent()
    close_inherited(close_fds)
    redirect_output(stdout.fileno(), stderr.fileno())
    stdout.close()
    stderr.close()
    enable_crash_stacks()
    reset_signals()
    stacks.enable_dumps()


def become_group_leader() -> None:
    # A rank and its DataLoader workers form one process group: the kernel can stop the whole
    # subtree with one killpg, and Jupyter's SIGINT to the kernel's group does not reach ranks
    # (the kernel decides how an interrupt ends the run).
    if hasattr(os, "setpgid"):
        os.setpgid(0, 0)


def die_with_parent() -> None:
    """Linux: the kernel (or forkserver) dying takes the rank with it: no orphans."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


def enable_crash_stacks() -> None:
    """A crash (SIGSEGV, SIGABRT...) writes every thread's stack to the kernel's stderr pipe.

    A forked rank inherits faulthandler's "enabled" flag with the kernel's memory, and enable()
    on an enabled faulthandler only swaps the file: it does not install its signal handlers again.
    A library that replaced them in the kernel after faulthandler (Ray's core worker does, on
    ray.init) would then get the rank's crash and its stack would be lost: disable first, so
    enable() installs the handlers anew."""
    faulthandler.disable()
    faulthandler.enable(file=sys.stderr, all_threads=True)


def reset_signals() -> None:
    """Forked ranks inherit the kernel's Python signal handlers (torch elastic, for one, installs
    a SIGTERM handler in the launching process). A Python handler only runs between bytecodes, so
    a rank blocked in a C++ collective would ignore the launcher's SIGTERM until SIGKILL: restore
    the default action, and the usual KeyboardInterrupt for SIGINT."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def fork_children_on_linux() -> None:
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


_MARKS = {"pid": 0, "count": 0}  # the process whose fds 1 and 2 are the kernel's pipes


def mark_output() -> int:
    """Before a display: flush, and write the next mark to the kernel's stdout and stderr pipes
    (kernel/group/outorder.py puts the display between the lines around it). 0 where fds 1 and 2
    are not this rank's pipes (a rank in the kernel's process, a forked DataLoader worker)."""
    if _MARKS["pid"] != os.getpid():
        return 0
    flush_streams()
    _MARKS["count"] += 1
    line = mark_line(_MARKS["count"]).encode()
    with contextlib.suppress(OSError):
        os.write(1, line)
        os.write(2, line)
    return _MARKS["count"]


def redirect_output(stdout_fd: int, stderr_fd: int) -> None:
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
    _MARKS["pid"] = os.getpid()


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


def close_inherited(fds: tuple[int, ...]) -> None:
    # Under fork a rank inherits the pipe ends of every other rank; holding them would keep
    # those pipes open after their owner died. They were made one after another, so they come
    # in a few runs of consecutive numbers: one closerange (close_range(2) on Linux) per run,
    # not a close() each (64 ranks: 508 fds in every rank).
    ordered = sorted(set(fds))
    start = 0
    for index in range(1, len(ordered) + 1):
        if index == len(ordered) or ordered[index] != ordered[index - 1] + 1:
            os.closerange(ordered[start], ordered[index - 1] + 1)  # (ignores closed fds)
            start = index


def set_threads(count: int | None) -> None:
    if count is None:
        return
    import torch

    torch.set_num_threads(count)


def flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
