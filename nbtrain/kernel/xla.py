"""XLA launches from the kernel: TPU cores (or XLA:CPU ordinals) through torch_xla's launcher.

The kernel never imports torch_xla. It starts ONE nbtrain host process (``xla_host.host_main``,
through the usual processes/Supervisor machinery) in which torch_xla's launcher runs the ordinals:
threads of that process on XLA:CPU, processes of their own on TPUs. Every ordinal reports as a
rank of its own on the host's event pipe (events are PIPE_BUF packets tagged by writer, so threads
and processes share it safely), so results, failures, output and the live view are per ordinal.
The host process dies after every launch, so a relaunch never meets "Runtime is already
initialized".

Kernel-side bookkeeping: the Supervisor sees one process (key ``HOST``); its raw output (C code,
threads the user's code started) is attributed to ordinal 0, and its exit is fanned out to every
ordinal here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nbtrain.kernel import launcher, processes
from nbtrain.kernel.config import LaunchConfig
from nbtrain.kernel.monitor import RunState
from nbtrain.kernel.outcome import Outcome
from nbtrain.kernel.supervisor import Supervisor
from nbtrain.shared.events import Event, Exited

HOST = 0  # the host process's key for processes/Supervisor; its raw output counts as ordinal 0


@dataclass(frozen=True)
class HostSpec:
    """What the host process needs, decided in the kernel."""

    ordinals: int
    device: str  # PJRT device: "TPU" or "CPU"
    env: dict[str, str]
    mixed_precision: str | None = None
    return_all: bool = False
    close_fds: tuple[int, ...] = field(default=())
    kernel_env: dict[str, str] | None = None  # forkserver: the kernel's environment at launch
    counted: str = ""  # how the kernel arrived at ``ordinals`` (said if torch_xla disagrees)


def host_env(config: LaunchConfig) -> dict[str, str]:
    env = {"PJRT_DEVICE": config.xla_device}
    if config.xla_device == "CPU":
        env["CPU_NUM_DEVICES"] = str(config.num_processes)  # one XLA:CPU device per ordinal
    if config.mixed_precision is not None:
        env["ACCELERATE_MIXED_PRECISION"] = config.mixed_precision.value
    return env


def counted_from(config: LaunchConfig) -> str:
    """Why the kernel expects ``config.num_processes`` ordinals, in words for an error: as
    config.py's check counted them (tpu.check_launch), not detected and counted again."""
    return config.xla_counted or f"num_processes={config.num_processes}"


def fan_out(ordinals: list[int], outcome: Outcome, forward: Callable[[Event], None]) -> Callable:
    """The Supervisor's events, with the host's exit turned into one exit per ordinal."""

    def emit(event: Event) -> None:
        if not isinstance(event, Exited):
            forward(event)
            return
        peer_failed = outcome.has_failure()
        for ordinal in ordinals:
            record = outcome.records[ordinal]
            if record.finished and record.failure is None:
                # It returned: the host's exit code belongs to whichever ordinal ended the host.
                forward(Exited(ordinal, 0, None, False, event.time))
            elif record.failure is not None:
                forward(
                    Exited(
                        ordinal,
                        record.failure.exitcode,
                        None,
                        event.stopped_by_launcher,
                        event.time,
                        event.stop_requested,
                    )
                )
            else:
                # Still running when the host ended: taken down with it by a peer's failure (or
                # by the launcher), unless the host itself died (a crash in C code, os._exit).
                stopped = event.stopped_by_launcher or peer_failed
                forward(Exited(ordinal, event.exitcode, event.signal, stopped, event.time))

    return emit


def run_xla(config: LaunchConfig, payload: bytes) -> Any:
    __tracebackhide__ = True  # IPython shows the cell and the ordinal's traceback, not ours
    ordinals = list(range(config.num_processes))
    spec = HostSpec(
        ordinals=len(ordinals),
        device=config.xla_device,
        env=host_env(config),
        mixed_precision=config.mixed_precision.value if config.mixed_precision else None,
        return_all=config.return_all,
        kernel_env=launcher.current_environment(config),
        counted=counted_from(config),
    )
    title = (
        f"{len(ordinals)} XLA ordinal(s) on {config.xla_device}, host process by "
        f"{config.start.method.value}"
    )
    state = RunState(ordinals, title=title)
    outcome = Outcome(ordinals)
    view = launcher._view(config)

    def record(event: Event) -> None:
        outcome.apply(event)
        state.apply(event)

    emit = fan_out(ordinals, outcome, record)

    def make_args(rank: int, pipes: processes.RankPipes, close: tuple[int, ...]) -> tuple:
        host = HostSpec(**{**spec.__dict__, "close_fds": close}) if close else spec
        return (host, payload, pipes.stdout_w, pipes.stderr_w, pipes.events_w)

    from nbtrain.rank.xla_host import host_main  # importable target (spawn pickles it by reference)

    deadline = None if config.timeout is None else time.monotonic() + config.timeout
    started: list[processes.RankProcess] = []
    supervisor: Supervisor | None = None
    try:
        started = processes.start_ranks(config.start.method, [HOST], host_main, make_args)
        supervisor = Supervisor(started, emit, failed=outcome.has_failure, grace=launcher.GRACE)
        supervisor.run(deadline, launcher._throttled(lambda: view.draw(state)))
        supervisor.drain()
    except BaseException as exc:
        with launcher._sigint_deferred():
            processes.stop(started, launcher.GRACE)
            if supervisor is not None:
                supervisor.drain()
            state.finish(launcher._interrupted_summary(exc, state))
            launcher._close_view(view, state)
            processes.close(started)
        raise
    processes.close(started)
    stuck = supervisor.stuck_frames() if supervisor.timed_out else None
    return launcher._finish(config, state, outcome, view, stuck=stuck)
