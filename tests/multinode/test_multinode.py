"""Two "nodes" on one machine: two launcher processes meeting through torch's elastic
rendezvous on loopback, each running two real gloo ranks."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import torch

from nbtrain import notebook_launcher

from . import jobs  # the node processes import the same module as top-level `jobs`
from .conftest import Cluster, launch, wait_for_text

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

STEPS = 10


def test_two_nodes_form_one_world_and_train_like_one_node(cluster: Cluster, endpoint: str):
    """Ranks 0-3 across two nodes; a second launch on the same endpoint works too."""
    for node in (0, 1):
        cluster.start(
            node,
            [launch("identity", endpoint, node), launch("train", endpoint, node, args=(STEPS,))],
        )
    (ident0, train0), (ident1, train1) = cluster.wait_all(timeout=150)
    assert "value" in ident0 and "value" in ident1, cluster.describe()
    envs = [rank["env"] for rank in ident0["value"] + ident1["value"]]
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"]
    assert [e["GROUP_RANK"] for e in envs] == ["0", "0", "1", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"4"}
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
    assert {e["TORCHELASTIC_RESTART_COUNT"] for e in envs} == {"0"}
    assert [rank["sum"] for rank in ident0["value"] + ident1["value"]] == [10.0] * 4

    single = notebook_launcher(jobs.train, (STEPS,), num_processes=4, progress="off", output="none")
    trained = train0["value"] + train1["value"]
    assert len(trained) == 4
    for params in trained:
        assert torch.allclose(torch.tensor(params), torch.tensor(single), atol=1e-6)
    assert "waiting for nodes" in cluster.nodes[0].stderr


@pytest.mark.parametrize("early", [0, 1])
def test_late_node_still_joins_while_the_early_one_waits(
    cluster: Cluster, endpoint: str, early: int
):
    late = 1 - early
    first = cluster.start(early, [launch("identity", endpoint, early)])
    waiting = "waiting for nodes (1 of 2 joined)" if early == 0 else "waiting for node 0 at"
    wait_for_text(first, waiting, timeout=60)
    time.sleep(3.0)
    assert first.process.poll() is None, "the early node must keep waiting"
    cluster.start(late, [launch("identity", endpoint, late)])
    results = cluster.wait_all(timeout=120)
    by_node = {node.rank: result[0] for node, result in zip(cluster.nodes, results, strict=True)}
    for node in (0, 1):
        assert "value" in by_node[node], cluster.describe()
        assert [r["sum"] for r in by_node[node]["value"]] == [10.0, 10.0]
    assert waiting in first.stderr


@pytest.mark.parametrize("present", [0, 1])
def test_node_that_never_comes_ends_with_rendezvous_timeout(
    cluster: Cluster, endpoint: str, present: int
):
    started = time.monotonic()
    node = cluster.start(present, [launch("identity", endpoint, present, rdzv_timeout=3)])
    (result,) = node.wait(timeout=60)
    assert time.monotonic() - started < 45
    assert result["error"] == "RendezvousTimeout", node.describe()
    assert "TimeoutError" in result["mro"]
    assert "rdzv_timeout=3s" in result["text"]
    if present == 0:
        assert "1 of 2 nodes joined (node 0); missing: node 1" in result["text"]
        assert "waiting for nodes (1 of 2 joined)" in node.stderr
    else:
        assert "Node 0 never opened the rendezvous at " + endpoint in result["text"]
        assert "waiting for node 0 at " + endpoint in node.stderr


@pytest.mark.parametrize("failing", [1, 3])
def test_rank_crash_on_one_node_stops_both(cluster: Cluster, endpoint: str, failing: int):
    for node in (0, 1):
        cluster.start(node, [launch("crash_on", endpoint, node, args=(failing,))])
    started = time.monotonic()
    (r0,), (r1,) = cluster.wait_all(timeout=120)
    assert time.monotonic() - started < 90
    failing_node = failing // 2
    for result in (r0, r1):
        assert result["error"] == "WorkerError", cluster.describe()
        assert (result["rank"], result["node"]) == (failing, failing_node)
        assert result["type_name"] == "ValueError"
        assert f"rank {failing}" in result["text"] and f"boom on rank {failing}" in result["text"]
        assert f"boom on rank {failing}" in result["traceback"]  # the remote traceback travels
    here = (r0, r1)[failing_node]
    assert "in crash_on" in here["traceback"]
    if failing_node == 1:
        assert f"rank {failing} (node 1) failed with ValueError" in r0["text"]
    # Each node's view shows its own ranks: the failed one there, stopped ones elsewhere.
    assert (
        f"[rank {failing}] failed: ValueError: boom on rank {failing}"
        in cluster.nodes[failing_node].stdout
    )
    other = cluster.nodes[1 - failing_node].stdout
    assert "failed: ValueError" not in other and "stopped" in other


def test_max_restarts_recovers_from_a_one_time_failure(
    cluster: Cluster, endpoint: str, tmp_path: Path
):
    marker = str(tmp_path / "failed-once")
    for node in (0, 1):
        cluster.start(node, [launch("fail_once", endpoint, node, args=(marker, 2), max_restarts=1)])
    (r0,), (r1,) = cluster.wait_all(timeout=150)
    assert "value" in r0 and "value" in r1, cluster.describe()
    envs = [rank["env"] for rank in r0["value"] + r1["value"]]
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert {e["TORCHELASTIC_RESTART_COUNT"] for e in envs} == {"1"}
    assert Path(marker).exists()
    for node in cluster.nodes:
        assert "restarting every rank (restart 1 of 1)" in node.stderr, cluster.describe()
        assert "transient failure on the first attempt" in node.stderr


def test_different_num_processes_is_refused_on_every_node(cluster: Cluster, endpoint: str):
    cluster.start(0, [launch("identity", endpoint, 0, num_processes=2)])
    cluster.start(1, [launch("identity", endpoint, 1, num_processes=1)])
    (r0,), (r1,) = cluster.wait_all(timeout=120)
    for result in (r0, r1):
        assert result["error"] == "ValueError", cluster.describe()
        assert "different num_processes (node 0: 2, node 1: 1)" in result["text"]


def test_interrupting_one_node_stops_the_other(cluster: Cluster, endpoint: str):
    for node in (0, 1):
        cluster.start(node, [launch("crash_on", endpoint, node, args=(-1,))])  # nobody fails
    for node in cluster.nodes:
        wait_for_text(node, "all 2 nodes joined", timeout=90)
    time.sleep(1.0)
    cluster.nodes[1].process.send_signal(signal.SIGINT)
    (r0,), (r1,) = cluster.wait_all(timeout=60)
    assert r1["error"] == "KeyboardInterrupt", cluster.describe()
    assert r0["error"] == "LaunchError"
    assert "node 1 stopped the run (interrupted)" in r0["text"]


def test_only_peer_loss_failures_still_fail_on_every_node(cluster: Cluster, endpoint: str):
    """No rank failed 'on its own': the launch must still fail everywhere, never return."""
    for node in (0, 1):
        cluster.start(node, [launch("lost_peer_everywhere", endpoint, node)])
    (r0,), (r1,) = cluster.wait_all(timeout=120)
    for result in (r0, r1):
        assert result["error"] == "WorkerError", cluster.describe()
        assert "Connection closed by peer" in result["text"]
    assert (r0["rank"], r0["node"]) == (r1["rank"], r1["node"])  # one verdict for all nodes


def test_timeout_on_one_node_stops_both(cluster: Cluster, endpoint: str):
    cluster.start(0, [launch("crash_on", endpoint, 0, args=(-1,), timeout=4)])  # ranks sleep
    cluster.start(1, [launch("crash_on", endpoint, 1, args=(-1,))])
    (r0,), (r1,) = cluster.wait_all(timeout=120)
    assert r0["error"] == "TimeoutError", cluster.describe()
    assert "timeout=4" in r0["text"]
    assert r1["error"] == "TimeoutError"
    assert "Node 0 reached its notebook_launcher(timeout=...) and stopped the run" in r1["text"]


def test_a_node_lost_while_the_others_wait_at_the_end_is_noticed(cluster: Cluster, endpoint: str):
    """Node 1's kernel dies (its ranks die with it) after node 0's ranks finished: node 0 must
    not wait for it forever (its silence counts once rdzv_timeout passed)."""
    first = cluster.start(0, [launch("only_node_zero_finishes", endpoint, 0, rdzv_timeout=5)])
    second = cluster.start(1, [launch("only_node_zero_finishes", endpoint, 1, rdzv_timeout=5)])
    wait_for_text(first, "finished; waiting for the other nodes (1 of 2 done)", timeout=90)
    second.process.kill()
    second.process.wait()
    (result,) = first.wait(timeout=60)
    assert result["error"] == "LaunchError", first.describe()
    assert "node 1 stopped responding before its ranks finished" in result["text"]


def test_a_node_that_gives_up_while_rejoining_ends_the_others_at_once(
    cluster: Cluster, endpoint: str, tmp_path: Path
):
    """After a failure both nodes rejoin for the restart; one is interrupted meanwhile. The
    other must not wait out rdzv_timeout for it: the first failure is the verdict."""
    marker = str(tmp_path / "failed-once")
    for node in (0, 1):
        cluster.start(
            node,
            [launch("fail_once", endpoint, node, args=(marker, 2), max_restarts=1,
                    rdzv_timeout=120)],
        )
    wait_for_text(cluster.nodes[1], "restarting every rank", timeout=90)
    cluster.nodes[1].process.send_signal(signal.SIGINT)
    started = time.monotonic()
    (r0,), (r1,) = cluster.wait_all(timeout=100)
    assert time.monotonic() - started < 60, "node 0 waited for a node that had left"
    assert r1["error"] == "KeyboardInterrupt", cluster.describe()
    assert r0["error"] in ("WorkerError", "LaunchError"), cluster.describe()
    assert "transient failure on the first attempt" in r0["text"] or "interrupted" in r0["text"]
