"""How the nodes of one launch meet and agree: torch's elastic rendezvous, plus a verdict.

torch's elastic agent (driven by ``agent.py``) runs the attempt loop; this module gives it a
rendezvous handler and what nbtrain adds on top of it, all kept in the store of torch's own
rendezvous round (so nothing here is a cluster layer of its own):

1. Node 0 hosts the c10d rendezvous store on ``rdzv_endpoint``'s port; the other nodes wait
   until it answers ("waiting for node 0 at HOST:PORT"). Every node counts itself in (the
   "waiting for nodes (k of N joined)" status) while torch's ``DynamicRendezvousHandler`` forms
   the round (join, last call, heartbeats).
2. In the round's store each node publishes its launch options, and all nodes check them: node
   ranks 0..N-1 each taken once, the same num_processes, num_nodes and max_restarts everywhere.
   torch orders nodes by its own descriptors; nbtrain keeps the user's ``node_rank``, so node k
   always runs global ranks k*P .. k*P+P-1.
3. Node 0 opens a fresh worker store for the attempt on a port the OS picks and publishes the
   port; every rank gets MASTER_ADDR = the endpoint's host (reachable from every node by
   definition), MASTER_PORT = that port, and connects as a client (TORCHELASTIC_USE_AGENT_STORE,
   as under torchrun), so plain ``init_process_group`` works and a restart never reads keys left
   by the failed attempt.
4. The news: the first failure or stop of an attempt is written to the round's ``news`` key
   with compare-and-set. The first writer wins, so every node reaches the same verdict and
   reports the same root cause with its traceback; torch's agent alone would leave each node to
   find out from broken connections.
5. Every node counts its ranks' success in ``done``; the agent reports success once all nodes
   did, so a failure on a slower node still restarts or fails every node. Nodes bump a beat
   counter while they supervise, so a node whose kernel died after its ranks finished is noticed.

One node with ``max_restarts > 0`` uses the same agent with a ``LocalCoordinator``: an
in-process rendezvous handler and store, and a fresh loopback worker store per attempt.

Imported only by launches that use it: it imports torch's elastic package.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import math
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from typing import Any, Protocol

from torch.distributed import HashStore, PrefixStore, TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    api,
)
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

from nbtrain.kernel import environment
from nbtrain.kernel.config import LaunchConfig
from nbtrain.kernel.rendezvous import LOOPBACK, LocalRendezvous, open_local
from nbtrain.shared.errors import EndpointInUseError, LaunchError, WorkerError

RDZV_BACKEND = "c10d"
RUN_ID = "nbtrain"  # one store per launch (node 0 opens it fresh), so a fixed id is enough
POLL = 0.5  # seconds between looks at the peers' news in the store
COLLATERAL_GRACE = 3.0  # seconds a node with only peer-loss failures waits for the root cause
LEAVE_WAIT = 15.0  # seconds node 0 keeps its stores up for the other nodes to read the verdict
NODE_SILENCE = 60.0  # seconds without a beat after which a node that is not done counts as lost
STORE_TIMEOUT = timedelta(seconds=30)
_KEY = "nbtrain/"

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
        store = PrefixStore(f"{_KEY}round/{self._round}", self._store)
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


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, port = endpoint.rsplit(":", 1)
    return host.strip("[]"), int(port)


def route_address(host: str, port: int) -> str:
    """This machine's address on the interface that reaches ``host`` (no packet is sent)."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(sockaddr)
        return str(probe.getsockname()[0])


def is_local_address(host: str) -> bool:
    """Can this machine bind ``host``? (True exactly when it is one of its addresses.)"""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, sockaddr in infos:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((sockaddr[0], 0))
            except OSError:
                continue
            return True
    return False


def interface_of(address: str) -> str | None:
    """The network interface holding ``address`` (Linux; None elsewhere or if not found)."""
    try:
        wanted = ipaddress.ip_address(address)
        names = [name for _, name in socket.if_nameindex()]
    except (ValueError, OSError, AttributeError):
        return None
    if wanted.version == 6:
        return _ipv6_interface(wanted)
    for name in names:
        if _ipv4_of(name) == wanted:
            return name
    return None


def _ipv4_of(name: str) -> ipaddress.IPv4Address | None:
    import fcntl

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            request = struct.pack("256s", name[:15].encode())
            packed = fcntl.ioctl(probe.fileno(), siocgifaddr, request)
        except OSError:  # no IPv4 address on this interface
            return None
    return ipaddress.IPv4Address(packed[20:24])


def _ipv6_interface(wanted: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    try:
        with open("/proc/net/if_inet6") as table:
            for line in table:
                fields = line.split()
                if len(fields) >= 6 and ipaddress.IPv6Address(int(fields[0], 16)) == wanted:
                    return fields[5]
    except (OSError, ValueError):
        pass
    return None


def check_endpoint_here(config: LaunchConfig) -> str:
    """Before anything starts: the endpoint resolves, and node 0 is the machine it names.

    Returns this node's address toward the endpoint (its identity in the rendezvous).
    """
    assert config.rdzv_endpoint is not None
    host, port = split_endpoint(config.rdzv_endpoint)
    try:
        address = route_address(host, port)
    except OSError as exc:
        raise ValueError(
            f"rdzv_endpoint={config.rdzv_endpoint!r}: cannot resolve or route to {host!r} "
            f"({exc}). Pass node 0's address as every node can reach it, e.g. '10.0.0.1:{port}'."
        ) from None
    if config.node_rank == 0 and not is_local_address(host):
        raise ValueError(
            f"node_rank=0 hosts the rendezvous at rdzv_endpoint={config.rdzv_endpoint!r}, but "
            f"{host!r} is not an address of this machine ({socket.gethostname()}). Run "
            "node_rank=0 on the machine the endpoint names, or pass this machine's address."
        )
    return address


# ---------------------------------------------------------------------------------------------
# Several nodes: torch's c10d rendezvous


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
        arrived = f"{_KEY}arrived/{attempt}"
        try:
            if self._handler.is_closed():  # a previous launch's rendezvous, being closed
                raise StaleRendezvous
            self._store.add(arrived, 1)
            self._store.append(f"{_KEY}arrived_nodes/{attempt}", f"{self.node},")
            try:
                with _every(POLL, status):
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
        joined = int(self._store.add(f"{_KEY}arrived/{attempt}", 0))
        return f"waiting for nodes ({joined} of {self.config.num_nodes} joined)"

    def _timeout_text(self, attempt: int) -> str:
        with contextlib.suppress(RuntimeError, OSError, ValueError):
            raw = self._store.get(f"{_KEY}arrived_nodes/{attempt}").decode()
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
        keys = [f"{_KEY}node/{i}" for i in range(group_size)]
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
            store.set(f"{_KEY}master_port", str(opened.port))
            return self._workers
        try:
            port = int(store.get(f"{_KEY}master_port"))
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
            self._round.add(f"{_KEY}beat/{self.node}", 1)
            if self._round.check([f"{_KEY}news"]):
                self._news = News.decode(self._round.get(f"{_KEY}news"))
        except (RuntimeError, OSError, ValueError) as exc:
            self._news = News.stop(0, self._lost(exc))
        return self._news

    def publish(self, news: News) -> News:
        """Offer this node's news; return the one every node agrees on (the first written)."""
        if self._round is None:
            return news
        try:
            agreed = self._round.compare_set(f"{_KEY}news", "", news.encode())
            self._news = News.decode(agreed)
        except (RuntimeError, OSError, ValueError):
            self._news = news  # node 0 is gone: our own account is the best there is
        return self._news

    def mark_done(self) -> None:
        """This node's ranks all succeeded in this attempt."""
        assert self._round is not None
        with contextlib.suppress(RuntimeError, OSError, ValueError):
            self._round.add(f"{_KEY}done", 1)
            self._round.set(f"{_KEY}done/{self.node}", "1")

    def done_count(self) -> int:
        assert self._round is not None
        try:
            return int(self._round.add(f"{_KEY}done", 0))
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
                if self._round.check([f"{_KEY}done/{node}"]):
                    continue
                beat = int(self._round.add(f"{_KEY}beat/{node}", 0))
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
            with _quiet_rendezvous_log(), contextlib.suppress(Exception):
                self._handler.shutdown()  # stops heartbeats; marks the rendezvous closed
            if not self.is_host and self._round is not None:
                with contextlib.suppress(RuntimeError, OSError, ValueError):
                    self._round.add(f"{_KEY}left", 1)
        self._drop()

    def _await_leavers(self) -> None:
        end = time.monotonic() + LEAVE_WAIT
        with contextlib.suppress(RuntimeError, OSError, ValueError):
            expected = self.config.num_nodes - 1 - len(self._silent)
            while int(self._round.add(f"{_KEY}left", 0)) < expected:
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


@contextlib.contextmanager
def _every(seconds: float, action: Callable[[], None]) -> Iterator[None]:
    """Run ``action`` every ``seconds`` in a helper thread while the block blocks."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # a status line must never break a launch
                action()
            stop.wait(seconds)

    thread = threading.Thread(target=loop, name="nbtrain-rendezvous-status", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def _quiet_rendezvous_log() -> Iterator[None]:
    # A peer that already closed the store makes torch log a warning on shutdown; the launch
    # result says what happened, the warning would only confuse.
    log = logging.getLogger("torch.distributed.elastic.rendezvous.dynamic_rendezvous")
    previous = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(previous)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
