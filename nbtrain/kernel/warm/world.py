"""The warm ranks' processes: one generation (``World``) and the session's generations over time
(``Worlds``).

A world is a started ``RankGroup`` (group/, ``warm=True``) and each rank's command pipe: local
processes (``LocalProcesses``, a pipe per rank) or ranks placed by Ray (cluster/ray_backend.py:
a rank actor per rank, commands as Ray calls). ``Worlds`` starts a new one after a rank died or
a command left ranks stuck (the stop policy checked again, resuming from the newest checkpoint),
and stops the last one on ``stop()``, when the session is collected, or at interpreter exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pickle
import sys
import weakref
from collections.abc import Callable, Mapping
from typing import Protocol

from nbtrain.kernel.group import Backend, LocalProcesses, RankGroup
from nbtrain.kernel.group.postmortem import KeptFailures
from nbtrain.kernel.host import environment
from nbtrain.kernel.launch.cluster.spec import RayCluster
from nbtrain.kernel.options.config import LaunchConfig
from nbtrain.kernel.options.stopping import StopOptions, build_policy
from nbtrain.kernel.procs import processes
from nbtrain.kernel.specs.rankspec import rank_specs
from nbtrain.kernel.specs.rendezvous import open_local
from nbtrain.rank import session_entry
from nbtrain.shared.commands import Stop
from nbtrain.shared.errors import SessionError, WorkerError
from nbtrain.shared.events import Event
from nbtrain.shared.options import ProgressMode
from nbtrain.shared.specs import RankSpec
from nbtrain.shared.stopping import StopPolicy

STOP_WAIT = 5.0  # seconds ranks get to leave their loop on stop() before they are terminated


class CommandPipe(Protocol):
    """A rank's command channel: a pipe's write end here, a call to its actor on a cluster."""

    def send_bytes(self, data: bytes) -> None: ...


@dataclasses.dataclass
class World:
    """One generation of warm rank processes: their group, and each rank's command pipe."""

    group: RankGroup
    commands: Mapping[int, CommandPipe]
    # A failure's error as the cell shows it: on a cluster, naming the root cause's node.
    named: Callable[[WorkerError], WorkerError] = lambda error: error

    def send(self, rank: int, data: bytes) -> None:
        # A rank that died meanwhile cannot read: the supervisor sees its exit next.
        with contextlib.suppress(OSError):
            self.commands[rank].send_bytes(data)

    def close(self, grace: float) -> None:
        """Ask every rank to leave its loop, wait up to ``grace``, then stop the rest."""
        data = pickle.dumps(Stop())
        for rank in self.commands:
            self.send(rank, data)
        self.group.stop(wait=grace)
        self.group.close()  # (the command pipes and the rendezvous with it)


class Worlds:
    """The session's rank processes over time: the current world, how to start the next."""

    def __init__(
        self, config: LaunchConfig, stop: StopOptions | None, cluster: RayCluster | None
    ) -> None:
        """``stop``: start_ranks' stop and resume options, checked again (and the checkpoint
        numbering taken afresh) whenever a new world starts; None: it asked for none."""
        self.config = config
        self.cluster = cluster
        self.stop_options = stop
        self.world: World | None = None
        self.failures = KeptFailures(config.world_size)  # for %ranks_debug

    @property
    def ranks(self) -> list[int]:
        return list(range(self.config.world_size))

    def start(self) -> None:
        """A new world (the old one stopped first, if any)."""
        self.failures.forget()  # new processes: no failure's frames
        if self.stop_options is not None:
            policy = build_policy("session", self.config.world_size, self.stop_options)
            self.config = dataclasses.replace(self.config, stopping=policy)
            # A restart resumes from the newest checkpoint, if any; resume_from was this once.
            resume = "auto" if self.stop_options.resume else self.stop_options.resume
            self.stop_options = dataclasses.replace(
                self.stop_options, resume=resume, resume_from=None
            )
        if self.cluster is not None:
            self.world = _cluster_world(self.config, self.cluster)
        else:
            self.world = _local_world(self.config, self._say)

    def stop(self, grace: float = STOP_WAIT) -> None:
        """End the current world's ranks (idempotent); what ``weakref.finalize`` calls."""
        world, self.world = self.world, None
        if world is not None:
            world.close(grace)

    def restart(self) -> None:
        self.stop()
        self.start()

    def require(self) -> World:
        """The running world; a rank that died since the last command means a new world (said
        in the cell before the command runs)."""
        world = self.world
        if world is None:
            raise SessionError(
                "these warm ranks were stopped. Start new ones with nbtrain.start_ranks(...), "
                "or call ranks.restart()."
            )
        dead = world.group.exited()
        if dead:
            names = ", ".join(
                f"rank {rp.rank} (exit code {rp.process.exitcode})" for rp in dead
            )
            print(
                f"[nbtrain] {names} ended since the last command: restarted the "
                f"{len(self.ranks)} ranks; their state is gone.",
                file=sys.stderr,
            )
            self.restart()
            world = self.world
            assert world is not None
        return world

    def call_policy(self, on_interrupt: str | None) -> StopPolicy | None:
        """run(..., on_interrupt=...): this call's own policy, with the session's folder, period
        and limit (checked before anything is sent); None: the session's."""
        if on_interrupt is None:
            return None
        options = dataclasses.replace(
            self.stop_options or StopOptions(),
            on_interrupt=on_interrupt,
            resume=False,  # a resume belongs to start_ranks
            resume_from=None,
        )
        policy = build_policy("session", self.config.world_size, options)
        if policy is None and self.config.stopping is not None:  # "stop" for this call only
            policy = dataclasses.replace(self.config.stopping, on_interrupt=False, resume_from=None)
        return policy

    def _say(self, phase: str) -> None:
        """A start-up phase that may take seconds, in the cell (where start_ranks shows no
        view): 'nbtrain: starting 2 warm ranks: starting Python, importing torch ...'."""
        if self.config.progress is not ProgressMode.OFF:
            print(f"nbtrain: starting {len(self.ranks)} warm ranks: {phase}...", flush=True)


def keep_until_collected(owner: object, worlds: Worlds) -> weakref.finalize:
    """Ends the ranks when ``owner`` (the session handle) is collected, or at interpreter exit
    at the latest."""
    return weakref.finalize(owner, worlds.stop)


def _local_world(config: LaunchConfig, say: Callable[[str], None]) -> World:
    """Warm ranks in processes of this machine, each reading commands from its own pipe."""
    rendezvous = open_local(config.world_size)
    try:
        specs = _xla_allowed(rank_specs(config, rendezvous))
    except BaseException:
        rendezvous.close()
        raise
    ctx = processes.context(config.start.method)
    pipes = {rank: ctx.Pipe(duplex=False) for rank in specs}  # commands: (read, write)

    def others(rank: int) -> tuple[int, ...]:
        """fork: every other command pipe, and the kernel's own end of the rank's."""
        return tuple(
            fd
            for other, (reader, writer) in pipes.items()
            for fd in ((writer.fileno(),) if other == rank else
                       (reader.fileno(), writer.fileno()))
        )

    def release() -> None:
        for _, writer in pipes.values():
            writer.close()
        rendezvous.close()

    backend = LocalProcesses(
        config.start.method,
        session_entry,
        specs,
        data=lambda rank: pipes[rank][0],
        also_close=others,
        release=release,
        debuggable=True,  # breakpoint() in a rank: a pdb prompt in the cell
        say=say,
    )
    try:
        group = _started(backend)
    finally:
        for reader, _ in pipes.values():
            reader.close()  # the ranks' ends: each has its own now
    return World(group, {rank: writer for rank, (_, writer) in pipes.items()})


def _cluster_world(config: LaunchConfig, cluster: RayCluster) -> World:
    """Warm ranks placed by Ray: each on its node under a rank actor, commands as Ray calls."""
    from nbtrain.kernel.launch.cluster.ray_backend import RayRanks

    backend = RayRanks(config, cluster, None, say=lambda text: None)
    return World(_started(backend), dict(backend.senders()), backend.named)


def _started(backend: Backend) -> RankGroup:
    """A warm session's rank group, started; closed again if the start fails."""
    group = RankGroup(backend, warm=True)
    try:
        group.start(drop, failed=lambda: False)
    except BaseException:
        group.close()
        raise
    return group


def _xla_allowed(specs: dict[int, RankSpec]) -> dict[int, RankSpec]:
    """With PJRT_DEVICE set, a warm rank that imports torch_xla takes the XLA device: the
    one-shot CPU path's ACCELERATE_USE_CPU (which would pin its Accelerator to the CPU) is left
    out."""
    if not environment.variables().get("PJRT_DEVICE"):
        return specs
    return {
        rank: dataclasses.replace(
            spec, env={k: v for k, v in spec.env.items() if k != "ACCELERATE_USE_CPU"}
        )
        for rank, spec in specs.items()
    }


def drop(event: Event) -> None:
    """Where a rank's events go while no command is running (start, where())."""


__all__ = ["STOP_WAIT", "CommandPipe", "World", "Worlds", "keep_until_collected"]
