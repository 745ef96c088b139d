"""Accelerate 1.15's whole launcher signature (issue 28, point 2): every parameter of the installed
Accelerate's ``notebook_launcher`` and ``debug_launcher`` is one of nbtrain's, taken with its
meaning or refused before anything starts with an error naming it; and ``WorkerError`` is torch
elastic's ``ChildFailedError`` too, as Accelerate raises."""

from __future__ import annotations

import inspect
import pickle

import pytest

import nbtrain
from nbtrain import WorkerError, debug_launcher, notebook_launcher
from nbtrain.kernel.options import accelerate


def train() -> int:
    return 1


@pytest.fixture(autouse=True)
def no_process_starts(monkeypatch: pytest.MonkeyPatch):
    """Validation must fail before anything starts (as in test_config.py)."""
    import nbtrain.kernel.procs.processes as processes

    def refuse(*args, **kwargs):
        raise AssertionError("a process was started although the arguments were invalid")

    monkeypatch.setattr(processes, "start_ranks", refuse)


@pytest.mark.parametrize("name", ["notebook_launcher", "debug_launcher"])
def test_every_parameter_of_accelerates_launcher_exists(name):
    import accelerate

    theirs = inspect.signature(getattr(accelerate, name)).parameters
    ours = inspect.signature(getattr(nbtrain, name)).parameters
    assert set(theirs) - set(ours) == set()
    if name == "debug_launcher":  # the same signature, defaults included
        assert [(p.name, p.default) for p in theirs.values()] == [
            (p.name, p.default) for p in ours.values()
        ]


@pytest.mark.parametrize(
    ("kwargs", "error", "fragments"),
    [
        ({"rdzv_backend": "etcd"}, ValueError, ["rdzv_backend='etcd'", "'static'", "node 0"]),
        ({"log_line_prefix_template": "[${rank}]"}, ValueError, ["log_line_prefix_template=", "output='all'"]),  # noqa: E501
        ({"monitor_interval": 0}, ValueError, ["monitor_interval=0", "> 0"]),
        ({"monitor_interval": "fast"}, TypeError, ["monitor_interval='fast'"]),
        ({"rdzv_id": 3}, TypeError, ["rdzv_id=3", "string"]),
        ({"rdzv_conf": {"read_timeout": 5}}, ValueError, ["'read_timeout'", "join_timeout"]),
        ({"rdzv_conf": {"rank": 1}}, ValueError, ["rank 1", "node_rank=0"]),
        ({"rdzv_conf": {"join_timeout": 5}, "rdzv_timeout": 9}, ValueError, ["rdzv_timeout=9"]),
        ({"rdzv_conf": {"join_timeout": 0}}, ValueError, ["rdzv_timeout=0"]),
        ({"use_port": "http"}, ValueError, ["use_port='http'", "1..65535"]),
        ({"use_port": 70000}, ValueError, ["use_port=70000"]),
        ({"master_addr": ""}, ValueError, ["master_addr=''"]),
        ({"num_nodes": 2, "master_addr": "10.0.0.1", "use_port": "http"}, ValueError, ["use_port"]),
    ],
)
def test_refused_values_name_the_parameter_before_anything_starts(kwargs, error, fragments):
    with pytest.raises(error) as info:
        notebook_launcher(train, num_processes=2, **kwargs)
    for fragment in fragments:
        assert fragment in str(info.value)


def resolve(**given):
    values = {
        "num_nodes": 1,
        "node_rank": 0,
        "rdzv_endpoint": None,
        "rdzv_timeout": 900.0,
        "use_port": None,
        "master_addr": None,
        "rdzv_backend": "static",
        "rdzv_conf": None,
        "rdzv_id": "none",
        "monitor_interval": 0.1,
        "log_line_prefix_template": None,
    }
    return accelerate.resolve(**{**values, **given})


def test_accelerates_meanings():
    # Accelerate's defaults, given explicitly, are nbtrain's
    assert resolve(rdzv_endpoint="", use_port="29500", master_addr="127.0.0.1") == (
        accelerate.Rendezvous(None, 900.0)
    )
    # multi-node without rdzv_endpoint: node 0 is master_addr:use_port (port default 29500)
    assert resolve(num_nodes=2, master_addr="10.0.0.1").endpoint == "10.0.0.1:29500"
    assert resolve(num_nodes=2, master_addr="10.0.0.1", use_port=29400).endpoint == (
        "10.0.0.1:29400"
    )
    assert resolve(num_nodes=2, master_addr="fe80::1", use_port="1").endpoint == "[fe80::1]:1"
    # an explicit rdzv_endpoint wins, as in Accelerate
    assert resolve(num_nodes=2, master_addr="a", rdzv_endpoint="b:1").endpoint == "b:1"
    # rdzv_conf: the join timeout (either of torch's names) and the node's rank
    assert resolve(rdzv_conf={"join_timeout": 30}).timeout == 30
    assert resolve(rdzv_conf={"timeout": 30, "rank": 1}, node_rank=1).timeout == 30
    assert resolve(rdzv_conf={"timeout": 30}, rdzv_timeout=30).timeout == 30
    assert resolve(rdzv_backend="c10d", rdzv_id="job-7", monitor_interval=5).timeout == 900.0


def test_a_multi_node_launch_from_master_addr_reaches_the_endpoint_check():
    # (the endpoint built from master_addr:use_port is checked like rdzv_endpoint=)
    with pytest.raises(ValueError, match="rdzv_endpoint='no host:29500'"):
        notebook_launcher(train, num_processes=1, num_nodes=2, master_addr="no host")


def test_worker_error_is_a_child_failed_error():
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    error = WorkerError(0, type_name="RuntimeError", message="I'm an even process.", exitcode=1)
    assert isinstance(error, ChildFailedError) and isinstance(error, RuntimeError)
    with pytest.raises(ChildFailedError, match=r"I'm an even process\."):
        raise error
    rank, failure = error.get_first_failure()
    assert (rank, failure.exitcode, failure.local_rank) == (0, 1, 0)
    assert "I'm an even process." in failure.message and "rank 0" in error.format_msg()
    killed = WorkerError(1, signal="SIGKILL", other_failures={0: "RuntimeError: x"})
    assert killed.failures[1].signal_name() == "SIGKILL"
    again = pickle.loads(pickle.dumps(killed))
    assert (type(again), str(again), again.rank) == (WorkerError, str(killed), 1)


def test_debug_launcher_keeps_accelerates_signature():
    assert inspect.signature(debug_launcher).parameters["num_processes"].default == 2
