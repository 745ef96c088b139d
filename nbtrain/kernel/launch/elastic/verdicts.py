"""How an elastic attempt ends, the same on every node: the root cause published at once, the
verdict all nodes agree on (the news in the round's store), the wait for the other nodes after
this node's ranks succeeded, and the error or value the launch ends with.

A part of ``NodeAgent`` (agent.py), which mixes it in beside torch's ``SimpleElasticAgent``;
what it reads of the agent is declared below.
"""

from __future__ import annotations

import time
from typing import Any, NoReturn

from torch.distributed.elastic.agent.server.api import RunResult, WorkerState

from nbtrain.display.runstate import Verdict
from nbtrain.kernel.group import RankGroup
from nbtrain.kernel.group.outcome import Outcome
from nbtrain.kernel.launch.elastic.endings import AttemptEnded, stopped_error
from nbtrain.kernel.launch.elastic.news import COLLATERAL_GRACE, Coordinator, News
from nbtrain.kernel.options.config import LaunchConfig
from nbtrain.kernel.run import tracebacks
from nbtrain.kernel.run.lifecycle import Run
from nbtrain.shared.errors import WorkerError
from nbtrain.shared.events import Failed

SLICE = 0.25  # seconds one monitor call supervises the ranks before torch's loop looks around


class Verdicts:
    """The verdict half of ``NodeAgent``."""

    config: LaunchConfig
    coordinator: Coordinator
    lifecycle: Run
    ranks: list[int]
    verdict: News | None  # the news that ended the last attempt
    failures: list[Failed]  # every Failed event of the attempt, collateral too
    _published: bool  # this node's root cause is published
    _done: bool  # this node's ranks succeeded (counted in the round's store)
    _remaining_restarts: int  # (torch's)

    def _attempt(self) -> int:
        raise NotImplementedError  # (NodeAgent's: torch's restart count)

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

    def _end(self, summary: str, verdict: Verdict | None = None) -> None:
        self.lifecycle.end(summary, verdict)

    # -- node-level status -------------------------------------------------------------------

    def say(self, text: str) -> None:
        """A node-level status ("waiting for nodes (1 of 2 joined)", "restarting ...")."""
        self.lifecycle.say(text)

    @property
    def outcome(self) -> Outcome:
        return self.lifecycle.outcome
