"""The Ray relay's bookkeeping without a cluster (kernel/launch/cluster/relay.py); the relay
moving a real cluster's bytes is tested in tests/cluster."""

from __future__ import annotations

from nbtrain.kernel.launch.cluster import relay
from nbtrain.kernel.procs import handles


def test_a_rank_whose_actor_was_let_go_ends_lost_instead_of_failing_the_relay():
    # RayRanks.close lets go of the actors after the relay thread did not end within
    # JOIN_WAIT (Ray hanging): the thread's next read must not call a method of None.
    handle = relay.RemoteRank(None, relay.Node("n" * 16, "127.0.0.1", "here"))
    rank = handles.RankProcess(0, handle, relay.local_pipes())
    try:
        pending: dict = {}
        relay.Relay([rank], {0: handle})._ask(pending, 0)
        assert pending == {} and handle.exitcode == relay.LOST
    finally:
        rank.pipes.close_readers()
        handle.close()
