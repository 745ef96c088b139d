"""A warm rank: a long-lived rank process that serves one command at a time (a distributed
session, kernel/warm/), keeping its namespace, process group and Accelerator between them.

Set up like any rank (worker.py), then a loop: read a command from the kernel's pipe, report
Started, run it, report Finished (with the value) or Failed (with the traceback) on the same
event pipe a one-shot launch uses. A cell runs in the rank's own namespace, compiled under the
cell's own file name so tracebacks and stack dumps show the cell's lines.

Interrupts: the kernel sends SIGINT to a rank that is running a command; it raises
KeyboardInterrupt there. A SIGINT that arrives between commands is ignored: the loop itself
is never interrupted.
"""

from __future__ import annotations

import ast
import builtins
import functools
import linecache
import os
import pickle
import signal
import socket
import sys
import types
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from nbtrain.rank import (
    debugger,
    inherited,
    interrupts,
    notebook,
    process,
    reporter,
    runtime,
    startup,
    teardown,
)
from nbtrain.rank.failures import failure_event
from nbtrain.rank.payload import pack_result, take_results_as, unpack_call
from nbtrain.rank.runtime import Runtime
from nbtrain.shared import sharedmem
from nbtrain.shared.commands import Call, Cell, Command, Debug, Pull, Push, Stop
from nbtrain.shared.events import EventSink, Finished, PipeWriter, Started, Stopped
from nbtrain.shared.specs import RankSpec
from nbtrain.shared.stopping import TrainingStopped

_busy = False  # a command is running: SIGINT raises KeyboardInterrupt in it


def session_main(
    spec: RankSpec,
    commands: Connection,
    stdout: Connection,
    stderr: Connection,
    events: Connection,
    debug: Connection | None = None,
) -> None:
    """Process target of a warm rank (every start method; ``debug``: the pdb prompt's lines)."""
    startup.set_up(spec, stdout, stderr)
    signal.signal(signal.SIGINT, _on_sigint)
    interrupts.install()  # acts only while a command runs under on_interrupt="checkpoint"
    sink = PipeWriter(events.fileno())
    debugger.install(spec.info.rank, sink, debug)
    serve(spec, commands, sink, new_namespace())
    runtime.end_tracker_run()  # a tracker run spans cells until end_training() or the end
    teardown.release(finalizing=spec.finalizes)
    process.flush_streams()
    sys.exit(0)


def new_namespace() -> dict[str, Any]:
    """A rank's namespace: a ``__main__`` of its own, so functions and classes defined in a
    cell pickle by value (results, ``pull``) as notebook-defined ones do."""
    return {"__name__": "__main__", "__builtins__": builtins}


def serve(spec: RankSpec, commands: Connection, sink: EventSink, namespace: dict) -> None:
    """Answer commands until Stop, or until the kernel's end of the pipe is gone."""
    info = spec.info
    host = socket.gethostname()
    while True:
        try:
            command: Command = pickle.loads(commands.recv_bytes())
        except (EOFError, OSError):
            return  # the kernel is gone (it died, or closed the session)
        if isinstance(command, Stop):
            return
        sink.send(Started(info.rank, os.getpid(), spec.device, host, info.local_rank))
        # A run(..., on_interrupt=...) brings its own policy; else the session's (start_ranks).
        policy = (command.stopping if isinstance(command, Call) else None) or spec.stopping
        active = Runtime(info, sink, spec.mixed_precision, stopping=policy)
        graceful = policy is not None and policy.on_interrupt
        debugger.begin()  # a q in an earlier cell does not silence this one's breakpoints
        with runtime.activate(active):
            if graceful:
                interrupts.begin()
            try:
                answer(info.rank, sink, functools.partial(execute, command, namespace, info.rank))
            finally:
                interrupts.end()


def answer(rank: int, sink: EventSink, work: Callable[[], bytes | None]) -> None:
    """Run one command and send its verdict; the rank stays, whatever happened."""
    global _busy
    try:
        _busy = True
        try:
            data = work()
        finally:
            _busy = False
            reporter.flush()  # progress()/log() still held go out before the verdict
            process.flush_streams()  # the cell's output is in the pipes before its verdict
    except TrainingStopped as stop:  # a graceful stop: saved; the rank stays warm
        sink.send(Stopped(rank, stop.step, stop.path))
        return
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the rank stays warm
        if getattr(exc, "nbtrain_bad_input", False):
            exc.__traceback__ = None  # bad input: the message says it all, no frame is the user's
        else:
            debugger.keep(exc)  # its frames, for %ranks_debug (as Python keeps them for %debug)
        sink.send(failure_event(rank, exc, 1))
        return
    sink.send(Finished(rank, data))


def execute(command: Command, namespace: dict, rank: int) -> bytes | None:
    if isinstance(command, Cell):
        take_results_as(command.results_prefix)
        value = run_cell(command, namespace)
        if value is None:
            return None
        return pack_result(display_bundle(value), rank=rank, what="cell value")
    if isinstance(command, Call):
        function, args, kwargs = unpack_call(command.payload)
        inherited.forget_cached_devices(function, args, kwargs)
        value = in_namespace(function, namespace)(*args, **kwargs)
        return pack_result(value, rank=rank) if command.send_result else None
    if isinstance(command, Pull):
        take_results_as(command.results_prefix)
        value = pull(command.expression, namespace, rank)
        return pack_result(value, rank=rank, what=f"value of {command.expression!r}")
    if isinstance(command, Push):
        namespace.update(sharedmem.loads(command.data, private=True))
        return None
    if isinstance(command, Debug):
        debugger.debug_last()
        return None
    raise TypeError(f"unknown command {type(command).__name__}")


def run_cell(cell: Cell, namespace: dict) -> Any:
    """Execute the cell; the value of its last expression (None if it has none, or if the
    cell ends with ';', as in IPython)."""
    tree = ast.parse(cell.code, cell.filename)
    last: ast.Expression | None = None
    tail = tree.body[-1] if tree.body else None
    if cell.show_value and isinstance(tail, ast.Expr):
        tree.body.pop()
        last = ast.Expression(tail.value)
    lines = cell.code.splitlines(keepends=True)
    linecache.cache[cell.filename] = (len(cell.code), None, lines, cell.filename)
    exec(compile(tree, cell.filename, "exec"), namespace)
    if last is None:
        return None
    value = eval(compile(last, cell.filename, "eval"), namespace)
    if cell.code.rstrip().endswith(";"):
        return None
    if value is not None:
        namespace["_"] = value
    return value


def display_bundle(value: Any) -> dict[str, Any]:
    """What the kernel shows as ``Out[rank N]``: the value's mime bundle, made here (the value
    itself may not pickle, or may live on a device the kernel lacks)."""
    try:
        data, _ = notebook.formatter().format(value)
    except Exception:  # IPython missing or a broken _repr_*_: plain repr
        data = {"text/plain": repr(value)}
    return {mime: body for mime, body in data.items() if mime != notebook.WIDGET_VIEW}


def in_namespace(function: Callable[..., Any], namespace: dict) -> Callable[..., Any]:
    """A notebook-defined function (pickled by value) sees the rank's names: they win over the
    names it brought from the kernel, so ``run(train)`` finds the model a cell prepared."""
    if not isinstance(function, types.FunctionType) or function.__module__ != "__main__":
        return function
    merged = {**function.__globals__, **namespace}
    clone = types.FunctionType(
        function.__code__, merged, function.__name__, function.__defaults__, function.__closure__
    )
    clone.__kwdefaults__ = function.__kwdefaults__
    clone.__dict__.update(function.__dict__)
    return clone


def pull(expression: str, namespace: dict, rank: int) -> Any:
    try:
        return eval(compile(expression, "<pull>", "eval"), namespace)
    except NameError as exc:
        name = getattr(exc, "name", None) or str(exc)
        error = NameError(
            f"rank {rank} has no name {name!r}: define it in a %%ranks cell, or send it with "
            f"ranks.push({name}=...)"
        )
        error.nbtrain_bad_input = True  # type: ignore[attr-defined]
        raise error from None


def _on_sigint(signum: int, frame: types.FrameType | None) -> None:
    if _busy:
        raise KeyboardInterrupt
