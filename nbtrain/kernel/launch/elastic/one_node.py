"""One node with ``max_restarts > 0``: torch's agent with an in-process rendezvous handler and
store, and a fresh loopback worker store per attempt."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch.distributed import HashStore, PrefixStore
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousStoreInfo,
)

from nbtrain.kernel.launch.elastic.news import KEY_PREFIX, RUN_ID, News, Say
from nbtrain.kernel.specs.rendezvous import LOOPBACK, LocalRendezvous, open_local


class LocalCoordinator:
    """One node: torch's agent over an in-process rendezvous, a loopback worker store."""

    local_address = LOOPBACK

    def __init__(self, world_size: int) -> None:
        self._world_size = world_size
        self._handler = InProcessRendezvous()
        self._workers: LocalRendezvous | None = None
        self._news: News | None = None

    @property
    def handler(self) -> RendezvousHandler:
        return self._handler

    def connect(self, say: Say) -> None:
        pass

    @contextlib.contextmanager
    def joining(self, attempt: int, say: Say) -> Iterator[None]:
        yield

    def begin_round(self, store: Any, group_rank: int, group_size: int) -> LocalRendezvous:
        self._close_workers()
        self._news = None
        self._workers = open_local(self._world_size)
        return self._workers

    def rank_env(self) -> dict[str, str]:
        return {}

    def news(self, *, fresh: bool = False) -> News | None:
        return self._news

    def publish(self, news: News) -> News:
        self._news = self._news or news
        return self._news

    def mark_done(self) -> None:
        pass

    def done_count(self) -> int:
        return 1

    def silent_nodes(self) -> list[int]:
        return []

    def close(self) -> None:
        self._close_workers()
        self._handler.shutdown()

    def _close_workers(self) -> None:
        if self._workers is not None:
            self._workers.close()
            self._workers = None


class InProcessRendezvous(RendezvousHandler):
    """A one-node rendezvous: every round completes at once, with a store of its own.

    torch's ``static`` backend would open a TCP server listening on every interface; a single
    machine needs none (the ranks' store is nbtrain's loopback one)."""

    def __init__(self) -> None:
        self._store = HashStore()
        self._round = 0
        self._closed = False

    def get_backend(self) -> str:
        return "nbtrain-local"

    def next_rendezvous(self) -> RendezvousInfo:
        self._round += 1
        store = PrefixStore(f"{KEY_PREFIX}round/{self._round}", self._store)
        return RendezvousInfo(store, 0, 1, RendezvousStoreInfo(LOOPBACK, 0))

    def is_closed(self) -> bool:
        return self._closed

    def set_closed(self) -> None:
        self._closed = True

    def num_nodes_waiting(self) -> int:
        return 0

    def get_run_id(self) -> str:
        return RUN_ID

    def shutdown(self) -> bool:
        self._closed = True
        return True


# ---------------------------------------------------------------------------------------------
# Addresses


