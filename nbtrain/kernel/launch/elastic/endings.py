"""How an elastic launch ends and is shown: the outcome raised out of torch's agent loop, the
error a stopped run raises, the frames it must not keep alive, the title, torch's quiet log."""

from __future__ import annotations

import contextlib
import logging
import traceback
from collections.abc import Iterator

from nbtrain.kernel.launch.elastic.news import (
    News,
)
from nbtrain.kernel.options.config import LaunchConfig
from nbtrain.kernel.options.names import given, to_raise
from nbtrain.shared.errors import LaunchError


class AttemptEnded(Exception):
    """The launch's outcome, raised from inside torch's agent loop and re-raised by
    ``NodeAgent.launch`` as ``error`` (whose traceback then starts there)."""

    def __init__(self, error: Exception, cause: BaseException | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.cause = cause


def stopped_error(news: News, config: LaunchConfig, *, finished: bool) -> Exception:
    where = (
        f"this node's ranks (node {config.node_rank}) had finished, the run as a whole did not"
        if finished
        else f"every rank of this node (node {config.node_rank}) was stopped"
    )
    if news.reason == "timeout" and news.node == config.node_rank:
        return TimeoutError(
            f"{given('timeout', f'{config.timeout:g}')} expired on this node "
            f"(node {news.node}) while it waited for the other nodes to finish; they "
            f"were told to stop. Raise {to_raise('timeout')} if the run needs longer."
        )
    if news.reason == "timeout":
        return TimeoutError(
            f"Node {news.node} reached its {given('timeout')} and stopped "
            f"the run; {where}."
        )
    return LaunchError(f"The run was stopped: {news.summary()}; {where}.")


def forget_locals(exc: BaseException) -> None:
    """Clear the finished frames an exception leaving the launch carries: torch's loop holds
    the rendezvous handler (and through it node 0's store) in a local, and IPython keeps the
    last exception with its frames; what the launch closed must not be kept alive there."""
    for error in (exc, exc.__cause__, exc.__context__):
        if error is not None:
            traceback.clear_frames(error.__traceback__)


def title_of(config: LaunchConfig, ranks: list[int]) -> str:
    method = config.start.method.value
    restarts = f", up to {config.max_restarts} restarts" if config.max_restarts else ""
    if not config.multi_node:
        return f"{len(ranks)} ranks, {method}{restarts}"
    return (
        f"node {config.node_rank} of {config.num_nodes}: ranks {ranks[0]}-{ranks[-1]} of "
        f"{config.world_size}, {method}{restarts}"
    )


@contextlib.contextmanager
def quiet_agent_log() -> Iterator[None]:
    """torch's agent logs every phase, and a warning per restart; the live view and the
    launch's result say all of it, in the cell, so keep its records out of the kernel's log.
    (torch gives each of its modules a logger with a level of its own: set each one.)"""
    names = [
        name for name in logging.root.manager.loggerDict
        if name.startswith("torch.distributed.elastic")
    ]
    loggers = [logging.getLogger(name) for name in names]
    previous = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(loggers, previous, strict=True):
            log.setLevel(level)
