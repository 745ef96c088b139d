"""Two nodes in two network namespaces joined by a veth pair: the rendezvous, the ranks' store
and gloo all cross a real network interface (not loopback). Needs root and iproute2."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from .conftest import Cluster, free_port, launch

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


@dataclass
class Link:
    namespaces: tuple[str, str]
    addresses: tuple[str, str]
    devices: tuple[str, str]

    def rx_bytes(self, side: int) -> int:
        path = f"/sys/class/net/{self.devices[side]}/statistics/rx_bytes"
        out = subprocess.run(
            ["ip", "netns", "exec", self.namespaces[side], "cat", path],
            capture_output=True,
            text=True,
            check=True,
        )
        return int(out.stdout)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def veth() -> Iterator[Link]:
    if shutil.which("ip") is None:
        pytest.skip("iproute2's `ip` is not installed (Debian: apt-get install iproute2)")
    if os.geteuid() != 0:
        pytest.skip("creating network namespaces needs root")
    tag = f"{os.getpid() % 10000}{random.randrange(1000)}"
    namespaces = (f"nbt{tag}a", f"nbt{tag}b")
    devices = (f"nbt{tag}x", f"nbt{tag}y")
    subnet = f"10.213.{random.randrange(1, 254)}"
    addresses = (f"{subnet}.1", f"{subnet}.2")
    created: list[str] = []
    try:
        for namespace in namespaces:
            _ip("netns", "add", namespace)
            created.append(namespace)
        _ip("link", "add", devices[0], "type", "veth", "peer", "name", devices[1])
        for namespace, device, address in zip(namespaces, devices, addresses, strict=True):
            _ip("link", "set", device, "netns", namespace)
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", device)
            _ip("-n", namespace, "link", "set", device, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as exc:
        for namespace in created:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        pytest.skip(f"cannot create network namespaces here: {exc.stderr.strip()}")
    try:
        yield Link(namespaces, addresses, devices)
    finally:
        for namespace in namespaces:  # deleting a namespace deletes its end of the veth pair
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def test_two_nodes_across_a_veth_pair(cluster: Cluster, veth: Link):
    endpoint = f"{veth.addresses[0]}:{free_port()}"
    before = veth.rx_bytes(1)
    for node in (0, 1):
        prefix = ["ip", "netns", "exec", veth.namespaces[node]]
        cluster.start(
            node,
            [launch("identity", endpoint, node), launch("train", endpoint, node, args=(5,))],
            prefix=prefix,
        )
    (ident0, train0), (ident1, train1) = cluster.wait_all(timeout=180)
    assert "value" in ident0 and "value" in ident1, cluster.describe()
    ranks = ident0["value"] + ident1["value"]
    assert [r["env"]["RANK"] for r in ranks] == ["0", "1", "2", "3"]
    assert {r["env"]["MASTER_ADDR"] for r in ranks} == {veth.addresses[0]}
    assert [r["sum"] for r in ranks] == [10.0] * 4
    params = train0["value"] + train1["value"]
    assert all(p == params[0] for p in params)
    # Node 1 reached node 0 only through its veth end: traffic really crossed the interface.
    assert veth.rx_bytes(1) - before > 10_000
