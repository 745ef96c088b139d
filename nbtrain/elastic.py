"""Multi-node launches and restarts: torch's elastic rendezvous, nbtrain's own supervision.

Design. ``torchrun`` is two things: a rendezvous (``DynamicRendezvousHandler`` on the ``c10d``
backend: join, last call, heartbeats, dead-node detection, rounds for restarts) and an agent
(``LocalElasticAgent``) that starts the workers, waits in a blocking ``run()`` and reports failures
through error files once everything has ended. nbtrain uses the first unchanged and not the
second: the agent's workers would lose what nbtrain's own process layer gives every launch
(rank-prefixed whole-line output, the live per-rank view, results coming back, the root-cause
rule of ``outcome.py``, a kernel interrupt handled at once). So each node's kernel runs the same
``processes.start_ranks`` / ``Supervisor`` / ``Outcome`` as a single-node launch, and talks to the
other nodes only through torch's rendezvous handler and its store.

One attempt (attempt ``k`` is the ``k``-th rendezvous round this launch completes):

1. Node 0 hosts the c10d rendezvous store on ``rdzv_endpoint``'s port; the other nodes wait
   until it answers ("waiting for node 0 at HOST:PORT").
2. Every node counts itself in (the "waiting for nodes (k of N joined)" status) and calls
   ``next_rendezvous()``. In the round's store each node then publishes its launch options, and
   all nodes check them: node ranks 0..N-1 each taken once, the same num_processes,
   num_nodes and max_restarts everywhere. torchrun's c10d backend orders nodes by its own
   descriptors; nbtrain keeps the user's ``node_rank`` ("this is node 1"), so node k always gets
   global ranks k*P .. k*P+P-1.
3. Node 0 opens a fresh worker store for the attempt on a port the OS picks and publishes the
   port; every rank gets MASTER_ADDR = the endpoint's host (reachable from every node by
   definition), MASTER_PORT = that port, and connects as a client
   (TORCHELASTIC_USE_AGENT_STORE, as under torchrun), so plain ``init_process_group`` works.
   A fresh store per attempt means a restart never reads keys left by the failed attempt.
4. The first failure or stop of the attempt is written to the round's ``news`` key with
   compare-and-set: the first writer wins, so every node reaches the same verdict. A node whose
   ranks failed on their own writes at once; a node whose ranks only lost a peer (collateral)
   waits a little for the real root cause from another node first. Every node polls ``news``
   while it supervises and stops its ranks when something appears.
5. Verdict: a rank failure with restarts left -> every node stops its local ranks and joins the
   next round (the whole job restarts, as torchelastic restarts all local workers of every
   node); otherwise the node that failed raises ``WorkerError`` with the traceback, the others
   raise ``WorkerError`` naming the node and rank (and the remote traceback text).
6. On success every node waits in an exit barrier (``done``), so node 0 keeps the stores up
   until all nodes finished; non-host nodes acknowledge (``left``) before node 0 closes them.

A launch with one node and ``max_restarts > 0`` runs the same loop with a local coordinator
(no rendezvous, a fresh local store per attempt).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import math
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from typing import Any, Protocol

from .config import LaunchConfig
from .errors import EndpointInUseError, LaunchError, WorkerError
from .rendezvous import LocalRendezvous, open_local

RDZV_BACKEND = "c10d"
RUN_ID = "nbtrain"  # one store per launch (node 0 opens it fresh), so a fixed id is enough
POLL = 0.5  # seconds between looks at the peers' news in the store
COLLATERAL_GRACE = 3.0  # seconds a node with only peer-loss failures waits for the root cause
LEAVE_WAIT = 15.0  # seconds node 0 keeps its stores up for the other nodes to read the verdict
STORE_TIMEOUT = timedelta(seconds=30)
_KEY = "nbtrain/"


class RendezvousTimeout(TimeoutError):
    """Not every node arrived at the rendezvous within ``rdzv_timeout``."""


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
    def join(self, attempt: int, say: Callable[[str], None]) -> LocalRendezvous: ...

    def rank_env(self) -> dict[str, str]: ...

    def news(self) -> News | None: ...

    def publish(self, news: News) -> News: ...

    def finish(self, say: Callable[[str], None], deadline: float | None) -> News | None: ...

    def close(self) -> None: ...


class LocalCoordinator:
    """One node with restarts: no peers, a fresh local store per attempt."""

    def __init__(self, world_size: int) -> None:
        self._world_size = world_size
        self._store: LocalRendezvous | None = None
        self._news: News | None = None

    def join(self, attempt: int, say: Callable[[str], None]) -> LocalRendezvous:
        self.close()
        self._news = None
        self._store = open_local(self._world_size)
        return self._store

    def rank_env(self) -> dict[str, str]:
        return {}

    def news(self) -> News | None:
        return self._news

    def publish(self, news: News) -> News:
        self._news = self._news or news
        return self._news

    def finish(self, say: Callable[[str], None], deadline: float | None) -> News | None:
        return None

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


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
# Multi-node coordinator over torch's elastic rendezvous


class NodeCoordinator:
    """This node's side of the rendezvous: join rounds, exchange options, agree on a verdict."""

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
        self._interface = interface_of(local_address)

    def rank_env(self) -> dict[str, str]:
        """gloo finds its own address by resolving the hostname, which is often loopback
        (Debian maps it to 127.0.1.1): peers on other machines could then never connect. Point
        it at the interface that reaches node 0, unless the user chose one."""
        if self._interface is None or "GLOO_SOCKET_IFNAME" in os.environ:
            return {}
        return {"GLOO_SOCKET_IFNAME": self._interface}

    # -- joining -------------------------------------------------------------------------

    def join(self, attempt: int, say: Callable[[str], None]) -> LocalRendezvous:
        deadline = time.monotonic() + self.config.rdzv_timeout
        self._news, self._round = None, None
        while True:
            if self._store is None:
                self._connect(say, deadline)
            try:
                info = self._next_round(attempt, say)
                break
            except _StaleRendezvous as stale:
                # Before the first round, a closed or vanishing store is a previous launch's
                # rendezvous on this endpoint that node 0 is just closing (or node 0 restarting
                # its kernel): connect again, to the fresh one, until rdzv_timeout.
                if attempt > 0:
                    raise LaunchError(self._lost(stale.__cause__ or stale)) from None
                self._drop()
                time.sleep(1.0)
        self._round = info.store
        self._check_nodes(info)
        return self._worker_store(info)

    def _connect(self, say: Callable[[str], None], deadline: float) -> None:
        from torch.distributed import TCPStore
        from torch.distributed.elastic.rendezvous import RendezvousParameters
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
            C10dRendezvousBackend,
        )
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

        if self.is_host:
            store = self._open_server(TCPStore)
        else:
            self._wait_for_host(say, deadline)
            try:
                store = TCPStore(self.host, self.port, is_master=False, timeout=STORE_TIMEOUT)
            except (RuntimeError, OSError) as exc:
                raise LaunchError(self._lost(exc)) from None
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
        self._store = store
        self._handler = create_handler(store, C10dRendezvousBackend(store, RUN_ID), params)

    def _open_server(self, tcp_store: Any) -> Any:
        try:
            return tcp_store(
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

    def _wait_for_host(self, say: Callable[[str], None], deadline: float) -> None:
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

    def _next_round(self, attempt: int, say: Callable[[str], None]) -> Any:
        from torch.distributed.elastic.rendezvous import api

        status = lambda: say(self._waiting_text(attempt))  # noqa: E731
        try:
            if self._handler.is_closed():  # a previous launch's rendezvous, being closed
                raise _StaleRendezvous
            self._store.add(f"{_KEY}arrived/{attempt}", 1)
            self._store.append(f"{_KEY}arrived_nodes/{attempt}", f"{self.node},")
            with _every(POLL, status):
                return self._handler.next_rendezvous()
        except api.RendezvousTimeoutError:
            raise RendezvousTimeout(self._timeout_text(attempt)) from None
        except (api.RendezvousError, RuntimeError, OSError) as exc:
            # Closed (RendezvousClosedError, ...GracefulExitError) or gone (connection errors).
            raise _StaleRendezvous from exc

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

    def _check_nodes(self, info: Any) -> None:
        mine = {
            "node_rank": self.node,
            "num_processes": self.config.num_processes,
            "num_nodes": self.config.num_nodes,
            "max_restarts": self.config.max_restarts,
            "host": socket.gethostname(),
        }
        keys = [f"{_KEY}node/{i}" for i in range(info.world_size)]
        try:
            info.store.set(keys[info.rank], json.dumps(mine))
            info.store.wait(keys, STORE_TIMEOUT)
            nodes = [json.loads(info.store.get(key)) for key in keys]
        except (RuntimeError, OSError) as exc:
            raise LaunchError(
                "Not every node reported its launch options after the rendezvous completed "
                f"({type(exc).__name__}: {first_line(exc)}): a node was interrupted or lost "
                "at that moment. Start the launch again on every node."
            ) from None
        check_nodes(nodes, self.config)

    def _worker_store(self, info: Any) -> LocalRendezvous:
        if self._workers is not None:
            self._workers.close()
            self._workers = None
        if self.is_host:
            # Ranks on the other nodes connect to it: every interface, not just the loopback.
            opened = open_local(self.config.world_size, listen=None)
            self._workers = replace(opened, host=self.host)
            info.store.set(f"{_KEY}master_port", str(opened.port))
            return self._workers
        try:
            port = int(info.store.get(f"{_KEY}master_port"))
        except (RuntimeError, OSError) as exc:
            raise LaunchError(self._lost(exc)) from None
        return LocalRendezvous(None, self.host, port)

    # -- the verdict -----------------------------------------------------------------------

    def news(self) -> News | None:
        """What another node reported for this attempt (polled at most every POLL seconds)."""
        now = time.monotonic()
        if self._news is not None or self._round is None or now - self._polled < POLL:
            return self._news
        self._polled = now
        try:
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

    def finish(self, say: Callable[[str], None], deadline: float | None) -> News | None:
        """Exit barrier after local success; returns a peer's news if one failed meanwhile,
        or this node's own timeout (published, so the others stop too)."""
        assert self._round is not None
        total, step = self.config.num_nodes, 1
        while True:
            try:
                done = int(self._round.add(f"{_KEY}done", step))
            except (RuntimeError, OSError, ValueError) as exc:
                return News.stop(0, self._lost(exc))
            step = 0
            if done >= total:
                return None
            self._polled = 0.0
            news = self.news()
            if news is not None:
                return news
            if deadline is not None and time.monotonic() > deadline:
                return self.publish(News.stop(self.node, "timeout"))
            say(f"finished; waiting for the other nodes ({done} of {total} done)")
            time.sleep(POLL)

    # -- leaving ---------------------------------------------------------------------------

    def close(self) -> None:
        """Leave the rendezvous. Node 0 keeps its stores up until the others have left."""
        # Only after a completed round: a node that gives up while others are still joining
        # must not close the rendezvous under them (no heartbeats run before a round completes).
        if self._handler is not None and self._round is not None:
            if self.is_host:
                self._await_leavers()
            with _quiet_rendezvous_log(), contextlib.suppress(Exception):
                self._handler.shutdown()  # stops heartbeats; marks the rendezvous closed
            if not self.is_host:
                with contextlib.suppress(RuntimeError, OSError, ValueError):
                    self._round.add(f"{_KEY}left", 1)
        self._drop()

    def _await_leavers(self) -> None:
        end = time.monotonic() + LEAVE_WAIT
        with contextlib.suppress(RuntimeError, OSError, ValueError):
            while int(self._round.add(f"{_KEY}left", 0)) < self.config.num_nodes - 1:
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


class _StaleRendezvous(Exception):
    pass


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
