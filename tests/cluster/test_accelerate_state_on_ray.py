"""Accelerate's own state in ranks that Ray placed on two nodes describes the launch's world
(issue 43, point 7): a bare ``accelerate.PartialState()`` says process 1 of 2 on the second
node, ``DistributedType.MULTI_CPU``, and Accelerate's ``on_main_process`` runs on rank 0 only.
(On this machine's two-node Ray cluster, tests/cluster/conftest.py.)"""

from __future__ import annotations

import sys
from typing import Any

import cloudpickle
import pytest

import nbtrain
from nbtrain import RayCluster

ray = pytest.importorskip("ray")
pytest.importorskip("accelerate")

pytestmark = pytest.mark.timeout(300)

# The nodes' workers do not have tests/ on their path: this module's functions travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _accelerate_world() -> dict[str, Any]:
    import os

    from accelerate import PartialState

    state = PartialState()
    ran: list[int] = []
    state.on_main_process(lambda: ran.append(state.process_index))()
    state.wait_for_everyone()
    return {
        "where": (state.process_index, state.num_processes, str(state.distributed_type)),
        "main": state.is_main_process,
        "ran": ran,
        "node": os.environ["NBTRAIN_RAY_NODE_ID"],
    }


def test_bare_partial_state_on_two_nodes(cluster) -> None:
    results = nbtrain.notebook_launcher(
        _accelerate_world, num_processes=2, cluster=RayCluster(placement="spread"),
        return_all=True, progress="off",
    )
    assert [r["where"] for r in results] == [
        (0, 2, "DistributedType.MULTI_CPU"),
        (1, 2, "DistributedType.MULTI_CPU"),
    ]
    assert [r["main"] for r in results] == [True, False]
    assert [r["ran"] for r in results] == [[0], []]
    assert results[0]["node"] != results[1]["node"]  # one rank on each node
