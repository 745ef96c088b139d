"""The Ray cluster the cluster tests share, and the Jupyter kernel helpers they use.

One cluster for the folder (package scope): two nodes take ~15-45 s to start here. Ray is
optional (nbtrain[ray]): without it the modules skip themselves before asking for it."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest

if TYPE_CHECKING:
    from ray.cluster_utils import Cluster

# The kernel tests drive a real Jupyter kernel: kernelutil lives in tests/kernel.
KERNEL_TESTS = str(Path(__file__).parent.parent / "kernel")
if KERNEL_TESTS not in sys.path:
    sys.path.insert(0, KERNEL_TESTS)


@pytest.fixture(scope="package")
def cluster() -> Iterator[Cluster]:
    """A head node ("n0") and a second node ("n1"), 2 CPUs each, shared by this folder's modules
    (ended after its last test); this process connected to it."""
    environment = dict(os.environ)  # ray.init sets PYTHONBREAKPOINT (and more) in this process
    import ray

    # Its own temp dir (sessions, sockets, logs): another Ray on this machine keeps /tmp/ray.
    # Short, under /tmp: Ray's Unix socket paths must stay within 107 characters.
    folder = tempfile.mkdtemp(prefix="nbray-", dir="/tmp")
    # cluster_utils also writes the head's address to $RAY_TMPDIR/ray/ray_current_cluster:
    # by default /tmp/ray, absent on a fresh machine (the start fails) and read by another
    # cluster's `ray.init()`; ours goes into our folder (os.environ is restored below).
    os.environ["RAY_TMPDIR"] = folder
    os.makedirs(os.path.join(folder, "ray"), exist_ok=True)
    cluster = _start_cluster(folder)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        os.environ.clear()
        os.environ.update(environment)
        shutil.rmtree(folder, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _end_new_children(before: set[int]) -> None:
    """A node that failed to start keeps its processes (GCS, monitors: this process's children)
    and Cluster.shutdown() has no handle on them: left, they would run for the whole session
    and make Ray's address lookup ambiguous. End those started since ``before``, by pid."""
    for child in psutil.Process().children():
        if child.pid not in before:
            with contextlib.suppress(psutil.Error):
                child.kill()


def head_ports() -> dict[str, int]:
    """Free ports for every port a Ray head takes by default (GCS 6379 and the workers' are
    chosen by Ray itself here): the dashboard (8265), its agent (52365), Ray Client (10001).
    A cluster started with them passes beside another Ray cluster on this machine."""
    return {
        "dashboard_port": _free_port(),
        "dashboard_agent_listen_port": _free_port(),
        "ray_client_server_port": _free_port(),
    }


def _start_cluster(folder: str, tries: int = 3) -> Cluster:
    """Ray gives a raylet 30 s to register, and the raylet 15 s to see its dashboard agent's
    port files (both fixed; ray-project/ray#65983): on a loaded 2-core machine that can pass,
    so a failed start is tried again."""
    from ray.cluster_utils import Cluster

    for attempt in range(tries):
        before = {child.pid for child in psutil.Process().children()}
        cluster = Cluster()
        ports = head_ports()
        cluster.client_port = ports["ray_client_server_port"]  # the head's Ray Client (ray://)
        try:
            cluster.add_node(num_cpus=2, resources={"n0": 1}, temp_dir=folder, **ports)
            cluster.add_node(num_cpus=2, resources={"n1": 1})
            cluster.wait_for_nodes()
            return cluster
        except Exception:
            cluster.shutdown()
            _end_new_children(before)
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")
