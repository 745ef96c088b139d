"""Ranks on a real two-node Ray cluster on this machine (ray.cluster_utils.Cluster: two raylets,
each its own node with its own resources). The cluster is the folder's (conftest.py), this
module's tests last: the fault tests at its end take a node away."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import cloudpickle
import pytest
import stopresume
from stopresume import Seen, interrupt_when

import nbtrain
from nbtrain import RayCluster, WorkerError
from nbtrain.kernel.launch.cluster.checks import check_shared
from nbtrain.kernel.launch.cluster.relay import Node

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.state import list_actors, list_placement_groups  # noqa: E402

SPREAD = RayCluster(placement="spread")

# The nodes' workers do not have tests/ on their path: this module's functions travel by value,
# as a notebook's do.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(stopresume)


@pytest.fixture(scope="module")
def nodes(cluster: Cluster) -> dict[str, str]:
    """Each node's custom resource name -> its Ray node id."""
    return {
        name: node["NodeID"]
        for node in ray.nodes()
        for name in ("n0", "n1")
        if name in node["Resources"] and node["Alive"]
    }


def _nothing_left() -> None:
    """No actor alive, no placement group kept, whatever the launch's outcome."""
    deadline = time.monotonic() + 10
    address = ray.get_runtime_context().gcs_address  # not "auto": other clusters may run here
    while True:
        actors = [a.actor_id for a in list_actors(address=address,
                                                  filters=[("state", "!=", "DEAD")])]
        groups = [g.placement_group_id for g in list_placement_groups(address=address)
                  if g.state != "REMOVED"]
        if (not actors and not groups) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not actors, f"actors left alive: {actors}"
    assert not groups, f"placement groups left: {groups}"
    # And their CPUs free again: the next test's "spread" must find room on both nodes.
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources().get("CPU", 0):
        if time.monotonic() > deadline:
            raise AssertionError(f"CPUs still held: {ray.available_resources()}")
        time.sleep(0.2)


def _world(data=None) -> dict:
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    dist.destroy_process_group()
    print(f"rank {os.environ['RANK']} says hello")
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
             "MASTER_PORT", "NBTRAIN_RAY_NODE_ID")
    seen = None if data is None else data.sum().item()
    return {"sum": total.item(), "data": seen, **{name: os.environ[name] for name in names}}


def test_ranks_on_both_nodes_form_one_world(nodes, capsys) -> None:
    import torch

    data = torch.ones(4_000_000)  # 16 MB: put once in Ray's object store, read on each node
    results = nbtrain.notebook_launcher(
        _world, (data,), num_processes=2, cluster=SPREAD, return_all=True, progress="text"
    )
    assert [r["sum"] for r in results] == [3.0, 3.0]  # a gloo all_reduce across the nodes
    assert [r["data"] for r in results] == [4_000_000.0, 4_000_000.0]
    assert {r["NBTRAIN_RAY_NODE_ID"] for r in results} == set(nodes.values())
    assert [(r["RANK"], r["LOCAL_RANK"], r["NODE_RANK"]) for r in results] == [
        ("0", "0", "0"), ("1", "0", "1")
    ]
    assert {(r["WORLD_SIZE"], r["LOCAL_WORLD_SIZE"]) for r in results} == {("2", "1")}
    node0_ip = next(n["NodeManagerAddress"] for n in ray.nodes()
                    if n["NodeID"] == results[0]["NBTRAIN_RAY_NODE_ID"])
    assert {r["MASTER_ADDR"] for r in results} == {node0_ip}
    out = capsys.readouterr().out
    assert "[rank 0] rank 0 says hello" in out and "[rank 1] rank 1 says hello" in out
    _nothing_left()


def _fail_on_n1(node1: str) -> int:
    import os
    import time

    if os.environ["NBTRAIN_RAY_NODE_ID"] == node1:
        raise ValueError("bad batch on the second node")
    time.sleep(60)  # the peer: stopped once the failure is known
    return 0


def test_failure_on_second_node_names_rank_and_node(nodes) -> None:
    started = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        nbtrain.notebook_launcher(
            _fail_on_n1, (nodes["n1"],), num_processes=2, cluster=SPREAD, progress="off"
        )
    error = caught.value
    # One rank per node, numbered node by node (Ray picks which node holds bundle 0).
    assert error.node == error.rank
    assert "ValueError: bad batch on the second node" in str(error)
    assert nodes["n1"][:12] in str(error)  # the node, named
    assert "bad batch" in error.remote_traceback
    assert time.monotonic() - started < 50  # the sleeping peer was stopped, not waited for
    _nothing_left()


def _sleep_forever(marks: str) -> None:
    import os
    import time

    Path(marks, f"{os.environ['RANK']}.pid").write_text(str(os.getpid()))
    time.sleep(120)


def test_interrupt_stops_every_rank_on_every_node(nodes, tmp_path) -> None:
    pressed: list[float] = []
    seen: list[str] = []  # at the press: the SIGINT handler and where the main thread was
    ended = threading.Event()

    def interrupt_once_started() -> None:
        deadline = time.monotonic() + 90
        while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        if ended.is_set():  # the launch is over: a press now would hit pytest itself
            return
        pressed.append(time.monotonic())
        main = sys._current_frames()[threading.main_thread().ident or 0]
        seen.append(f"handler {signal.getsignal(signal.SIGINT)!r}, main thread at:\n"
                    + "".join(traceback.format_stack(main)[-6:]))
        os.kill(os.getpid(), signal.SIGINT)  # once: a lost press fails the test

    pressing = threading.Thread(target=interrupt_once_started)
    pressing.start()
    interrupted = False
    try:
        nbtrain.notebook_launcher(
            _sleep_forever, (str(tmp_path),), num_processes=2, cluster=SPREAD, progress="off",
        )
    except KeyboardInterrupt:
        interrupted = True
    finally:
        stopped_at = time.monotonic()
        ended.set()
        pressing.join()
    assert interrupted and pressed, f"the Ctrl-C was not heard: {seen}"
    # SIGTERM through each rank's actor; SIGKILL after GRACE (2 s); generous under load.
    assert stopped_at - pressed[0] < 8
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 2
    for pid in pids:  # the ranks themselves (this machine holds both "nodes")
        while _alive(pid) and time.monotonic() - stopped_at < 5:
            time.sleep(0.1)
        assert not _alive(pid), f"rank process {pid} still running after the interrupt"
    _nothing_left()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stuck_on_a_line() -> None:
    import time

    time.sleep(600)


def test_timeout_names_the_line_each_rank_was_stuck_on(nodes) -> None:
    """The stack request travels to each node as a signal call, the dump back as stderr."""
    with pytest.raises(TimeoutError) as caught:
        nbtrain.notebook_launcher(
            _stuck_on_a_line, num_processes=2, cluster=SPREAD, timeout=25, progress="off"
        )
    line = _stuck_on_a_line.__code__.co_firstlineno + 3
    text = str(caught.value)
    for rank in (0, 1):
        assert f"rank {rank} was in " in text
        # (a function sent by value, as a notebook's: its file is cloudpickle's)
        assert f"{line} in _stuck_on_a_line" in text
    _nothing_left()


def test_more_ranks_than_the_cluster_has_fails_before_start(nodes) -> None:
    with pytest.raises(ValueError, match=r"needs 5 CPUs, but the Ray cluster has 4 in all"):
        nbtrain.notebook_launcher(_world, num_processes=5, cluster="ray")
    with pytest.raises(ValueError, match=r"gpus_per_rank=1: the Ray cluster has no GPUs"):
        nbtrain.notebook_launcher(_world, num_processes=2, cluster=RayCluster(gpus_per_rank=1))
    with pytest.raises(ValueError, match=r"start_method=.fork. does not apply to cluster="):
        nbtrain.notebook_launcher(_world, num_processes=2, cluster="ray", start_method="fork")
    _nothing_left()


def test_no_room_now_fails_after_a_short_wait(nodes) -> None:
    from ray.util.placement_group import placement_group, remove_placement_group

    busy = placement_group([{"CPU": 2}], strategy="PACK")  # another job holds one node
    assert busy.wait(timeout_seconds=30)
    try:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=r"no room for num_processes=3 .* free now: 2 CPU"):
            nbtrain.notebook_launcher(
                _world, num_processes=3, cluster=RayCluster(placement_wait=1), progress="off"
            )
        assert time.monotonic() - started < 15
    finally:
        remove_placement_group(busy)
    _nothing_left()


def test_a_node_with_other_versions_is_named_before_any_rank_starts(nodes, tmp_path) -> None:
    """runtime_env reaches the actors: here it puts a torch 0.0.1 distribution first on their
    path (what `pip list` would show on a node with another torch)."""
    info = tmp_path / "site" / "torch-0.0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 0.0.1\n")
    path = f"{info.parent}:{os.environ.get('PYTHONPATH', '')}"
    other = RayCluster(placement="spread", runtime_env={"env_vars": {"PYTHONPATH": path}})
    with pytest.raises(RuntimeError) as caught:
        nbtrain.notebook_launcher(_world, num_processes=2, cluster=other, progress="off")
    text = str(caught.value)
    from importlib.metadata import version

    assert f"this kernel: torch {version('torch')}" in text
    assert nodes["n0"][:12] in text and nodes["n1"][:12] in text
    assert text.count("torch 0.0.1") == 2
    assert f"pip install torch=={version('torch')}" in text and "runtime_env=" in text
    _nothing_left()


def test_checkpoint_paths_a_node_does_not_see_are_named() -> None:
    """The message when storage is not shared (one machine shares all: the function alone)."""
    here, there = Node("a" * 20, "10.0.0.1", "head"), Node("b" * 20, "10.0.0.2", "gpu-7")
    paths = ["/runs/x/checkpoints/.nbtrain-shared-123", "/runs/x/checkpoints/checkpoint_3"]
    check_shared(paths, {here: [True, True]})
    with pytest.raises(RuntimeError) as caught:
        check_shared(paths, {here: [True, True], there: [False, False]})
    text = str(caught.value)
    assert "storage that this kernel and every node share" in text
    assert "gpu-7 (10.0.0.2, Ray node bbbbbbbbbbbb) does not see '/runs/x/checkpoints', " \
        "'/runs/x/checkpoints/checkpoint_3'" in text
    assert "head" not in text and "Pass project_dir=" in text


STEPS = 120  # 2.4 s of sleeping per run: room for a stop or a lost node mid-run


def _train(marker: str | None = None) -> dict:
    import time

    import torch

    from nbtrain import Accelerator

    accelerator = Accelerator()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.ones(2 * STEPS, 4))  # STEPS batches per rank
    loader = torch.utils.data.DataLoader(data, batch_size=1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    seen = Seen()
    accelerator.register_for_checkpointing(seen)  # restored here on resume
    first = seen.batches
    for (x,) in loader:  # a resumed loader goes on after the checkpoint's batch
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        seen.batches += 1
        if marker and accelerator.is_main_process and seen.batches == 5:
            Path(marker).write_text("training")
        time.sleep(0.02)
    return {"first": first, "batches": seen.batches, "node": os.environ["NBTRAIN_RAY_NODE_ID"]}


def test_interrupt_saves_a_checkpoint_and_resume_continues_across_nodes(nodes, tmp_path) -> None:
    marker = tmp_path / "training"
    project = tmp_path / "project"
    thread = interrupt_when(marker, 0.3)
    try:
        with pytest.raises(KeyboardInterrupt) as caught:
            nbtrain.notebook_launcher(
                _train, (str(marker),), num_processes=2, cluster=SPREAD, progress="off",
                on_interrupt="checkpoint", project_dir=project,
            )
    finally:
        thread.join()
    saved = project / "checkpoints" / "checkpoint_0"
    assert f"saved in {saved}" in str(caught.value)
    assert not list((project / "checkpoints").glob(".nbtrain-shared-*"))  # the check's marker
    _nothing_left()
    results = nbtrain.notebook_launcher(
        _train, num_processes=2, cluster=SPREAD, progress="off", resume=True,
        project_dir=project, return_all=True,
    )
    assert {r["node"] for r in results} == set(nodes.values())
    firsts = {r["first"] for r in results}
    assert len(firsts) == 1 and 5 <= firsts.pop() < STEPS  # both ranks went on from step n
    assert [r["batches"] for r in results] == [STEPS, STEPS]
    _nothing_left()


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size()  # the world an earlier cell formed


def test_warm_ranks_across_nodes(nodes, tmp_path) -> None:
    """State kept across cells (a gloo world too), cells on some ranks, pull/push (inline
    through Ray), a failure on one rank keeps the state, an interrupt keeps it too; stop()
    leaves nothing."""
    import torch

    ranks = nbtrain.start_ranks(2, cluster=SPREAD, progress="off")
    try:
        assert "on a Ray cluster" in repr(ranks)
        ranks.run_cell(
            "import os, torch, torch.distributed as dist\n"
            "x = int(os.environ['RANK']) + 1\n"
            "dist.init_process_group('gloo')\n"
        )
        assert set(ranks.pull("os.environ['NBTRAIN_RAY_NODE_ID']")) == set(nodes.values())
        ranks.push(big=torch.ones(1_000_000))  # 4 MB: no /dev/shm shared with the nodes
        assert ranks.pull("x * big.sum().item()") == [1e6, 2e6]
        ranks.run_cell("total = torch.tensor([float(x)])\ndist.all_reduce(total)")
        assert ranks.pull("total.item()") == [3.0, 3.0]  # across the nodes, in the kept world
        assert ranks.run(_world_size) == 2
        with pytest.raises(WorkerError, match="only on the second rank"):
            ranks.run_cell("if x == 2:\n    raise ValueError('only on the second rank')")
        ranks.run_cell("x = 10", ranks=[1])  # %%ranks 1
        assert ranks.pull("x") == [1, 10]
        marker = tmp_path / "sleeping"
        thread = interrupt_when(marker, 0.3)
        try:
            with pytest.raises(KeyboardInterrupt, match="state is kept"):
                ranks.run_cell(
                    f"import pathlib, time\npathlib.Path({str(marker)!r}).touch()\n"
                    "time.sleep(60)"
                )
        finally:
            thread.join()
        assert ranks.pull("x") == [1, 10]
    finally:
        ranks.stop()
    _nothing_left()


# Kept before test_bad_input_without_ray_or_connection: run after that one (a fresh interpreter
# that imports ray), the client's server process died at its start (Ray 2.60; alone, or after the
# other tests, it starts; the cause is not found yet).
# Ray's client proxy keeps the per-client server process it started for this client (a part of
# the cluster, ended with it at the module's teardown); actors and groups are checked below.
@pytest.mark.allow_leaks
def test_from_a_ray_client_outside_the_cluster(cluster, nodes) -> None:
    """A kernel connected only through Ray Client (ray://): no socket back to it."""
    port = cluster.client_port
    script = f"""
import ray, nbtrain
ray.init("ray://127.0.0.1:{port}")
def where():
    import os
    print("rank", os.environ["RANK"], "here")
    return os.environ["NBTRAIN_RAY_NODE_ID"]
print(nbtrain.notebook_launcher(where, num_processes=2, return_all=True, progress="text",
                                cluster=nbtrain.RayCluster(placement="spread")))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "[rank 0] rank 0 here" in done.stdout and "[rank 1] rank 1 here" in done.stdout
    assert repr([nodes["n0"], nodes["n1"]]) in done.stdout or repr(
        [nodes["n1"], nodes["n0"]]) in done.stdout
    _nothing_left()


def test_bad_input_without_ray_or_connection() -> None:
    """In a fresh interpreter: no ray.init (says how to connect), no Ray (says what to
    install), a bad cluster= value; nothing started."""
    script = """
import sys, nbtrain
def f(): return 1
for make in (lambda: nbtrain.notebook_launcher(f, num_processes=2, cluster="slurm"),
             lambda: nbtrain.notebook_launcher(f, cluster="ray"),
             lambda: nbtrain.RayCluster(placement="random"),
             lambda: nbtrain.notebook_launcher(f, num_processes=2, cluster="ray")):
    try:
        make()
    except Exception as exc:
        print(type(exc).__name__, exc)
sys.modules["ray"] = None  # Ray not installed
try:
    nbtrain.notebook_launcher(f, num_processes=2, cluster="ray")
except ImportError as exc:
    print("ImportError", exc)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True)
    lines = done.stdout.splitlines()
    assert lines[0].startswith("ValueError cluster='slurm' is not a cluster nbtrain knows")
    assert lines[1] == "ValueError cluster='ray' needs num_processes=: how many ranks Ray " \
        "should place."
    assert lines[2].startswith("ValueError RayCluster(placement='random') is not a valid")
    assert lines[3].startswith("RuntimeError cluster='ray' found no Ray connection")
    assert "ray.init(address='auto')" in lines[3]
    assert lines[4].startswith("ImportError") and "pip install 'nbtrain[ray]'" in lines[4]


def test_a_node_lost_mid_run_names_it_and_stops_the_rest(cluster, nodes, tmp_path) -> None:
    """Last in the module: it removes the second node."""
    second = next(node for node in cluster.worker_nodes)

    def remove_once_started() -> None:
        deadline = time.monotonic() + 90
        while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        cluster.remove_node(second)

    removing = threading.Thread(target=remove_once_started)
    removing.start()
    try:
        started = time.monotonic()
        with pytest.raises(WorkerError) as caught:
            nbtrain.notebook_launcher(
                _sleep_forever, (str(tmp_path),), num_processes=2, cluster=SPREAD,
                progress="off",
            )
        took = time.monotonic() - started
    finally:
        removing.join()
    error = caught.value
    assert nodes["n1"][:12] in str(error)
    assert "was lost with its node" in error.remote_traceback
    assert took < 60
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)
    _nothing_left()


def test_max_restarts_places_the_ranks_again_from_the_newest_checkpoint(
    cluster, nodes, tmp_path, capsys
) -> None:
    """After the test above removed the second node: a third joins, ranks are placed on the
    head and on it, and it is removed mid-run; the restart places both ranks on the head and
    they go on from the newest periodic checkpoint."""
    third = cluster.add_node(num_cpus=2, resources={"n2": 1})
    cluster.wait_for_nodes()
    marker = tmp_path / "training"

    def remove_once_training() -> None:
        deadline = time.monotonic() + 90
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        cluster.remove_node(third)

    removing = threading.Thread(target=remove_once_training)
    removing.start()
    try:
        results = nbtrain.notebook_launcher(
            _train, (str(marker),), num_processes=2, cluster=SPREAD, progress="text",
            max_restarts=1, checkpoint_every=3, project_dir=tmp_path / "project",
            return_all=True,
        )
    finally:
        removing.join()
    said = capsys.readouterr()
    assert "restarting every rank (restart 1 of 1)" in said.out + said.err
    assert "was lost with its node" in said.out + said.err
    assert [r["node"] for r in results] == [nodes["n0"], nodes["n0"]]  # all the room left
    firsts = {r["first"] for r in results}
    assert len(firsts) == 1 and 3 <= firsts.pop() < STEPS  # from a checkpoint, not from 0
    assert [r["batches"] for r in results] == [STEPS, STEPS]
    _nothing_left()
