"""Rank entry point: set up the rank's process, run the user's function, report the outcome.

Runs in the child process under every start method. Imports nothing of the kernel side.
"""

from __future__ import annotations

import os
import socket
import sys
from multiprocessing.connection import Connection
from typing import Any

from nbtrain.rank import (
    debugger,
    inherited,
    interrupts,
    process,
    reporter,
    runtime,
    startup,
    teardown,
)
from nbtrain.rank.failures import exit_code_of, failure_event
from nbtrain.rank.payload import pack_result, unpack_call
from nbtrain.rank.runtime import Runtime
from nbtrain.shared.events import EventSink, Finished, PipeWriter, Started, Status, Stopped
from nbtrain.shared.specs import RankSpec
from nbtrain.shared.stopping import TrainingStopped


def call_and_report(
    rank: int, payload: bytes, sink: EventSink, send_result: bool, *, debug: bool = False
) -> int:
    """Run the function; send Finished or Failed (``debug``: then a post-mortem prompt, see
    debugger.after_failure). Returns the exit code for the process."""
    try:
        # Unpickling imports what the function needs (torch first, in a fresh spawn rank).
        sink.send(Status(rank, "loading the function and importing its modules"))
        function, args, kwargs = unpack_call(payload)
        inherited.forget_cached_devices(function, args, kwargs)
        sink.send(Status(rank, ""))
        raised: BaseException | None = None
        try:
            value = function(*args, **kwargs)
        except BaseException as exc:
            raised = exc
            raise
        finally:
            reporter.flush()  # metrics progress()/log() still hold go out before the verdict
            runtime.end_tracker_run(raised)
        data = pack_result(value, rank=rank) if send_result else None
    except TrainingStopped as stop:  # a graceful stop: its checkpoint is saved
        sink.send(Stopped(rank, stop.step, stop.path))
        return 0
    except SystemExit as exc:
        code = exit_code_of(exc)
        if code == 0:  # a deliberate clean exit: success without a value
            value = pack_result(None) if send_result else None
            sink.send(Finished(rank, value, lingering=lingering()))
            return 0
        _report_failure(rank, exc, code, sink, debug)
        return code
    except BaseException as exc:  # KeyboardInterrupt too: an interrupted rank never looks done
        _report_failure(rank, exc, 1, sink, debug)
        return 1
    sink.send(Finished(rank, data, lingering=lingering()))
    return 0


def _report_failure(
    rank: int, exc: BaseException, code: int, sink: EventSink, debug: bool
) -> None:
    failed = failure_event(rank, exc, code)
    sink.send(failed)
    if debug:
        debugger.after_failure(exc, failed)


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


def rank_main(
    spec: RankSpec,
    payload: bytes,
    stdout: Connection,
    stderr: Connection,
    events: Connection,
    debug: Connection | None = None,
) -> None:
    """Process target for every start method (``debug``: the pdb prompt's lines, if any)."""
    startup.set_up(spec, stdout, stderr)
    sink = PipeWriter(events.fileno())
    info = spec.info
    sink.send(Started(info.rank, os.getpid(), spec.device, socket.gethostname(), info.local_rank))
    debugger.install(info.rank, sink, debug)
    if spec.stopping is not None and spec.stopping.on_interrupt:
        interrupts.install()
        interrupts.begin()
    active = Runtime(info, sink, spec.mixed_precision, stopping=spec.stopping)
    with runtime.activate(active):
        code = call_and_report(info.rank, payload, sink, spec.send_result, debug=spec.debug)
    interrupts.end()
    teardown.release(finalizing=spec.finalizes)
    process.flush_streams()
    sys.exit(code)


def preload() -> Any:
    """Imported by the forkserver so that ranks start with torch already loaded."""
    import torch
    import torch.distributed

    return torch
