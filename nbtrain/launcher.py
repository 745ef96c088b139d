"""notebook_launcher and debug_launcher: validate, choose, start, supervise, return."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from . import environment, processes, stacks, worker
from .config import (
    LaunchConfig,
    OutputMode,
    ProgressMode,
    StartMethod,
    build_config,
    check_function,
)
from .display import View, make_view
from .errors import ResultError, WorkerError
from .events import Event
from .inprocess import run_in_process
from .monitor import RunState, Verdict
from .option_names import given, to_raise
from .outcome import Outcome
from .rendezvous import LocalRendezvous, open_local
from .runtime import RankInfo
from .serialization import pack_call
from .supervisor import EXIT_WAIT, Supervisor
from .worker import RankSpec

GRACE = 2.0  # seconds between SIGTERM and SIGKILL when stopping ranks
REFRESH = 0.1  # seconds between redraws of the view (about 10 per second)


def notebook_launcher(
    function: Callable[..., Any],
    args: tuple = (),
    kwargs: dict[str, Any] | None = None,
    num_processes: int | None = None,
    *,
    start_method: str = "auto",
    mixed_precision: str | None = None,
    gpu_ids: list[int] | None = None,
    num_nodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    max_restarts: int = 0,
    timeout: float | None = None,
    output: str = "all",
    progress: str = "auto",
    return_all: bool = False,
    rdzv_timeout: float = 900.0,
) -> Any:
    """Run ``function(*args, **kwargs)`` on ``num_processes`` ranks and return rank 0's value
    (on a node of a multi-node launch: its first rank's; ``return_all``: its ranks' values).

    See the README for the full contract. Every argument is checked before anything starts.
    """
    # IPython (and pytest) hide frames that set this: a failure shows the cell and the
    # rank's own traceback, not the launcher's internals.
    __tracebackhide__ = True
    args, kwargs = check_function(function, args, kwargs)
    config = build_config(
        num_processes=num_processes,
        start_method=start_method,
        mixed_precision=mixed_precision,
        gpu_ids=gpu_ids,
        num_nodes=num_nodes,
        node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint,
        max_restarts=max_restarts,
        timeout=timeout,
        output=output,
        progress=progress,
        return_all=return_all,
        rdzv_timeout=rdzv_timeout,
    )
    return dispatch(config, function, args, kwargs)


def dispatch(
    config: LaunchConfig,
    function: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    *,
    elastic: bool = False,
) -> Any:
    """Run a checked launch the way its configuration needs; ``elastic`` sends it through
    torch's elastic agent even on one node without restarts (``nbtrain launch`` does)."""
    __tracebackhide__ = True
    if config.xla_device:
        from .xla import run_xla  # torch_xla runs the ordinals in a host process (xla.py)

        return run_xla(config, pack_call(function, args, kwargs))
    if elastic or config.multi_node or config.max_restarts:
        from .agent import run_elastic  # torch elastic agent and rendezvous (agent.py)

        return run_elastic(config, pack_call(function, args, kwargs))
    if config.num_processes == 1:
        return run_in_process(config, function, args, kwargs, _view(config))
    return run_ranks(config, pack_call(function, args, kwargs))


def debug_launcher(function: Callable[..., Any], args: tuple = (), num_processes: int = 2) -> Any:
    """CPU-only launch for debugging distributed code on a laptop (as in Accelerate)."""
    __tracebackhide__ = True
    args, kwargs = check_function(function, args, None)
    config = build_config(
        num_processes=num_processes,
        start_method="auto",
        mixed_precision=None,
        gpu_ids=None,
        num_nodes=1,
        node_rank=0,
        rdzv_endpoint=None,
        max_restarts=0,
        timeout=None,
        output="all",
        progress="auto",
        return_all=False,
        allow_xla=False,  # CPU only, even on a TPU host
    )
    with _hide_gpus():
        if config.num_processes == 1:
            return run_in_process(config, function, args, kwargs, _view(config))
        return run_ranks(config, pack_call(function, args, kwargs))


@contextlib.contextmanager
def _hide_gpus() -> Iterator[None]:
    """Ranks see no GPU (they inherit the environment at start; restored right after)."""
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


def _view(config: LaunchConfig) -> View:
    return make_view(config.progress, config.output, config.world_size)


def rank_specs(config: LaunchConfig, rendezvous: LocalRendezvous) -> dict[int, RankSpec]:
    local = config.num_processes
    threads = None
    if "OMP_NUM_THREADS" not in os.environ:
        # Without this, N ranks each start one thread per core and fight over the cores.
        threads = max(1, environment.cpu_count() // local)
    precision = config.mixed_precision.value if config.mixed_precision else None
    gpus = environment.cuda_device_count() if config.gpu_ids is None else len(config.gpu_ids)
    kernel_env = current_environment(config)
    specs = {}
    for local_rank in range(local):
        rank = config.node_rank * local + local_rank
        env = {
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(config.world_size),
            "LOCAL_WORLD_SIZE": str(local),
            "GROUP_RANK": str(config.node_rank),
            **rendezvous.env(),
        }
        if config.gpu_ids is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in config.gpu_ids)
        if precision:
            env["ACCELERATE_MIXED_PRECISION"] = precision  # honoured by HF Accelerate too
        if threads is not None:
            # Said in the environment too, as torchrun does: libraries that read it (HF
            # Accelerate would otherwise set 1 and warn) keep the rank's share of the cores.
            env["OMP_NUM_THREADS"] = str(threads)
        info = RankInfo(
            rank, local_rank, config.world_size, local, config.node_rank, config.num_nodes
        )
        specs[rank] = RankSpec(
            info=info,
            env=env,
            mixed_precision=precision,
            send_result=config.return_all or rank == 0,
            torch_threads=threads,
            device=f"cuda:{local_rank}" if gpus else "cpu",
            kernel_env=kernel_env,
            # fork and forkserver children end in os._exit: no interpreter finalization.
            finalizes=config.start.method is StartMethod.SPAWN,
        )
    return specs


def current_environment(config: LaunchConfig) -> dict[str, str] | None:
    """What a rank must adopt as its environment (see worker.adopt_environment): only the
    forkserver's children would otherwise miss what changed since the server started."""
    return dict(os.environ) if config.start.method is StartMethod.FORKSERVER else None


def run_ranks(config: LaunchConfig, payload: bytes) -> Any:
    __tracebackhide__ = True
    rendezvous = open_local(config.world_size)
    specs = rank_specs(config, rendezvous)
    ranks = list(specs)
    state = RunState(ranks, title=f"{len(ranks)} ranks, {config.start.method.value}")
    outcome = Outcome(ranks)
    view = _view(config)
    view.draw(state)  # shown at once, and the text view sees every output line from the first

    def emit(event: Event) -> None:
        outcome.apply(event)
        state.apply(event)

    def make_args(rank: int, pipes: processes.RankPipes, close: tuple[int, ...]) -> tuple:
        spec = specs[rank]
        if close:
            spec = RankSpec(**{**spec.__dict__, "close_fds": close})
        return (spec, payload, pipes.stdout_w, pipes.stderr_w, pipes.events_w)

    deadline = None if config.timeout is None else time.monotonic() + config.timeout
    started: list[processes.RankProcess] = []
    supervisor: Supervisor | None = None
    try:
        started = processes.start_ranks(config.start.method, ranks, worker.rank_main, make_args)
        supervisor = Supervisor(
            started, emit, failed=outcome.has_failure, grace=GRACE, exit_wait=EXIT_WAIT
        )
        supervisor.run(deadline, _throttled(lambda: view.draw(state)))
        supervisor.drain()
    except BaseException as exc:
        with _sigint_deferred():
            processes.stop(started, GRACE)
            if supervisor is not None:
                supervisor.drain()
            state.finish(_interrupted_summary(exc, state))
            _close_view(view, state)
            processes.close(started)
            rendezvous.close()
        raise
    processes.close(started)
    rendezvous.close()
    stuck = supervisor.stuck_frames() if supervisor.timed_out else None
    return _finish(config, state, outcome, view, stuck=stuck)


def _finish(
    config: LaunchConfig,
    state: RunState,
    outcome: Outcome,
    view: View,
    *,
    stuck: dict[int, list[str]] | None,
) -> Any:
    """``stuck`` is None unless the launch timed out: then where each rank was (stacks.py)."""
    __tracebackhide__ = True
    if outcome.has_failure():
        error = outcome.error(node=config.node_rank)
        state.finish(state.failed_summary(error), Verdict.FAILED)
        _close_view(view, state)
        _raise(error)
    if stuck is not None:
        state.finish(f"Timed out after {config.timeout:g}s", Verdict.TIMED_OUT)
        _close_view(view, state)
        raise TimeoutError(_timeout_message(config, state, stuck))
    return deliver(config, state, outcome, view)


def deliver(config: LaunchConfig, state: RunState, outcome: Outcome, view: View) -> Any:
    """The ranks succeeded: end the view and return their values (this node's first rank's,
    or every rank's with ``return_all``). ResultError if the kernel cannot load one."""
    __tracebackhide__ = True
    try:
        results = outcome.results()
    except ResultError as error:
        state.finish(state.failed_summary(error), Verdict.FAILED)
        _close_view(view, state)
        raise
    state.finish(state.done_summary())
    _close_view(view, state)
    if config.return_all:
        return [results.get(rank) for rank in sorted(state.ranks)]
    return results.get(config.node_rank * config.num_processes)


def _raise(error: WorkerError) -> None:
    __tracebackhide__ = True
    from .errors import RemoteTraceback

    cause = RemoteTraceback(error.remote_traceback) if error.remote_traceback else None
    raise error from cause


def _timeout_message(config: LaunchConfig, state: RunState, stuck: dict[int, list[str]]) -> str:
    where = "; ".join(
        f"rank {rank}: {view.status.value}"
        + (f" at step {view.step}/{view.total}" if view.total is not None else "")
        for rank, view in sorted(state.ranks.items())
    )
    stacks_text = stacks.describe(stuck)
    return (
        f"{given('timeout', f'{config.timeout:g}')} expired; every rank was stopped "
        f"({where}). Raise {to_raise('timeout')} if the run needs longer."
        + (f"\nWhere the ranks were (each rank's full stack is in its output):\n{stacks_text}"
           if stacks_text else "")
    )


def _interrupted_summary(exc: BaseException, state: RunState) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return f"Interrupted after {state.elapsed:.1f}s: every rank was stopped"
    return f"Stopped after {state.elapsed:.1f}s: {type(exc).__name__}: {exc}"


def _close_view(view: View, state: RunState) -> None:
    with contextlib.suppress(Exception):  # a broken frontend must not mask the real outcome
        view.close(state)


def _throttled(draw: Callable[[], None]) -> Callable[[], None]:
    last = [0.0]

    def tick() -> None:
        now = time.monotonic()
        if now - last[0] >= REFRESH:
            last[0] = now
            draw()

    return tick


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """A second Ctrl-C while we stop the ranks must not leave them running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending:
        raise KeyboardInterrupt


__all__ = ["OutputMode", "ProgressMode", "debug_launcher", "notebook_launcher"]
