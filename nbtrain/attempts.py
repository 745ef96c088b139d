"""One node's launch as a series of attempts: join, run the local ranks, agree on a verdict.

Used for ``num_nodes > 1`` (coordinated through torch's elastic rendezvous, see ``elastic.py``)
and for ``max_restarts > 0`` on one node. The ranks run exactly as in a plain launch
(``processes``, ``Supervisor``, ``Outcome``, the same view); this module adds what changes with
several attempts or several nodes: news from other nodes stops the local ranks, the first
failure everywhere decides between a restart of every rank and the end of the run, and the
node-level status ("waiting for nodes (1 of 2 joined)", "restarting ...") reaches the view.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import replace
from typing import Any, NoReturn

from . import processes, worker
from .config import LaunchConfig, ProgressMode
from .elastic import (
    COLLATERAL_GRACE,
    RUN_ID,
    Coordinator,
    LocalCoordinator,
    News,
    NodeCoordinator,
    RendezvousTimeout,
    check_endpoint_here,
    first_line,
)
from .environment import Frontend, frontend
from .errors import LaunchError, RemoteTraceback, WorkerError
from .events import Event, Failed, Status
from .launcher import (
    GRACE,
    _close_view,
    _interrupted_summary,
    _sigint_deferred,
    _throttled,
    _timeout_message,
    _view,
    rank_specs,
)
from .monitor import RunState
from .outcome import Outcome
from .rendezvous import LocalRendezvous
from .supervisor import Supervisor
from .worker import RankSpec


def run_elastic(config: LaunchConfig, payload: bytes) -> Any:
    """Entry point from ``notebook_launcher`` for ``num_nodes > 1`` or ``max_restarts > 0``."""
    coordinator: Coordinator
    if config.multi_node:
        coordinator = NodeCoordinator(config, check_endpoint_here(config))
    else:
        coordinator = LocalCoordinator(config.world_size)
    try:
        return _NodeRun(config, payload, coordinator).run()
    finally:
        coordinator.close()


class _NodeRun:
    def __init__(self, config: LaunchConfig, payload: bytes, coordinator: Coordinator) -> None:
        self.config = config
        self.payload = payload
        self.coordinator = coordinator
        first = config.node_rank * config.num_processes
        self.ranks = list(range(first, first + config.num_processes))
        self.state = RunState(self.ranks, title=_title(config, self.ranks))
        self.view = _view(config)
        self.draw = _throttled(lambda: self.view.draw(self.state))
        self.deadline: float | None = None  # timeout= counts from the first start of ranks
        self.ended = False
        self.outcome = Outcome(self.ranks)
        self.failures: list[Failed] = []  # every Failed event of the attempt, collateral too
        self._note = ""
        self._prints_notes = _text_mode(config)
        self._published = False
        self._stuck: dict[int, list[str]] = {}  # after a timeout: where each rank was

    # -- the attempt loop ------------------------------------------------------------------

    def run(self) -> Any:
        try:
            for attempt in range(self.config.max_restarts + 1):
                news = self._attempt(attempt)
                if news is None:
                    return self._succeed()
                if news.kind == "failed" and attempt < self.config.max_restarts:
                    self.say(
                        f"restarting every rank (restart {attempt + 1} of "
                        f"{self.config.max_restarts}): {news.summary()}"
                    )
                    continue
                self._fail(news)
        except BaseException as exc:
            if not self.ended:
                self._abandon(exc)
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _attempt(self, attempt: int) -> News | None:
        """Join, run every local rank, and return None on success or the agreed news."""
        workers = self.coordinator.join(attempt, self.say)
        if self.config.multi_node:
            self.say(f"all {self.config.num_nodes} nodes joined; starting ranks")
        self._published = False
        self.outcome, self.failures = Outcome(self.ranks), []
        timed_out = self._supervise(self._specs(attempt, workers))
        if timed_out:
            self.coordinator.publish(News.stop(self.config.node_rank, "timeout"))
            self._end(f"Timed out after {self.config.timeout:g}s")
            raise TimeoutError(_timeout_message(self.config, self.state, self._stuck))
        if not self._failed() and self.coordinator.news() is None:
            return self.coordinator.finish(self.say, self.deadline)
        return self._settle()

    def _specs(self, attempt: int, workers: LocalRendezvous) -> dict[int, RankSpec]:
        extra = {
            **self.coordinator.rank_env(),
            "TORCHELASTIC_RESTART_COUNT": str(attempt),
            "TORCHELASTIC_MAX_RESTARTS": str(self.config.max_restarts),
            "TORCHELASTIC_RUN_ID": RUN_ID,
        }
        return {
            rank: replace(
                spec,
                env={**spec.env, **extra},
                # Each node returns its own ranks' values (its first rank's without return_all).
                send_result=self.config.return_all or spec.info.local_rank == 0,
            )
            for rank, spec in rank_specs(self.config, workers).items()
        }

    def _supervise(self, specs: dict[int, RankSpec]) -> bool:
        """Run the ranks until all exited; True if the launch's timeout expired."""
        outcome = self.outcome

        def emit(event: Event) -> None:
            outcome.apply(event)
            self.state.apply(event)
            if isinstance(event, Failed):
                self.failures.append(event)

        def make_args(rank: int, pipes: processes.RankPipes, close: tuple[int, ...]) -> tuple:
            spec = replace(specs[rank], close_fds=close) if close else specs[rank]
            return (spec, self.payload, pipes.stdout_w, pipes.stderr_w, pipes.events_w)

        def failed() -> bool:
            return self._failed() or self.coordinator.news() is not None

        def tick() -> None:
            self.draw()
            self._publish_root_cause()

        if self.deadline is None and self.config.timeout is not None:
            self.deadline = time.monotonic() + self.config.timeout
        started: list[processes.RankProcess] = []
        supervisor: Supervisor | None = None
        try:
            started = processes.start_ranks(
                self.config.start.method, self.ranks, worker.rank_main, make_args
            )
            supervisor = Supervisor(started, emit, failed=failed, grace=GRACE)
            supervisor.run(self.deadline, tick)
            supervisor.drain()
        except BaseException:
            with _sigint_deferred():
                processes.stop(started, GRACE)
                if supervisor is not None:
                    supervisor.drain()
                processes.close(started)
            raise
        processes.close(started)
        if supervisor.timed_out:
            self._stuck = supervisor.stuck_frames()
        return supervisor.timed_out

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

    def _settle(self) -> News:
        """After the local ranks ended: the verdict every node agrees on."""
        self._publish_root_cause()
        news = self.coordinator.news()
        if news is None and self._failed():
            # Only peer-loss failures here: give the node with the real cause time to speak.
            end = time.monotonic() + (COLLATERAL_GRACE if self.config.multi_node else 0.0)
            while news is None and time.monotonic() < end:
                time.sleep(0.1)
                news = self.coordinator.news()
            if news is None:
                news = self.coordinator.publish(News.failure(self._local_error(), collateral=True))
        assert news is not None
        return news

    # -- endings -----------------------------------------------------------------------------

    def _succeed(self) -> Any:
        results = self.outcome.results()
        self._end(self.state.done_summary())
        if self.config.return_all:
            return [results.get(rank) for rank in self.ranks]
        return results.get(self.ranks[0])

    def _fail(self, news: News) -> NoReturn:
        if news.kind == "stopped":
            self._end(f"Stopped after {self.state.elapsed:.1f}s: {news.summary()}")
            where = f"every rank of this node (node {self.config.node_rank}) was stopped"
            if news.reason == "timeout" and news.node == self.config.node_rank:
                raise TimeoutError(
                    f"notebook_launcher(timeout={self.config.timeout:g}) expired on this node "
                    f"(node {news.node}) while it waited for the other nodes to finish; they "
                    "were told to stop. Raise timeout= if the run needs longer."
                )
            if news.reason == "timeout":
                raise TimeoutError(
                    f"Node {news.node} reached its notebook_launcher(timeout=...) and stopped "
                    f"the run; {where}."
                )
            raise LaunchError(f"The run was stopped: {news.summary()}; {where}.")
        local = news.node == self.config.node_rank and self.outcome.root_cause() == news.rank
        error = self._local_error() if local else news.error(others=self._local_failures())
        self._end(f"Failed after {self.state.elapsed:.1f}s: {error}".splitlines()[0])
        cause = RemoteTraceback(error.remote_traceback) if error.remote_traceback else None
        raise error from cause

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
            rank: self.state.ranks[rank].failure or "failed"
            for rank in sorted(ranks - {besides})
        }

    def _abandon(self, exc: BaseException) -> None:
        """Interrupted, or the rendezvous failed: tell the other nodes, close the view."""
        reason = "interrupted" if isinstance(exc, KeyboardInterrupt) else first_line(exc)
        if not isinstance(exc, (RendezvousTimeout, ValueError)):
            with contextlib.suppress(Exception):
                self.coordinator.publish(News.stop(self.config.node_rank, reason))
        self._end(_interrupted_summary(exc, self.state).splitlines()[0])

    def _end(self, summary: str) -> None:
        self.ended = True
        self.state.finish(summary)
        _close_view(self.view, self.state)

    # -- node-level status -------------------------------------------------------------------

    def say(self, text: str) -> None:
        """A node-level status: the note of every local rank (and a line in text mode)."""
        if text == self._note:
            return
        self._note = text
        for rank in self.ranks:
            self.state.apply(Status(rank, text))
        if self._prints_notes:
            node = f" node {self.config.node_rank}" if self.config.multi_node else ""
            print(f"[nbtrain{node}] {text}", file=sys.stderr, flush=True)
        self.draw()


def _title(config: LaunchConfig, ranks: list[int]) -> str:
    method = config.start.method.value
    restarts = f", up to {config.max_restarts} restarts" if config.max_restarts else ""
    if not config.multi_node:
        return f"{len(ranks)} ranks, {method}{restarts}"
    return (
        f"node {config.node_rank} of {config.num_nodes}: ranks {ranks[0]}-{ranks[-1]} of "
        f"{config.world_size}, {method}{restarts}"
    )


def _text_mode(config: LaunchConfig) -> bool:
    """Mirrors make_view's choice: the text view shows no rank notes, so print node status."""
    if config.progress is ProgressMode.OFF or config.progress is ProgressMode.WIDGETS:
        return False
    return config.progress is ProgressMode.TEXT or frontend() is not Frontend.JUPYTER
