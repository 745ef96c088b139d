"""num_processes=1: run the function in the calling process (debuggable with pdb), with the same
rank environment, progress view, timeout and error contract as a multi-rank launch.

The one kernel-side path that runs rank logic: here the kernel *is* rank 0, so it activates the
rank runtime (progress, log, Accelerator) around the call. Those imports happen at call time, so
importing the kernel side never loads the rank side.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from nbtrain.kernel.group.ending import Ending, How
from nbtrain.kernel.host import environment
from nbtrain.kernel.options.config import LaunchConfig
from nbtrain.kernel.run.lifecycle import Run
from nbtrain.kernel.specs.rendezvous import open_local
from nbtrain.shared.events import CallbackSink, Event, Exited, Finished, Started, Stopped
from nbtrain.shared.serialization import unpack
from nbtrain.shared.specs import RankInfo
from nbtrain.shared.stopping import TrainingStopped

if TYPE_CHECKING:
    from nbtrain.kernel.options.interface import LaunchOptions, UserCall


class _Expired(BaseException):
    """Raised inside the function by the timeout alarm; never escapes to the user."""


class InProcess:
    """The launch kind (options/interface.py) of one rank without gpu_ids=: the kernel is
    rank 0."""

    # the kernel's own Ctrl-C asks for the stop (rank/interrupts.py)
    no_stop_resume: ClassVar[str] = ""
    # (never chosen for block=False: choose.py gives one background rank a process of its own)
    no_background: ClassVar[str] = "in the kernel's own process"

    def __init__(self, options: LaunchOptions) -> None:
        _check_alarm(options.config.timeout)  # before anything starts, not as "rank 0 failed"
        self.options = options

    def run(self, call: UserCall) -> Any:
        __tracebackhide__ = True
        return run_in_process(self.options.config, *call)


def run_in_process(
    config: LaunchConfig, function: Callable[..., Any], args: tuple, kwargs: dict[str, Any]
) -> Any:
    """Call the function as rank 0 of a one-rank launch, then end as every launch ends
    (``Run.finish``: root cause, timeout, graceful stop, or the value)."""
    __tracebackhide__ = True
    from nbtrain.rank import runtime

    run = Run(config, [0], title="in-process", in_process=True)

    def emit(event: Event) -> None:
        run.emit(event)
        run.tick()

    precision = config.mixed_precision.value if config.mixed_precision else None
    rank_runtime = runtime.Runtime(RankInfo(0, 0, 1, 1), CallbackSink(emit), precision,
                                   in_kernel=True, stopping=config.stopping)
    emit(Started(0, os.getpid(), _device(), socket.gethostname()))
    how = How.SUCCEEDED  # how the call ended (no stacks: its own traceback says where)
    raised: BaseException | None = None
    values: dict[int, Any] | None = None  # the call's value, once it returned
    try:
        with (
            _rank_environment(),
            _alarm(config.timeout),
            _fresh_process_group(),
            runtime.activate(rank_runtime),
            _graceful(config),
        ):
            value = _call(function, args, kwargs)
    except TrainingStopped as stop:
        how = How.STOPPED
        emit(Stopped(0, stop.step, stop.path))
    except _Expired:
        how = How.TIMED_OUT
    except KeyboardInterrupt as exc:
        run.abandon(exc)
        raise
    except BaseException as exc:
        if isinstance(exc, SystemExit) and _exit_code(exc) == 0:
            values = {0: None}  # sys.exit() / sys.exit(0): a clean end without a value
        else:
            how, raised = How.FAILED, _failed(exc, config, emit)
    else:
        values = {0: _to_cpu(value)}
    if values is not None:
        emit(Finished(0, None))
    emit(_exit(how, raised))
    return run.finish(Ending(how), values=values, raised=raised)


def _call(function: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
    """The function itself; the rank runtime's trackers learn how it ended."""
    from nbtrain.rank import runtime

    raised: BaseException | None = None
    try:
        return function(*args, **kwargs)
    except BaseException as exc:
        raised = exc
        raise
    finally:
        runtime.end_tracker_run(raised)


def _failed(
    exc: BaseException, config: LaunchConfig, emit: Callable[[Event], None]
) -> BaseException:
    """The function raised: rank 0's failure, reported as a rank reports it (and, with
    debug=True, a post-mortem here first)."""
    from nbtrain.rank.failures import failure_event

    emit(failure_event(0, exc, _exit_code(exc)))
    if config.debug:  # the frames are in this process: the kernel's own pdb
        in_kernel(exc)
    return exc


def _exit_code(exc: BaseException | None) -> int:
    from nbtrain.rank.failures import exit_code_of

    if exc is None:
        return 0
    return exit_code_of(exc) if isinstance(exc, SystemExit) else 1


def _exit(how: How, raised: BaseException | None) -> Exited:
    """Rank 0's exit, as a process's would be seen: stopped by the launcher at a timeout."""
    if how is How.TIMED_OUT:
        return Exited(0, None, None, stopped_by_launcher=True)
    return Exited(0, _exit_code(raised), None, stopped_by_launcher=False)


def in_kernel(exc: BaseException) -> None:
    """debug=True with num_processes=1: pdb on the function's frames, here, before the error
    is raised (the prompt and commands of a rank's post-mortem)."""
    import pdb

    from nbtrain.rank.failures import users_traceback

    tb = users_traceback(exc.__traceback__)
    if tb is None or isinstance(exc, KeyboardInterrupt):
        return
    debugger = pdb.Pdb()
    debugger.prompt = "(Pdb) rank 0> "
    first = str(exc).splitlines()[0] if str(exc) else ""
    print(f"[nbtrain] post-mortem of rank 0: {type(exc).__qualname__}: {first}. c or q ends "
          "it; then the launch raises the error.", flush=True)
    debugger.reset()
    debugger.interaction(None, tb)


def _graceful(config: LaunchConfig) -> contextlib.AbstractContextManager[None]:
    """on_interrupt="checkpoint": Ctrl-C asks for a stop at the next optimizer step (the kernel
    is the rank, see rank/interrupts.py); elsewhere (or off the main thread) nothing changes."""
    from nbtrain.rank import interrupts

    policy = config.stopping
    if policy is None or not policy.on_interrupt:
        return contextlib.nullcontext()
    if threading.current_thread() is not threading.main_thread():
        return contextlib.nullcontext()
    return interrupts.handling(signal.SIGINT)


def _device() -> str:
    return "cuda:0" if environment.cuda_device_count() else "cpu"


def _to_cpu(value: Any) -> Any:
    """Tensors come back on the CPU, as from a multi-rank launch; CPU-only runs skip the copy."""
    torch = sys.modules.get("torch")
    if torch is None or not _used_accelerator(torch):
        return value
    from nbtrain.rank.payload import pack_result

    return unpack(pack_result(value))


def _used_accelerator(torch: Any) -> bool:
    mps = getattr(torch, "mps", None)
    return bool(
        environment.cuda_initialized()
        or "torch_xla" in sys.modules
        or (mps is not None and torch.backends.mps.is_available())
    )


@contextlib.contextmanager
def _rank_environment() -> Iterator[None]:
    """RANK & co. for the duration of the call, restored afterwards (the kernel stays clean)."""
    rendezvous = open_local(1)
    values = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "0",
        **rendezvous.env(),
    }
    try:
        with environment.overridden(values):
            yield
    finally:
        rendezvous.close()


@contextlib.contextmanager
def _fresh_process_group() -> Iterator[None]:
    """A process group the function creates is destroyed afterwards, so the next launch works."""
    import torch.distributed as dist

    existed = dist.is_available() and dist.is_initialized()
    try:
        yield
    finally:
        if dist.is_available() and dist.is_initialized() and not existed:
            dist.destroy_process_group()


def _check_alarm(timeout: float | None) -> None:
    """The in-process timeout is a SIGALRM: only the main thread of a Unix process gets one."""
    if timeout is None:
        return
    thread = threading.current_thread()
    if thread is not threading.main_thread() or not hasattr(signal, "setitimer"):
        where = (
            f"this call runs in thread {thread.name!r}, not the main thread"
            if hasattr(signal, "setitimer")
            else "this platform has no SIGALRM"
        )
        raise ValueError(
            f"timeout={timeout!r} with num_processes=1 needs SIGALRM in the main thread of a "
            f"Unix process, and {where}. Call notebook_launcher from the main thread, pass "
            "num_processes=2 (ranks in their own processes), or drop timeout=."
        )


@contextlib.contextmanager
def _alarm(timeout: float | None) -> Iterator[None]:
    if timeout is None:
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise _Expired

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
