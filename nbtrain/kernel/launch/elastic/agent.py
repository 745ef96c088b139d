"""One node's launch, run by torch's elastic agent with nbtrain's process layer inside it.

Used for ``num_nodes > 1`` and for ``max_restarts > 0`` (and by ``nbtrain launch``). torch's
``SimpleElasticAgent`` owns the attempt loop, exactly as under ``torchrun``: a rendezvous round,
start the workers, monitor them, restart every worker after a failure while restarts remain,
restart on membership changes. NodeAgent fills in its hooks with what every
nbtrain launch has (a ``RankGroup`` of local processes, ``Outcome``, the live view), so the ranks
keep whole-line rank-prefixed output, results, the root-cause rule and an interrupt that stops
them at once:

- ``_rendezvous`` / ``_assign_worker_ranks``: torch's round, shown as "waiting for nodes (k of N
  joined)"; the user's ``node_rank`` decides the global ranks; the nodes' options are checked.
- ``_start_workers``: a fresh ``RankGroup`` (group/) of this node's global ranks, started.
- ``_monitor_workers``: a slice of the group's watch loop (``RankGroup.step``: torch owns the
  loop here, so not the group's ``watch``), under the group's one Ctrl-C policy for a one-shot
  launch (``Interrupts``, held across attempts: Ctrl-C raises and stops every rank). HEALTHY
  while ranks run; FAILED once they ended after a failure here or anywhere (the
  "news" every node reads, see ``elastic.py``), so every node counts the same restarts;
  SUCCEEDED when every node's ranks succeeded.
- ``_stop_workers`` / ``_shutdown``: terminate, then kill after the launcher's grace period.
- ``_exit_barrier``: already passed when SUCCEEDED is reported (every node said it is done), in
  a wait that hears Ctrl-C and the news, which torch's blocking store barrier does not.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from torch.distributed.elastic.agent.server.api import (
    RunResult,
    SimpleElasticAgent,
    Worker,
    WorkerGroup,
    WorkerSpec,
    WorkerState,
)

from nbtrain.display.runstate import Verdict
from nbtrain.kernel.group import Interrupts, LocalProcesses, RankGroup
from nbtrain.kernel.group.ending import Ending, How
from nbtrain.kernel.launch.elastic.endings import (
    AttemptEnded,
    forget_locals,
    quiet_agent_log,
    title_of,
)
from nbtrain.kernel.launch.elastic.network import check_endpoint_here
from nbtrain.kernel.launch.elastic.news import (
    RUN_ID,
    Coordinator,
    News,
    RendezvousTimeout,
    StaleRendezvous,
    first_line,
)
from nbtrain.kernel.launch.elastic.node import NodeCoordinator
from nbtrain.kernel.launch.elastic.one_node import LocalCoordinator
from nbtrain.kernel.launch.elastic.verdicts import SLICE, Verdicts
from nbtrain.kernel.options.config import LaunchConfig
from nbtrain.kernel.run.lifecycle import Run
from nbtrain.kernel.specs.payload import PreparedCall, released
from nbtrain.kernel.specs.rankspec import rank_specs
from nbtrain.kernel.specs.rendezvous import LocalRendezvous
from nbtrain.rank import rank_entry
from nbtrain.shared.errors import LaunchError
from nbtrain.shared.events import Event, Failed
from nbtrain.shared.specs import RankSpec

MONITOR_INTERVAL = 0.01  # torch's loop sleeps this between monitor calls; the slice does the wait


def run_elastic(config: LaunchConfig, prepared: PreparedCall) -> Any:
    """``ElasticAgent.run``'s path (``num_nodes > 1``, ``max_restarts > 0``, ``nbtrain launch``)."""
    __tracebackhide__ = True  # IPython shows the cell and the rank's traceback, not ours

    def launch(call: PreparedCall) -> Any:
        __tracebackhide__ = True
        call.commit(lambda text: None, config.num_processes)  # once: restarts reuse it
        return _run_elastic(config, call.data)

    return released(prepared, launch)


def _run_elastic(config: LaunchConfig, payload: bytes) -> Any:
    __tracebackhide__ = True
    coordinator: Coordinator
    if config.multi_node:
        coordinator = NodeCoordinator(config, check_endpoint_here(config))
    else:
        coordinator = LocalCoordinator(config.world_size)
    agent = NodeAgent(config, payload, coordinator)
    try:
        return agent.launch()
    finally:
        agent.release_stores()
        coordinator.close()


class NodeAgent(Verdicts, SimpleElasticAgent):
    """torch's agent with nbtrain's ranks, watch and view (module docstring); how the attempt
    ends on every node alike: verdicts.py."""

    def __init__(self, config: LaunchConfig, payload: bytes, coordinator: Coordinator) -> None:
        spec = WorkerSpec(
            role="nbtrain",
            local_world_size=config.num_processes,
            rdzv_handler=coordinator.handler,
            entrypoint=rank_entry,
            max_restarts=config.max_restarts,
            monitor_interval=MONITOR_INTERVAL,
            local_addr=coordinator.local_address,
        )
        super().__init__(spec)  # (its exit barrier is replaced: see _exit_barrier)
        self.config = config
        self.payload = payload
        self.coordinator = coordinator
        first = config.node_rank * config.num_processes
        self.ranks = list(range(first, first + config.num_processes))
        self.lifecycle = Run(config, self.ranks, title=title_of(config, self.ranks))
        self.verdict: News | None = None  # the news that ended the last attempt
        self.workers: LocalRendezvous | None = None  # the ranks' store of this attempt
        self._interrupted: Callable[[], None] = lambda: None  # the Ctrl-C check (launch)
        self._begin_attempt()

    def _begin_attempt(self) -> None:
        self.failures: list[Failed] = []  # every Failed event of the attempt, collateral too
        self.group: RankGroup | None = None  # this attempt's ranks
        self._stopping = False  # this attempt's ranks are being stopped
        self._ending: Ending | None = None  # how this attempt's watch ended
        self._published = False
        self._done = False

    # -- the launch as a whole -------------------------------------------------------------

    def launch(self) -> Any:
        __tracebackhide__ = True
        try:
            self.coordinator.connect(self.say)
            self._worker_group.spec.rdzv_handler = self.coordinator.handler
            # The group's one Ctrl-C policy, held across attempts (a group each): a press
            # raises in torch's loop, and _monitor_workers raises it again if it was dropped.
            with quiet_agent_log(), Interrupts().handling(None) as self._interrupted:
                result = self.run()
            # (torch's run() returns None only for a rendezvous closed gracefully, which
            # joining() turns into StaleRendezvous before torch sees it.)
            if result.is_failed():
                assert self.verdict is not None
                self._fail(self.verdict)
            return self._succeed()
        except AttemptEnded as ended:
            # Raised from inside torch's loop: the user sees the error, not torch's frames.
            forget_locals(ended)
            raise ended.error.with_traceback(None) from ended.cause
        except BaseException as exc:
            if not self.lifecycle.ended:
                self._abandon(exc)
            forget_locals(exc)
            raise

    def release_stores(self) -> None:
        """Drop every reference to the rendezvous stores (torch's agent keeps some), so that
        closing the coordinator really stops node 0's servers and frees the endpoint's port
        for the next launch, without waiting for the garbage collector."""
        self._store = None
        self._worker_group.store = None
        self._worker_group.spec.rdzv_handler = None  # type: ignore[assignment]
        self.workers = None

    def _attempt(self) -> int:
        return self._worker_group.spec.max_restarts - self._remaining_restarts

    # -- torch's hooks: rendezvous -----------------------------------------------------------

    def _rendezvous(self, worker_group: WorkerGroup) -> None:
        attempt = self._attempt()
        while True:
            try:
                with self.coordinator.joining(attempt, self.say):
                    super()._rendezvous(worker_group)
                return
            except StaleRendezvous as stale:
                if attempt == 0:  # a previous launch's rendezvous: wait for the fresh one
                    self.release_stores()  # (node 0 reopens the endpoint's port)
                    self.coordinator.connect(self.say)
                    worker_group.spec.rdzv_handler = self.coordinator.handler
                    continue
                if self.verdict is not None:  # a node gave up after the failure: it ends here
                    self._fail(self.verdict)
                raise LaunchError(f"the rendezvous for restart {attempt} failed: {stale}") from None

    def _assign_worker_ranks(
        self, store: Any, group_rank: int, group_world_size: int, spec: WorkerSpec
    ) -> list[Worker]:
        """torch numbers nodes in the order they joined; nbtrain keeps the user's node_rank."""
        self.workers = self.coordinator.begin_round(store, group_rank, group_world_size)
        world = self.config.world_size
        first = self.ranks[0]
        return [
            Worker(local_rank=i, global_rank=first + i, role_rank=first + i, world_size=world,
                   role_world_size=world)
            for i in range(self.config.num_processes)
        ]

    # -- torch's hooks: workers ----------------------------------------------------------------

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        self._begin_attempt()
        attempt = self._attempt()
        if attempt:
            self.lifecycle.new_attempt()
        specs = self._specs(attempt)
        if self.config.multi_node:
            self.say(f"all {self.config.num_nodes} nodes joined; starting ranks")
        self.lifecycle.start_clock()

        payload = self.payload
        self.group = RankGroup(
            LocalProcesses(
                self.config.start.method, rank_entry, specs, data=lambda rank: payload,
                debuggable=True,  # (the last argument: the pdb prompt's lines, pdbprompt.py)
            )
        )
        self.group.start(self._emit, self._stop_wanted)
        self.group.channel.prompts.ready = self.lifecycle.redraw  # before a pdb prompt
        self.lifecycle.watching(self.group)  # where each rank is: SIGQUIT, hang detection
        return {rp.rank - self.ranks[0]: rp.process.pid for rp in self.group.processes}

    def _specs(self, attempt: int) -> dict[int, RankSpec]:
        assert self.workers is not None
        # What torch's LocalElasticAgent gives its workers, besides the rank variables.
        extra = {
            **self.coordinator.rank_env(),
            "TORCHELASTIC_RESTART_COUNT": str(attempt),
            "TORCHELASTIC_MAX_RESTARTS": str(self.config.max_restarts),
            "TORCHELASTIC_RUN_ID": RUN_ID,
            "GROUP_WORLD_SIZE": str(self.config.num_nodes),
            "ROLE_NAME": self._worker_group.spec.role,
            "ROLE_WORLD_SIZE": str(self.config.world_size),
        }
        return {
            rank: replace(
                spec,
                env={**spec.env, **extra, "ROLE_RANK": str(rank)},
                # Each node returns its own ranks' values (its first rank's without return_all).
                send_result=self.config.return_all or spec.info.local_rank == 0,
            )
            for rank, spec in rank_specs(self.config, self.workers).items()
        }

    def _emit(self, event: Event) -> None:
        self.lifecycle.emit(event)
        if isinstance(event, Failed):
            self.failures.append(event)

    def _stop_wanted(self) -> bool:
        return self._failed() or self.coordinator.news() is not None

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        assert self.group is not None
        group = self.group
        end = time.monotonic() + SLICE
        ending = self._ending  # (torch calls this again while the other nodes finish)
        while ending is None:
            # (each turn: the Ctrl-C check, the view; a rank at breakpoint(): its prompt)
            ending = group.turn(self.lifecycle.deadline, self._turned)
            # Once stopping began, finish it here: torch's loop must not see HEALTHY meanwhile.
            self._stopping = self._stopping or self._stop_wanted() or self._past_deadline()
            if ending is not None or self._stopping or time.monotonic() < end:
                continue
            if self._round_abandoned():
                group.channel.stop_all()  # then FAILED below, the restart counted like the others
                self._stopping = True
                continue
            return RunResult(state=WorkerState.HEALTHY)
        self._ending = ending
        self._stop_ranks()  # (all exited: what they wrote last is read, the group closed)
        if ending.how is How.TIMED_OUT:
            self._time_out(group)
        if not self._failed() and self.coordinator.news(fresh=True) is None:
            return self._await_other_nodes()
        return self._settle()

    def _turned(self) -> None:
        self._interrupted()
        self.lifecycle.tick()
        self._publish_root_cause()

    def _past_deadline(self) -> bool:
        """The timeout passed: the ranks are being asked where they are, then stopped."""
        deadline = self.lifecycle.deadline
        return deadline is not None and time.monotonic() >= deadline

    def _exit_barrier(self) -> None:
        """torch's exit barrier (a blocking store wait, deaf to Ctrl-C) is already done:
        SUCCEEDED comes only once every node reported done (_await_other_nodes), and node 0
        keeps its stores up until the others have left (elastic.NodeCoordinator.close)."""

    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        self._stop_ranks()

    def _shutdown(self, death_sig: Any = None, timeout: int = 30) -> None:
        self._stop_ranks()

    def _stop_ranks(self) -> None:
        """The group's one shutdown (kept after it: torch calls _monitor_workers again while
        the other nodes finish)."""
        if self.group is not None:
            self.group.shutdown()

    def _abandon(self, exc: BaseException) -> None:
        """Interrupted, or the rendezvous failed: tell the other nodes, close the view."""
        self._stop_ranks()
        reason = "interrupted" if isinstance(exc, KeyboardInterrupt) else first_line(exc)
        if not isinstance(exc, (RendezvousTimeout, ValueError)):
            with contextlib.suppress(Exception):
                self.coordinator.publish(News.stop(self.config.node_rank, reason))
        verdict = (
            Verdict.STOPPED if isinstance(exc, KeyboardInterrupt)
            else Verdict.TIMED_OUT if isinstance(exc, TimeoutError)
            else Verdict.FAILED
        )
        self.lifecycle.abandon(exc, verdict)
