"""Kernel side of a Ray launch's channel: the ranks' bytes, moved by Ray, into local pipes.

Each rank gets the same three local pipes as a rank of this machine (``RankPipes``), so the
group's Supervisor reads a remote rank like any other. One relay thread keeps one ``read`` call
outstanding per rank actor (a long poll through Ray: no socket to the kernel) and writes what
comes back into that rank's pipes; the rank's exit code (or its actor's or node's death) ends
its pipes, then its handle (``RemoteRank``) reports the exit, in that order, so everything the
rank wrote is read before its exit is seen.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from dataclasses import dataclass
from typing import Any

from nbtrain.kernel.procs import handles

READ_WAIT = 0.1  # seconds a node's read call waits for output: the kernel's latency for bytes
JOIN_WAIT = 10.0  # seconds to wait for a stopped rank's exit before calling it killed
LOST = -int(getattr(signal, "SIGKILL", signal.SIGTERM))  # a rank whose actor or node died


@dataclass(frozen=True)
class Node:
    """Where a rank runs: its Ray node, that node's IP and hostname."""

    node_id: str
    ip: str
    hostname: str

    def describe(self) -> str:
        return f"{self.hostname} ({self.ip}, Ray node {self.node_id[:12]})"


class RemoteRank:
    """A rank's process handle (handles.RemoteProcess), answered by its actor."""

    def __init__(self, actor: Any, node: Node) -> None:
        self.actor: Any = actor  # None once the launch is closed (RayRanks.close)
        self.node = node
        self.pid: int | None = None
        self.exitcode: int | None = None
        self.sentinel, self._sentinel_w = os.pipe()
        self._ended = threading.Event()

    def send(self, signum: int, *, group: bool) -> None:
        actor = self.actor
        if self.exitcode is None and actor is not None:
            # Not waited for: a dead actor's error is the relay's news, not the sender's.
            actor.signal.remote(signum, group)

    def ended(self, code: int) -> None:
        if self._ended.is_set():
            return
        self.exitcode = code
        os.close(self._sentinel_w)
        self._ended.set()

    def join(self) -> None:
        if not self._ended.wait(JOIN_WAIT):
            self.ended(LOST)  # its node does not answer: killed with its actor at close

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.sentinel)


def local_pipes() -> handles.RankPipes:
    """A rank's three pipes on this machine: the relay writes, the Supervisor reads."""
    pipes = handles.RankPipes.create(multiprocessing.get_context())
    for fd in pipes.reader_fds():
        os.set_blocking(fd, False)
    return pipes


class Relay:
    """The one thread that moves every rank's bytes from its actor to its local pipes."""

    def __init__(self, ranks: list[handles.RankProcess], handles: dict[int, RemoteRank]) -> None:
        self._ranks = {rp.rank: rp for rp in ranks}
        self._handles = handles
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nbtrain-ray-relay", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=JOIN_WAIT)

    def _run(self) -> None:
        import ray

        pending: dict[Any, int] = {}
        for rank in self._ranks:
            self._ask(pending, rank)
        while pending and not self._stop.is_set():
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.2)
            if ready:  # and whatever else is ready by now
                ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
            for ref in ready:
                rank = pending.pop(ref)
                code = self._deliver(rank, ref)
                if code is None:
                    self._ask(pending, rank)
                else:
                    self._end(rank, code)
        for rank in pending.values():  # closing: the actors are being killed
            self._end(rank, LOST)

    def _ask(self, pending: dict[Any, int], rank: int) -> None:
        """Keep one read outstanding for the rank, unless the launch has let go of its actor
        (RayRanks.close, after this thread did not end within JOIN_WAIT): then it is lost."""
        actor = self._handles[rank].actor
        if actor is None:
            self._end(rank, LOST)
        else:
            pending[actor.read.remote(READ_WAIT)] = rank

    def _deliver(self, rank: int, ref: Any) -> int | None:
        import ray

        pipes = self._ranks[rank].pipes
        try:
            out, err, events, code = ray.get(ref)
        except ray.exceptions.RayError as exc:
            node = self._handles[rank].node.describe()
            line = (
                f"[nbtrain] rank {rank} was lost with its node {node}: its Ray actor died "
                f"({type(exc).__name__}: {_first_line(exc)})\n"
            )
            _write(pipes.stderr_w.fileno(), line.encode())
            return LOST
        _write(pipes.stdout_w.fileno(), out)
        _write(pipes.stderr_w.fileno(), err)
        _write(pipes.events_w.fileno(), events)
        return code

    def _end(self, rank: int, code: int) -> None:
        self._ranks[rank].pipes.close_writers()
        self._handles[rank].ended(code)


def _write(fd: int, data: bytes) -> None:
    """All of ``data`` (blocking: the Supervisor reads the other end); a closed reader (the
    launch is over) drops it."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except (BrokenPipeError, OSError):
            return


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else ""
