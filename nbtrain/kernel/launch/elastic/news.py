"""What every node of a launch reads and writes in the round's store: the news (first failure
or stop of an attempt, first writer wins), the nodes' launch options and their check, and the
shared constants and errors of the rendezvous."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, Protocol

from nbtrain.kernel.options.config import LaunchConfig
from nbtrain.kernel.specs.rendezvous import LocalRendezvous
from nbtrain.shared.errors import WorkerError

RDZV_BACKEND = "c10d"
RUN_ID = "nbtrain"  # one store per launch (node 0 opens it fresh), so a fixed id is enough
POLL = 0.5  # seconds between looks at the peers' news in the store
COLLATERAL_GRACE = 3.0  # seconds a node with only peer-loss failures waits for the root cause
LEAVE_WAIT = 15.0  # seconds node 0 keeps its stores up for the other nodes to read the verdict
NODE_SILENCE = 60.0  # seconds without a beat after which a node that is not done counts as lost
STORE_TIMEOUT = timedelta(seconds=30)
KEY_PREFIX = "nbtrain/"

Say = Callable[[str], None]


class RendezvousTimeout(TimeoutError):
    """Not every node arrived at the rendezvous within ``rdzv_timeout``."""


class StaleRendezvous(Exception):
    """The rendezvous found is closed or vanishing: a previous launch's, on the same endpoint."""


# ---------------------------------------------------------------------------------------------
# The verdict every node reads from the store


@dataclass(frozen=True)
class News:
    """The first failure or stop of an attempt, as every node reads it from the store."""

    kind: str  # "failed": a rank failed (restartable) | "stopped": interrupt, timeout, lost node
    node: int
    rank: int | None = None
    type_name: str | None = None
    message: str = ""
    traceback: str = ""
    exitcode: int | None = None
    signal: str | None = None
    collateral: bool = False
    reason: str = ""

    @classmethod
    def failure(cls, error: WorkerError, *, collateral: bool) -> News:
        return cls(
            "failed", error.node, error.rank, error.type_name, error.message,
            error.remote_traceback[-20000:], error.exitcode, error.signal, collateral,
        )

    @classmethod
    def stop(cls, node: int, reason: str) -> News:
        return cls("stopped", node, reason=reason)

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, data: bytes | str) -> News:
        return cls(**json.loads(data))

    def summary(self) -> str:
        if self.kind == "stopped":
            return f"node {self.node} stopped the run ({self.reason})"
        return str(self.error()).splitlines()[0]

    def error(self, others: dict[int, str] | None = None) -> WorkerError:
        assert self.rank is not None
        return WorkerError(
            self.rank, type_name=self.type_name, message=self.message, exitcode=self.exitcode,
            signal=self.signal, remote_traceback=self.traceback, node=self.node,
            other_failures=others,
        )


class Coordinator(Protocol):
    """What the agent needs from the nodes' meeting place (one node, or several)."""

    local_address: str

    @property
    def handler(self) -> Any: ...  # a torch RendezvousHandler

    def connect(self, say: Say) -> None: ...

    def joining(self, attempt: int, say: Say) -> contextlib.AbstractContextManager[None]: ...

    def begin_round(self, store: Any, group_rank: int, group_size: int) -> LocalRendezvous: ...

    def rank_env(self) -> dict[str, str]: ...

    def news(self, *, fresh: bool = False) -> News | None: ...

    def publish(self, news: News) -> News: ...

    def mark_done(self) -> None: ...

    def done_count(self) -> int: ...

    def silent_nodes(self) -> list[int]: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------------------------------------
# One node with restarts


def check_nodes(nodes: list[dict[str, Any]], config: LaunchConfig) -> None:
    """Every node was launched with the same shape, and node ranks 0..N-1 each once."""
    for name in ("num_nodes", "num_processes", "max_restarts"):
        values = {node["node_rank"]: node[name] for node in nodes}
        if len(set(values.values())) > 1:
            listing = ", ".join(f"node {r}: {v}" for r, v in sorted(values.items()))
            raise ValueError(
                f"The nodes were launched with different {name} ({listing}). Pass the same "
                f"{name} on every node."
            )
    ranks = sorted(node["node_rank"] for node in nodes)
    if ranks != list(range(config.num_nodes)):
        hosts = ", ".join(f"{node['host']}: node_rank={node['node_rank']}" for node in nodes)
        raise ValueError(
            f"The node ranks do not cover 0..{config.num_nodes - 1} once each ({hosts}). Give "
            "every node its own node_rank."
        )


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
