"""Multi-node checks that need no second node: argument validation, option agreement, the
verdict record every node reads."""

from __future__ import annotations

import time

import pytest

from nbtrain import WorkerError, notebook_launcher
from nbtrain.kernel.launch.elastic.network import is_local_address, split_endpoint
from nbtrain.kernel.launch.elastic.news import News, check_nodes
from nbtrain.kernel.options.config import build_config


def config(**overrides):
    options = dict(
        num_processes=2,
        start_method="auto",
        mixed_precision=None,
        gpu_ids=None,
        num_nodes=2,
        node_rank=0,
        rdzv_endpoint="127.0.0.1:29400",
        max_restarts=0,
        timeout=None,
        output="all",
        progress="off",
        return_all=False,
    )
    options.update(overrides)
    return build_config(**options)


def node(rank, processes=2, nodes=2, restarts=0, host="h"):
    return {
        "node_rank": rank,
        "num_processes": processes,
        "num_nodes": nodes,
        "max_restarts": restarts,
        "host": host,
    }


def test_nodes_must_agree_on_their_launch_options():
    check_nodes([node(0), node(1)], config())
    with pytest.raises(ValueError, match=r"different num_processes \(node 0: 2, node 1: 4\)"):
        check_nodes([node(0), node(1, processes=4)], config())
    with pytest.raises(ValueError, match="different max_restarts"):
        check_nodes([node(1, restarts=1), node(0)], config())
    with pytest.raises(
        ValueError,
        match=r"do not cover 0..1 once each \(a: node_rank=1, "
        r"b: node_rank=1\)",
    ):
        check_nodes([node(1, host="a"), node(1, host="b")], config())


@pytest.mark.parametrize(
    "value, error",
    [
        (0, ValueError),
        (-5, ValueError),
        (float("inf"), ValueError),
        ("60", TypeError),
        (True, TypeError),
    ],
)
def test_rdzv_timeout_is_validated(value, error):
    with pytest.raises(error, match="rdzv_timeout="):
        config(rdzv_timeout=value)
    assert config(rdzv_timeout=5).rdzv_timeout == 5.0
    assert config().rdzv_timeout == 900.0


def test_node_zero_must_be_the_endpoint_machine():
    """Caught before anything starts: node 0 hosts the rendezvous at the endpoint."""
    started = time.monotonic()
    with pytest.raises(
        ValueError,
        match=r"node_rank=0 hosts the rendezvous at rdzv_endpoint="
        r"'192.0.2.77:29400', but '192.0.2.77' is not an "
        "address of this machine",
    ):
        notebook_launcher(
            print,
            num_processes=2,
            num_nodes=2,
            node_rank=0,
            rdzv_endpoint="192.0.2.77:29400",
            progress="off",
        )
    assert time.monotonic() - started < 5


def test_addresses():
    assert split_endpoint("10.0.0.1:29400") == ("10.0.0.1", 29400)
    assert split_endpoint("[::1]:29400") == ("::1", 29400)
    assert is_local_address("127.0.0.1")
    assert not is_local_address("192.0.2.77")  # TEST-NET-1: never an address of this machine


def test_the_verdict_travels_as_text_and_names_the_node():
    failure = WorkerError(
        3,
        type_name="ValueError",
        message="boom",
        exitcode=1,
        remote_traceback="Traceback ...\nValueError: boom",
        node=1,
    )
    news = News.failure(failure, collateral=False)
    again = News.decode(news.encode().encode())
    assert again == news
    error = again.error(others={0: "RuntimeError: Connection closed by peer"})
    assert (error.rank, error.node, error.type_name, error.exitcode) == (3, 1, "ValueError", 1)
    assert str(error).startswith("rank 3 (node 1) failed with ValueError: boom")
    assert "rank 0: RuntimeError: Connection closed by peer" in str(error)
    assert News.stop(0, "interrupted").summary() == "node 0 stopped the run (interrupted)"


def test_a_store_closed_while_a_node_connects_is_waited_out(monkeypatch):
    """Node 0 closes its previous launch's store just after node 1's client reached it, before
    torch's rendezvous backend reads it (seen in CI: node 1's next launch then failed at once
    with RendezvousConnectionError). Node 1 must connect again, to node 0's fresh store."""
    import socket
    from datetime import timedelta

    from torch.distributed import TCPStore

    from nbtrain.kernel.launch.elastic import node as elastic

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    servers = [TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                        timeout=timedelta(seconds=30))]  # the previous launch's store
    real_backend = elastic.C10dRendezvousBackend
    made = []

    def closing_first(store, run_id):
        if not made:  # node 0 leaves the previous launch now, and starts the next one after
            servers.clear()
        made.append(store)
        return real_backend(store, run_id)

    def reopen_then(say_text):
        said.append(say_text)
        if not servers and "store that failed" in say_text:
            servers.append(TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                                    timeout=timedelta(seconds=30)))

    said: list[str] = []
    monkeypatch.setattr(elastic, "C10dRendezvousBackend", closing_first)
    coordinator = elastic.NodeCoordinator(
        config(node_rank=1, rdzv_endpoint=f"127.0.0.1:{port}", rdzv_timeout=60), "127.0.0.1"
    )
    try:
        coordinator.connect(reopen_then)
        assert not coordinator.handler.is_closed()
        assert len(made) == 2, "connected again after the store failed"
        assert any("it offered a store that failed" in text for text in said), said
    finally:
        coordinator._drop()
        servers.clear()
