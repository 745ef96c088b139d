"""A node of a multi-node launch: connect to node 0's c10d rendezvous (node 0 hosts it), count
the nodes in, check their options, open the worker store of each attempt, and keep the news,
the done count and the heartbeats in the round's store."""

from __future__ import annotations

import contextlib
import json
import math
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousParameters,
    api,
)
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

from nbtrain.kernel.host import environment
from nbtrain.kernel.launch.elastic.blocking import every, quiet_rendezvous_log
from nbtrain.kernel.launch.elastic.network import interface_of, split_endpoint
from nbtrain.kernel.launch.elastic.news import (
    KEY_PREFIX,
    LEAVE_WAIT,
    NODE_SILENCE,
    POLL,
    RDZV_BACKEND,
    RUN_ID,
    STORE_TIMEOUT,
    News,
    RendezvousTimeout,
    Say,
    StaleRendezvous,
    check_nodes,
    first_line,
)
from nbtrain.kernel.options.config import LaunchConfig
from nbtrain.kernel.specs.rendezvous import LocalRendezvous, open_local
from nbtrain.shared.errors import EndpointInUseError, LaunchError


class NodeCoordinator:
    """This node's side of the rendezvous: connect, join rounds, exchange options, agree on a
    verdict, wait for the others at the end."""

    def __init__(self, config: LaunchConfig, local_address: str) -> None:
        assert config.rdzv_endpoint is not None
        self.config = config
        self.host, self.port = split_endpoint(config.rdzv_endpoint)
        self.node = config.node_rank
        self.is_host = config.node_rank == 0
        self.local_address = local_address
        self._store: Any = None  # the c10d backend store (server on node 0, client elsewhere)
        self._handler: Any = None
        self._round: Any = None  # PrefixStore of the current round
        self._workers: LocalRendezvous | None = None
        self._news: News | None = None
        self._polled = 0.0
        self._beats: dict[int, tuple[int, float]] = {}  # node -> (last beat seen, when it moved)
        self._deadline: float | None = None  # of the first join (rdzv_timeout)
        self._silent: set[int] = set()  # nodes found silent
        self._formed = False  # a round completed: the rendezvous is ours to close on leaving
        self._silence_checked = 0.0
        self._last_silent: list[int] = []
        self._interface = interface_of(local_address)

    @property
    def handler(self) -> Any:
        return self._handler

    def rank_env(self) -> dict[str, str]:
        """gloo finds its own address by resolving the hostname, which is often loopback
        (Debian maps it to 127.0.1.1): peers on other machines could then never connect. Point
        it at the interface that reaches node 0, unless the user chose one."""
        if self._interface is None or environment.gloo_interface_set():
            return {}
        return {"GLOO_SOCKET_IFNAME": self._interface}

    # -- connecting and joining -------------------------------------------------------------

    def connect(self, say: Say) -> None:
        """Reach node 0's store and make torch's rendezvous handler over it. A store whose
        rendezvous is closed, or that fails while this node connects, is a previous launch's
        that node 0 is just closing (or node 0 restarting its kernel): connect again, to the
        fresh one, until rdzv_timeout."""
        if self._deadline is None:
            self._deadline = time.monotonic() + self.config.rdzv_timeout
        while True:
            self._drop()
            failure = self._connect(say, self._deadline)
            if failure is None:
                return
            if time.monotonic() > self._deadline:
                raise RendezvousTimeout(self._timeout_advice(f"node 0 only offered {failure}"))
            say(f"waiting for node 0 at {self.config.rdzv_endpoint} (it offered {failure})")
            time.sleep(1.0)

    def _connect(self, say: Say, deadline: float) -> str | None:
        """Connect once; None when connected to an open rendezvous, else what was found."""
        if self.is_host:
            self._store = self._open_server()
            self._handler = self._make_handler(self._store)
            return None
        self._wait_for_host(say, deadline)
        try:
            self._store = TCPStore(self.host, self.port, is_master=False, timeout=STORE_TIMEOUT)
            self._handler = self._make_handler(self._store)
            return "a closed rendezvous" if self._handler.is_closed() else None
        except (RuntimeError, OSError, api.RendezvousError) as exc:
            return f"a store that failed ({type(exc).__name__}: {first_line(exc)})"

    def _make_handler(self, store: TCPStore) -> Any:
        params = RendezvousParameters(
            backend=RDZV_BACKEND,
            endpoint=f"{self.host}:{self.port}",
            run_id=RUN_ID,
            min_nodes=self.config.num_nodes,
            max_nodes=self.config.num_nodes,
            local_addr=self.local_address,
            join_timeout=max(1, math.ceil(self.config.rdzv_timeout)),
            last_call_timeout=1,
            close_timeout=10,
        )
        return create_handler(store, C10dRendezvousBackend(store, RUN_ID), params)

    def _open_server(self) -> TCPStore:
        try:
            return TCPStore(
                self.host, self.port, is_master=True, timeout=STORE_TIMEOUT,
                wait_for_workers=False,
            )
        except (RuntimeError, OSError) as exc:
            raise EndpointInUseError(
                f"Node 0 cannot open the rendezvous on port {self.port} "
                f"(rdzv_endpoint={self.config.rdzv_endpoint!r}): {first_line(exc)}. Another "
                "program, or a launch still running in another kernel on this machine, uses "
                "it: pick another port in rdzv_endpoint, the same on every node."
            ) from None

    def _wait_for_host(self, say: Say, deadline: float) -> None:
        # A plain TCP probe first: a TCPStore client that cannot connect blocks in C++ (deaf
        # to Ctrl-C) and logs a C++ stack trace per attempt.
        while True:
            try:
                with socket.create_connection((self.host, self.port), timeout=1.0):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RendezvousTimeout(
                    f"Node 0 never opened the rendezvous at {self.config.rdzv_endpoint} within "
                    f"rdzv_timeout={self.config.rdzv_timeout:g}s. Start the same launch with "
                    "node_rank=0 on the machine the endpoint names, check that the address and "
                    "port are reachable from this machine (firewall), or raise rdzv_timeout."
                )
            say(f"waiting for node 0 at {self.config.rdzv_endpoint}")
            time.sleep(POLL)

    @contextlib.contextmanager
    def joining(self, attempt: int, say: Say) -> Iterator[None]:
        """Around torch's ``next_rendezvous``: count this node in, show who has joined, and
        turn torch's errors into ones that say what to do."""
        self._news, self._round = None, None
        status = lambda: say(self._waiting_text(attempt))  # noqa: E731
        arrived = f"{KEY_PREFIX}arrived/{attempt}"
        try:
            if self._handler.is_closed():  # a previous launch's rendezvous, being closed
                raise StaleRendezvous
            self._store.add(arrived, 1)
            self._store.append(f"{KEY_PREFIX}arrived_nodes/{attempt}", f"{self.node},")
            try:
                with every(POLL, status):
                    yield
            except BaseException:
                with contextlib.suppress(Exception):  # no longer waiting: not counted in
                    self._store.add(arrived, -1)
                raise
        except LaunchError:  # (a RuntimeError) ours, from the round's own checks: as it is
            raise
        except api.RendezvousTimeoutError:
            raise RendezvousTimeout(self._timeout_text(attempt)) from None
        except (api.RendezvousError, RuntimeError, OSError) as exc:
            # Closed (RendezvousClosedError, ...GracefulExitError) or gone (connection errors).
            raise StaleRendezvous(first_line(exc)) from exc

    def _waiting_text(self, attempt: int) -> str:
        joined = int(self._store.add(f"{KEY_PREFIX}arrived/{attempt}", 0))
        return f"waiting for nodes ({joined} of {self.config.num_nodes} joined)"

    def _timeout_text(self, attempt: int) -> str:
        with contextlib.suppress(RuntimeError, OSError, ValueError):
            raw = self._store.get(f"{KEY_PREFIX}arrived_nodes/{attempt}").decode()
            seen = sorted({int(n) for n in raw.split(",") if n})
            missing = [n for n in range(self.config.num_nodes) if n not in seen]
            present = ", ".join(map(str, seen))
            absent = ", ".join(map(str, missing)) or "none (a node joined twice?)"
            detail = f"{len(seen)} of {self.config.num_nodes} nodes joined (node {present}); " \
                     f"missing: node {absent}"
            return self._timeout_advice(detail)
        return self._timeout_advice(f"not all {self.config.num_nodes} nodes joined")

    def _timeout_advice(self, detail: str) -> str:
        return (
            f"Rendezvous at {self.config.rdzv_endpoint} timed out after "
            f"rdzv_timeout={self.config.rdzv_timeout:g}s: {detail}. Start the same launch on "
            f"every node (num_nodes={self.config.num_nodes}, node_rank=0..."
            f"{self.config.num_nodes - 1}, rdzv_endpoint={self.config.rdzv_endpoint!r}) within "
            "rdzv_timeout of each other, or raise rdzv_timeout."
        )

    # -- a round -----------------------------------------------------------------------------

    def begin_round(self, store: Any, group_rank: int, group_size: int) -> LocalRendezvous:
        """The round formed: check that every node was launched alike, and give this
        attempt's ranks their fresh worker store."""
        self._round, self._news, self._beats = store, None, {}
        self._formed = True
        self._check_nodes(store, group_rank, group_size)
        return self._worker_store(store)

    def _check_nodes(self, store: Any, group_rank: int, group_size: int) -> None:
        mine = {
            "node_rank": self.node,
            "num_processes": self.config.num_processes,
            "num_nodes": self.config.num_nodes,
            "max_restarts": self.config.max_restarts,
            "host": socket.gethostname(),
        }
        keys = [f"{KEY_PREFIX}node/{i}" for i in range(group_size)]
        try:
            store.set(keys[group_rank], json.dumps(mine))
            store.wait(keys, STORE_TIMEOUT)
            nodes = [json.loads(store.get(key)) for key in keys]
        except (RuntimeError, OSError) as exc:
            raise LaunchError(
                "Not every node reported its launch options after the rendezvous completed "
                f"({type(exc).__name__}: {first_line(exc)}): a node was interrupted or lost "
                "at that moment. Start the launch again on every node."
            ) from None
        check_nodes(nodes, self.config)

    def _worker_store(self, store: Any) -> LocalRendezvous:
        if self._workers is not None:
            self._workers.close()
            self._workers = None
        if self.is_host:
            # Ranks on the other nodes connect to it: every interface, not just the loopback.
            opened = open_local(self.config.world_size, listen=None)
            self._workers = replace(opened, host=self.host)
            store.set(f"{KEY_PREFIX}master_port", str(opened.port))
            return self._workers
        try:
            port = int(store.get(f"{KEY_PREFIX}master_port"))
        except (RuntimeError, OSError) as exc:
            raise LaunchError(self._lost(exc)) from None
        return LocalRendezvous(None, self.host, port)

    # -- the verdict -----------------------------------------------------------------------

    def news(self, *, fresh: bool = False) -> News | None:
        """What a node reported for this attempt (read at most every POLL seconds unless
        ``fresh``); each look also beats this node's heart."""
        now = time.monotonic()
        if self._news is not None or self._round is None:
            return self._news
        if not fresh and now - self._polled < POLL:
            return None
        self._polled = now
        try:
            self._round.add(f"{KEY_PREFIX}beat/{self.node}", 1)
            if self._round.check([f"{KEY_PREFIX}news"]):
                self._news = News.decode(self._round.get(f"{KEY_PREFIX}news"))
        except (RuntimeError, OSError, ValueError) as exc:
            self._news = News.stop(0, self._lost(exc))
        return self._news

    def publish(self, news: News) -> News:
        """Offer this node's news; return the one every node agrees on (the first written)."""
        if self._round is None:
            return news
        try:
            agreed = self._round.compare_set(f"{KEY_PREFIX}news", "", news.encode())
            self._news = News.decode(agreed)
        except (RuntimeError, OSError, ValueError):
            self._news = news  # node 0 is gone: our own account is the best there is
        return self._news

    def mark_done(self) -> None:
        """This node's ranks all succeeded in this attempt."""
        assert self._round is not None
        with contextlib.suppress(RuntimeError, OSError, ValueError):
            self._round.add(f"{KEY_PREFIX}done", 1)
            self._round.set(f"{KEY_PREFIX}done/{self.node}", "1")

    def done_count(self) -> int:
        assert self._round is not None
        try:
            return int(self._round.add(f"{KEY_PREFIX}done", 0))
        except (RuntimeError, OSError, ValueError) as exc:
            self._news = self._news or News.stop(0, self._lost(exc))
            return 0

    def silent_nodes(self) -> list[int]:
        """Nodes not done whose beat has not moved for NODE_SILENCE seconds, or rdzv_timeout
        if shorter: waiting for the others at the end is the last rendezvous. (Measured by this
        node's clock: the nodes' clocks need not agree.)"""
        assert self._round is not None
        now = time.monotonic()
        if now - self._silence_checked < POLL:  # two store reads per node: not every 0.1 s
            return self._last_silent
        self._silence_checked = now
        limit = min(NODE_SILENCE, self.config.rdzv_timeout)
        silent: list[int] = []
        for node in range(self.config.num_nodes):
            if node == self.node:
                continue
            try:
                if self._round.check([f"{KEY_PREFIX}done/{node}"]):
                    continue
                beat = int(self._round.add(f"{KEY_PREFIX}beat/{node}", 0))
            except (RuntimeError, OSError, ValueError):
                continue
            seen, since = self._beats.get(node, (-1, now))
            if beat != seen:
                self._beats[node] = (beat, now)
            elif now - since > limit:
                silent.append(node)
        self._silent.update(silent)  # gone: node 0 will not wait for them to leave
        self._last_silent = silent
        return silent

    # -- leaving ---------------------------------------------------------------------------

    def close(self) -> None:
        """Leave the rendezvous. Node 0 keeps its stores up until the others have left."""
        # Only once a round completed: a node that gives up while the others are still joining
        # the first round must not close the rendezvous under them (they would only see it
        # closed). After that, closing it is how the others waiting to rejoin for a restart
        # learn that this node gave up, at once rather than after rdzv_timeout.
        if self._handler is not None and self._formed:
            if self.is_host and self._round is not None:
                self._await_leavers()
            with quiet_rendezvous_log(), contextlib.suppress(Exception):
                self._handler.shutdown()  # stops heartbeats; marks the rendezvous closed
            if not self.is_host and self._round is not None:
                with contextlib.suppress(RuntimeError, OSError, ValueError):
                    self._round.add(f"{KEY_PREFIX}left", 1)
        self._drop()

    def _await_leavers(self) -> None:
        end = time.monotonic() + LEAVE_WAIT
        with contextlib.suppress(RuntimeError, OSError, ValueError):
            expected = self.config.num_nodes - 1 - len(self._silent)
            while int(self._round.add(f"{KEY_PREFIX}left", 0)) < expected:
                if time.monotonic() > end:
                    return
                time.sleep(0.1)

    def _drop(self) -> None:
        # Dropping the last references stops node 0's servers and frees the ports, so the next
        # launch on the same endpoint starts from a clean store.
        if self._workers is not None:
            self._workers.close()
        self._handler = self._store = self._round = self._workers = None

    def _lost(self, exc: BaseException) -> str:
        return (
            f"lost contact with node 0's rendezvous store at {self.config.rdzv_endpoint} "
            f"({type(exc).__name__}: {first_line(exc)}); node 0 stopped or is unreachable"
        )
