"""The node side of a Ray launch: one ``RankHost`` actor per rank, on the rank's node.

The actor starts the real rank (``nbtrain.rank.rank_entry``, spawned: a fresh interpreter, no
fork of Ray's threaded worker) as its child with local pipes, exactly as a local launch does
(processes.py), and hands the bytes the rank writes to the kernel when asked (``read``): Ray's
own channel carries them, so nothing of nbtrain listens on a port, and the kernel (maybe a Ray
Client outside the cluster) is never connected to. Signals from the kernel arrive as ``signal``
calls. The actor is synchronous: its methods run on the worker's main thread, the thread the
rank was started from, so the rank's PDEATHSIG fires only when the actor's process dies (then
the rank dies with it: a killed actor leaves no rank behind).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import platform
import socket
from importlib import metadata
from multiprocessing.connection import Connection, wait
from typing import cast

from nbtrain.kernel.procs import handles, processes, reaping
from nbtrain.rank import rank_entry, session_entry
from nbtrain.shared.options import StartMethod
from nbtrain.shared.specs import RankSpec

READ_SIZE = 1 << 16
READ_BUDGET = 1 << 20  # bytes per pipe per call: a chatty rank cannot make one reply huge


class RankHost:
    """One rank's process on this node (a Ray actor's class: ray.remote wraps it)."""

    def __init__(self) -> None:
        self.child: handles.RankProcess | None = None
        self.commands: Connection | None = None  # a warm rank's command pipe (its write end)

    def where(self) -> tuple[str, str, str, dict[str, str]]:
        """(Ray node id, IP, hostname) of this node, and what it has installed."""
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        return node_id, ray.util.get_node_ip_address(), socket.gethostname(), installed()

    def sees(self, paths: list[str]) -> list[bool]:
        """Whether each path exists on this node (is the kernel's folder shared with it?)."""
        return [os.path.exists(path) for path in paths]

    def free_port(self) -> int:
        """A port free on this node now (rank 0's node: the rendezvous, as torchrun picks)."""
        with socket.socket() as probe:
            probe.bind(("", 0))
            return int(probe.getsockname()[1])

    def start(self, spec: RankSpec, payload: bytes | None) -> int:
        """Start the rank; its pid on this node. ``payload`` None: a warm rank (session_main),
        which reads its commands from a local pipe that ``command`` writes."""
        target, data = rank_entry, cast(object, payload)
        if payload is None:
            reader, self.commands = multiprocessing.get_context("spawn").Pipe(duplex=False)
            target, data = session_entry, reader

        def args(rank: int, pipes: handles.RankPipes, close: tuple[int, ...]) -> tuple:
            return (spec, data, pipes.stdout_w, pipes.stderr_w, pipes.events_w)

        self.child = processes.start_ranks(StartMethod.SPAWN, [spec.info.rank], target, args)[0]
        if payload is None:
            reader.close()  # the rank's end: it has its own now
        return self.child.pid

    def command(self, data: bytes) -> None:
        """A warm rank's next command (Ray runs one caller's calls in order); a rank that died
        cannot read it: its exit is the relay's news."""
        if self.commands is not None:
            with contextlib.suppress(OSError):
                self.commands.send_bytes(data)

    def read(self, wait_s: float) -> tuple[bytes, bytes, bytes, int | None]:
        """What the rank wrote since the last call (stdout, stderr, event frames), waiting up to
        ``wait_s`` for something; and its exit code once it ended (then everything it wrote
        is in this reply or an earlier one, and it is reaped)."""
        child = self.child
        assert child is not None, "read() before start()"
        fds = child.pipes.reader_fds()
        ended = handles.has_exited(child)
        if not ended:
            wait([*fds, child.sentinel], timeout=wait_s)
            ended = handles.has_exited(child)
        # Read after the exit check: what it wrote before exiting is in the pipes by now.
        taken = [_take(fd, None if ended else READ_BUDGET) for fd in fds]
        code = reaping.reap(child) if ended else None
        return taken[0], taken[1], taken[2], code

    def signal(self, signum: int, group: bool) -> None:
        """``group``: the rank and its DataLoader workers (a stop); else the rank alone."""
        child = self.child
        if child is None or child.reaped:
            return
        if group:
            reaping.signal_rank(child, signum)
        else:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child.pid, signum)


def installed() -> dict[str, str]:
    """The versions a rank's code depends on, as this process finds them: Python's, and the
    installed distributions' of torch and nbtrain (their metadata: importing is not needed)."""
    from nbtrain._version import __version__

    found = {"Python": platform.python_version(), "nbtrain": __version__}
    with contextlib.suppress(metadata.PackageNotFoundError):
        found["torch"] = metadata.version("torch")
    return found


def _take(fd: int, budget: int | None) -> bytes:
    chunks: list[bytes] = []
    taken = 0
    while budget is None or taken < budget:
        try:
            chunk = os.read(fd, READ_SIZE)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        chunks.append(chunk)
        taken += len(chunk)
    return b"".join(chunks)
