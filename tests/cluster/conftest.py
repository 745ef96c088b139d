"""The Ray cluster the cluster tests share, and the Jupyter kernel helpers they use.

One cluster for the folder (package scope): two nodes take ~15-45 s to start here. Ray is
optional (nbtrain[ray]): without it the modules skip themselves before asking for it."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
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

    cluster = _start_cluster()
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        os.environ.clear()
        os.environ.update(environment)


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


def _start_cluster(tries: int = 3) -> Cluster:
    """Ray gives a raylet 30 s to register, and the raylet 15 s to see its dashboard agent's
    port files (both fixed; ray-project/ray#65983): on a loaded 2-core machine that can pass,
    so a failed start is tried again."""
    from ray.cluster_utils import Cluster

    for attempt in range(tries):
        before = {child.pid for child in psutil.Process().children()}
        cluster = Cluster()
        cluster.client_port = _free_port()  # the head's Ray Client server (ray://)
        try:
            cluster.add_node(
                num_cpus=2, resources={"n0": 1}, ray_client_server_port=cluster.client_port
            )
            cluster.add_node(num_cpus=2, resources={"n1": 1})
            cluster.wait_for_nodes()
            return cluster
        except Exception:
            cluster.shutdown()
            _end_new_children(before)
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")
