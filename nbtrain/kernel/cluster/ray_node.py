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
import os
import socket
from multiprocessing.connection import wait

from nbtrain.kernel import processes
from nbtrain.rank import rank_entry
from nbtrain.shared.options import StartMethod
from nbtrain.shared.specs import RankSpec

READ_SIZE = 1 << 16
READ_BUDGET = 1 << 20  # bytes per pipe per call: a chatty rank cannot make one reply huge


class RankHost:
    """One rank's process on this node (a Ray actor's class: ray.remote wraps it)."""

    def __init__(self) -> None:
        self.child: processes.RankProcess | None = None

    def where(self) -> tuple[str, str, str]:
        """(Ray node id, IP, hostname) of this node."""
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        return node_id, ray.util.get_node_ip_address(), socket.gethostname()

    def free_port(self) -> int:
        """A port free on this node now (rank 0's node: the rendezvous, as torchrun picks)."""
        with socket.socket() as probe:
            probe.bind(("", 0))
            return int(probe.getsockname()[1])

    def start(self, spec: RankSpec, payload: bytes) -> int:
        """Start the rank; its pid on this node."""

        def args(rank: int, pipes: processes.RankPipes, close: tuple[int, ...]) -> tuple:
            return (spec, payload, pipes.stdout_w, pipes.stderr_w, pipes.events_w)

        self.child = processes.start_ranks(StartMethod.SPAWN, [spec.info.rank], rank_entry, args)[0]
        return self.child.pid

    def read(self, wait_s: float) -> tuple[bytes, bytes, bytes, int | None]:
        """What the rank wrote since the last call (stdout, stderr, event frames), waiting up to
        ``wait_s`` for something; and its exit code once it ended (then everything it wrote
        is in this reply or an earlier one, and it is reaped)."""
        child = self.child
        assert child is not None, "read() before start()"
        fds = child.pipes.reader_fds()
        ended = processes.has_exited(child)
        if not ended:
            wait([*fds, child.sentinel], timeout=wait_s)
            ended = processes.has_exited(child)
        # Read after the exit check: what it wrote before exiting is in the pipes by now.
        taken = [_take(fd, None if ended else READ_BUDGET) for fd in fds]
        code = processes.reap(child) if ended else None
        return taken[0], taken[1], taken[2], code

    def signal(self, signum: int, group: bool) -> None:
        """``group``: the rank and its DataLoader workers (a stop); else the rank alone."""
        child = self.child
        if child is None or child.reaped:
            return
        if group:
            processes.signal_rank(child, signum)
        else:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child.pid, signum)


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
