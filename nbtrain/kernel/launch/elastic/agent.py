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
from typing import Any, NoReturn

from torch.distributed.elastic.agent.server.api import (
    RunResult,
    SimpleElasticAgent,
    Worker,
    WorkerGroup,
    WorkerSpec,
    WorkerState,
)

from nbtrain.display.runstate import Verdict
from nbtrain.kernel.group import Interrupts, LocalProcesses, RankGroup, sigint_deferred
from nbtrain.kernel.group.outcome import Outcome
from nbtrain.kernel.launch.elastic.endings import (
    AttemptEnded,
    forget_locals,
    quiet_agent_log,
    stopped_error,
    title_of,
)
from nbtrain.kernel.launch.elastic.network import check_endpoint_here
from nbtrain.kernel.launch.elastic.news import (
    COLLATERAL_GRACE,
    RUN_ID,
    Coordinator,
    News,
    RendezvousTimeout,
    StaleRendezvous,
    first_line,
)
from nbtrain.kernel.launch.elastic.node import NodeCoordinator
from nbtrain.kernel.launch.elastic.one_node import LocalCoordinator
from nbtrain.kernel.options.config import LaunchConfig
from nbtrain.kernel.run import tracebacks
from nbtrain.kernel.run.lifecycle import Run
from nbtrain.kernel.specs.payload import PreparedCall, released
from nbtrain.kernel.specs.rankspec import rank_specs
from nbtrain.kernel.specs.rendezvous import LocalRendezvous
from nbtrain.rank import rank_entry
from nbtrain.shared.errors import LaunchError, WorkerError
from nbtrain.shared.events import Event, Failed
from nbtrain.shared.specs import RankSpec

MONITOR_INTERVAL = 0.01  # torch's loop sleeps this between monitor calls; the slice does the wait
SLICE = 0.25  # seconds one monitor call supervises the ranks before torch's loop looks around


def run_elastic(config: LaunchConfig, payload: bytes | PreparedCall) -> Any:
    """Entry point from ``notebook_launcher`` for ``num_nodes > 1`` or ``max_restarts > 0``."""
    __tracebackhide__ = True  # see launcher.notebook_launcher

    def launch(call: PreparedCall) -> Any:
        __tracebackhide__ = True
        call.commit(lambda text: None, config.num_processes)  # once: restarts reuse it
        return _run_elastic(config, call.data)

    return released(payload, launch)


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


class NodeAgent(SimpleElasticAgent):
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
        group, supervisor = self.group, self.group.channel
        end = time.monotonic() + SLICE
        while supervisor.running:
            group.step(self.lifecycle.deadline)
            self._interrupted()
            self._tick()
            supervisor.prompts.turn()  # a rank at breakpoint(): the terminal's prompt
            # Once stopping began, finish it here: torch's loop must not see HEALTHY meanwhile.
            if supervisor.stopping or time.monotonic() < end:
                continue
            if self._round_abandoned():
                supervisor.stop_all()  # then FAILED below, the restart counted like the others
                continue
            return RunResult(state=WorkerState.HEALTHY)
        self._close_ranks()
        if supervisor.timed_out:
            self._time_out(group)
        if not self._failed() and self.coordinator.news(fresh=True) is None:
            return self._await_other_nodes()
        return self._settle()

    def _round_abandoned(self) -> bool:
        """Before torch's loop sees HEALTHY: has another node failed? It publishes the news
        first, then joins torch's wait list for a new round, which torch would take for a
        membership change and restart every rank without counting a restart; so a node that
        looks at both first ends this attempt as FAILED instead, like every other node. (With
        min_nodes == max_nodes a waiting node is always one whose attempt ended.)"""
        if self.coordinator.news(fresh=True) is not None:
            return True
        try:
            return bool(self.coordinator.handler.num_nodes_waiting())
        except Exception:  # node 0 gone: the next store operation says so properly
            return False

    def _tick(self) -> None:
        self.lifecycle.tick()
        self._publish_root_cause()

    def _close_ranks(self) -> None:
        group = self.group  # (kept: torch calls _monitor_workers again while others finish)
        if group is None or group.closed:
            return
        if group.supervisor is not None:  # (None: interrupted before it existed)
            group.supervisor.drain()
        group.close()

    def _exit_barrier(self) -> None:
        """torch's exit barrier (a blocking store wait, deaf to Ctrl-C) is already done:
        SUCCEEDED comes only once every node reported done (_await_other_nodes), and node 0
        keeps its stores up until the others have left (elastic.NodeCoordinator.close)."""

    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        self._stop_ranks()

    def _shutdown(self, death_sig: Any = None, timeout: int = 30) -> None:
        self._stop_ranks()

    def _stop_ranks(self) -> None:
        group = self.group
        if group is None or group.closed:
            return
        with sigint_deferred():
            group.stop()  # (and reads what they wrote last)
            group.close()

    # -- verdicts -------------------------------------------------------------------------------

    def _publish_root_cause(self) -> None:
        """A rank that failed on its own account is news for every node, at once."""
        rank = self.outcome.root_cause()
        if self._published or rank is None:
            return
        failure = self.outcome.records[rank].failure
        if failure is not None and failure.collateral:
            return  # maybe only the echo of another node's failure: see _settle
        self._published = True
        self.coordinator.publish(
            News.failure(self.outcome.error(node=self.config.node_rank), collateral=False)
        )

    def _settle(self) -> RunResult:
        """The local ranks ended and something failed: the verdict every node agrees on. A
        failure ends the attempt as FAILED on every node (torch restarts while it may)."""
        self._publish_root_cause()
        news = self.coordinator.news(fresh=True)
        if news is None and self.config.multi_node:
            # Only peer-loss failures here (or none: another node left the round): give the
            # node with the real cause time to speak.
            until = time.monotonic() + COLLATERAL_GRACE
            while news is None and time.monotonic() < until:
                time.sleep(0.1)
                news = self.coordinator.news(fresh=True)
        if news is None and self._failed():
            news = self.coordinator.publish(News.failure(self._local_error(), collateral=True))
        if news is None:
            reason = "another node left the round without saying why"
            news = self.coordinator.publish(News.stop(self.config.node_rank, reason))
        if news.kind == "stopped":
            self._fail(news)
        self.verdict = news
        if self._remaining_restarts > 0:
            restart = self._attempt() + 1
            self.say(
                f"restarting every rank (restart {restart} of {self.config.max_restarts}): "
                f"{news.summary()}"
            )
        return RunResult(state=WorkerState.FAILED)

    def _await_other_nodes(self) -> RunResult:
        """This node's ranks succeeded: report it, and succeed once every node has. Until
        then a failure elsewhere still fails (or restarts) this node too."""
        if not self._done:
            self._done = True
            self.coordinator.mark_done()
        total = self.config.num_nodes
        end = time.monotonic() + SLICE
        while True:
            deadline = self.lifecycle.deadline
            expired = deadline is not None and time.monotonic() > deadline
            done = self.coordinator.done_count()
            if done >= total:
                return self._succeeded()
            if self._round_abandoned():
                return self._settle()
            if expired:
                self._stop_waiting("timeout")
            silent = self.coordinator.silent_nodes()
            if silent:
                self._stop_waiting(f"node {silent[0]} stopped responding before its ranks finished")
            self.say(f"finished; waiting for the other nodes ({done} of {total} done)")
            if time.monotonic() > end:
                return RunResult(state=WorkerState.HEALTHY)
            time.sleep(0.1)

    def _succeeded(self) -> RunResult:
        # The values themselves stay packed in the Outcome until launch() returns them.
        placeholders: dict[int, Any] = dict.fromkeys(self.ranks)
        return RunResult(state=WorkerState.SUCCEEDED, return_values=placeholders)

    def _stop_waiting(self, reason: str) -> None:
        """End the wait at the end with ``reason``, unless the last node finished meanwhile
        (then every node succeeds alike: one must not time out while another returns)."""
        news = self.coordinator.publish(News.stop(self.config.node_rank, reason))
        if news.kind == "stopped" and self.coordinator.done_count() >= self.config.num_nodes:
            return
        self._fail(news)

    def _time_out(self, group: RankGroup) -> NoReturn:
        self.coordinator.publish(News.stop(self.config.node_rank, "timeout"))
        self._end(f"Timed out after {self.config.timeout:g}s", Verdict.TIMED_OUT)
        raise AttemptEnded(TimeoutError(self.lifecycle.timeout_message(group.stacks())))

    # -- endings -----------------------------------------------------------------------------

    def _succeed(self) -> Any:
        return self.lifecycle.deliver()  # ends the view, also when it raises ResultError

    def _fail(self, news: News) -> NoReturn:
        if news.kind == "stopped":
            verdict = Verdict.TIMED_OUT if news.reason == "timeout" else Verdict.STOPPED
            elapsed = self.lifecycle.state.elapsed
            self._end(f"Stopped after {elapsed:.1f}s: {news.summary()}", verdict)
            raise AttemptEnded(stopped_error(news, self.config, finished=self._done))
        local = news.node == self.config.node_rank and self.outcome.root_cause() == news.rank
        error = self._local_error() if local else news.error(others=self._local_failures())
        self._end(self.lifecycle.state.failed_summary(error), Verdict.FAILED)
        cause = tracebacks.rank_cause(error)
        raise AttemptEnded(error, cause)

    def _failed(self) -> bool:
        # Outcome forgets a peer-loss failure of a rank the launcher then stopped; here that
        # may be the only failure on this node (the cause is elsewhere, or nobody could connect).
        return self.outcome.has_failure() or bool(self.failures)

    def _local_error(self) -> WorkerError:
        if self.outcome.root_cause() is not None:
            return self.outcome.error(node=self.config.node_rank)
        first = min(self.failures, key=lambda failure: failure.time)
        return WorkerError(
            first.rank, type_name=first.type_name, message=first.message,
            exitcode=first.exitcode, remote_traceback=first.traceback,
            node=self.config.node_rank, other_failures=self._local_failures(first.rank),
        )

    def _local_failures(self, besides: int | None = None) -> dict[int, str]:
        ranks = set(self.outcome.failed_ranks()) | {failure.rank for failure in self.failures}
        return {
            rank: self.lifecycle.state.ranks[rank].failure or "failed"
            for rank in sorted(ranks - {besides})
        }

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

    def _end(self, summary: str, verdict: Verdict | None = None) -> None:
        self.lifecycle.end(summary, verdict)

    # -- node-level status -------------------------------------------------------------------

    def say(self, text: str) -> None:
        """A node-level status ("waiting for nodes (1 of 2 joined)", "restarting ...")."""
        self.lifecycle.say(text)

    @property
    def outcome(self) -> Outcome:
        return self.lifecycle.outcome
