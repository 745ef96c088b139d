"""Small helpers shared by the benchmark scripts: alternation, medians, a table."""

from __future__ import annotations

import socket
import statistics
import time
from collections.abc import Callable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ray_head_args() -> dict[str, object]:
    """A Ray head's own free ports (dashboard, its agent, Ray Client) and own temp dir (short,
    under /tmp: Unix socket paths; RAY_TMPDIR set to it), so a benchmark runs beside another Ray
    cluster."""
    import os
    import tempfile

    folder = tempfile.mkdtemp(prefix="nbray-", dir="/tmp")
    # ray.cluster_utils writes the head's address to $RAY_TMPDIR/ray/ray_current_cluster (by
    # default /tmp/ray: absent on a fresh machine, and read by another cluster's ray.init()).
    os.environ["RAY_TMPDIR"] = folder
    os.makedirs(os.path.join(folder, "ray"), exist_ok=True)
    return {
        "dashboard_port": free_port(),
        "dashboard_agent_listen_port": free_port(),
        "ray_client_server_port": free_port(),
        "temp_dir": folder,
    }


def alternate(
    cases: dict[str, Callable[[], object]], rounds: int
) -> dict[str, list[float]]:
    """Wall time of every case, once per round in turn, so drift on a shared machine hits all
    cases alike; the order rotates every round, so no case always runs first (or right after
    the same other case)."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for round_ in range(rounds):
        for name in rotation(list(cases), round_):
            case = cases[name]
            start = time.perf_counter()
            case()
            samples[name].append(time.perf_counter() - start)
    return samples


def rotation(names: list[str], round_: int) -> list[str]:
    """The order of the cases in round ``round_``: each round starts one case later."""
    shift = round_ % len(names)
    return names[shift:] + names[:shift]


def table(samples: dict[str, list[float]], baseline: str, unit: str = "s") -> str:
    base = statistics.median(samples[baseline])
    rows = [f"| case | median ({unit}) | min ({unit}) | vs {baseline} |", "|---|---|---|---|"]
    for name, values in samples.items():
        median = statistics.median(values)
        rows.append(f"| {name} | {median:.3f} | {min(values):.3f} | {median / base:.2f}x |")
    return "\n".join(rows)
