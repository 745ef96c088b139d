"""XLA launches from the kernel: TPU cores (or XLA:CPU ordinals) through torch_xla's launcher.

The kernel never imports torch_xla. It starts ONE nbtrain host process (``xla_host.host_main``,
a ``RankGroup`` of one local process, group/) in which torch_xla's launcher runs the ordinals:
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

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from nbtrain.kernel.group import LocalProcesses, RankGroup
from nbtrain.kernel.group.outcome import Outcome
from nbtrain.kernel.options.config import LaunchConfig
from nbtrain.kernel.run.lifecycle import Run
from nbtrain.kernel.specs.payload import PreparedCall, prepare_call, released
from nbtrain.kernel.specs.rankspec import current_environment
from nbtrain.rank import host_entry
from nbtrain.shared.events import Event, Exited
from nbtrain.shared.options import StartMethod
from nbtrain.shared.specs import HostSpec

if TYPE_CHECKING:
    from nbtrain.kernel.options.interface import LaunchOptions, UserCall

HOST = 0  # the host process's key for processes/Supervisor; its raw output counts as ordinal 0


class XlaOrdinals:
    """The launch kind (options/interface.py) of XLA ordinals, in torch_xla's host process."""

    no_stop_resume: ClassVar[str] = "on XLA/TPU"
    no_background: ClassVar[str] = ""  # the host process is one rank of a RankGroup, as local ranks

    def __init__(self, options: LaunchOptions) -> None:
        # (config.py checked the ordinals, tpu.check_launch; options/debug.py debug=)
        self.options = options

    def run(self, call: UserCall) -> Any:
        __tracebackhide__ = True
        # (segments, not fork references: torch_xla may start the ordinals' processes itself)
        return run_xla(self.options.config, prepare_call(*call, StartMethod.SPAWN))


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


def fan_out(
    ordinals: list[int], outcome_of: Callable[[], Outcome], forward: Callable[[Event], None]
) -> Callable[[Event], None]:
    """The Supervisor's events, with the host's exit turned into one exit per ordinal."""

    def emit(event: Event) -> None:
        if not isinstance(event, Exited):
            forward(event)
            return
        outcome = outcome_of()
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


def run_xla(config: LaunchConfig, call: PreparedCall) -> Any:
    __tracebackhide__ = True  # IPython shows the cell and the ordinal's traceback, not ours
    return released(call, functools.partial(_run_xla, config))


def _run_xla(config: LaunchConfig, call: PreparedCall) -> Any:
    __tracebackhide__ = True
    ordinals = list(range(config.num_processes))
    spec = HostSpec(
        ordinals=len(ordinals),
        device=config.xla_device,
        env=host_env(config),
        mixed_precision=config.mixed_precision.value if config.mixed_precision else None,
        return_all=config.return_all,
        kernel_env=current_environment(config),
        counted=counted_from(config),
    )
    title = (
        f"{len(ordinals)} XLA ordinal(s) on {config.xla_device}, host process by "
        f"{config.start.method.value}"
    )
    run = Run(config, ordinals, title=title)

    backend = LocalProcesses(
        config.start.method,
        host_entry,
        {HOST: spec},
        data=lambda rank: call.data,
        before=lambda: call.commit(run.say, len(ordinals)),  # big data into shared memory
    )
    # (fan_out reads run.outcome when called: it is the run's, for the whole launch)
    ending = run.supervise(
        RankGroup(backend), emit=fan_out(ordinals, lambda: run.outcome, run.emit)
    )
    return run.finish(ending)
