"""destroy_process_group() with a DDP model still alive: the rank must end, every time.

Without nbtrain.rank.teardown, torch deadlocks here in about four launches of ten on two cores
(DDP's reducer destroys the gloo group while holding the GIL; see nbtrain/rank/teardown.py).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from nbtrain import notebook_launcher

pytestmark = pytest.mark.timeout(300)

QUIET = {"progress": "off", "output": "none"}


def destroy_with_ddp_alive() -> float:
    """The DDP tutorial's shape: destroy the group, then return with the model still in scope."""
    dist.init_process_group("gloo")
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    for _ in range(3):
        ddp(torch.randn(32, 64)).sum().backward()
    total = torch.ones(1000)
    dist.all_reduce(total)
    dist.destroy_process_group()
    return total[0].item()


@pytest.mark.parametrize("launches", [12])
def test_destroy_with_ddp_alive_never_hangs(launches):
    for _ in range(launches):
        value = notebook_launcher(
            destroy_with_ddp_alive, num_processes=2, start_method="fork", timeout=60, **QUIET
        )
        assert value == 2.0


def destroy_subgroup_then_world() -> list[float]:
    """Destroying still destroys: the group leaves torch's registry, the rest keeps working."""
    dist.init_process_group("gloo")
    pair = dist.new_group([0, 1])
    one = torch.ones(1)
    dist.all_reduce(one, group=pair)
    dist.destroy_process_group(pair)
    assert pair not in dist.distributed_c10d._world.pg_map
    dist.all_reduce(one)  # the default group survives its subgroup's destruction
    dist.destroy_process_group()
    assert not dist.is_initialized()
    return [one.item()]


def test_destroyed_groups_leave_torch_registry(method):
    values = notebook_launcher(
        destroy_subgroup_then_world, num_processes=2, start_method=method, return_all=True,
        timeout=60, **QUIET,
    )
    assert values == [[4.0], [4.0]]


def all_reduce(destroy: bool) -> float:
    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    if destroy:
        dist.destroy_process_group()
    return total.item()


def test_spawn_ranks_exit_cleanly_with_or_without_destroying_their_group():
    """Spawn ranks finalize the interpreter: a gloo group still alive then (kept by nbtrain, or
    never destroyed by the function) aborted the process now and then, as a gloo thread asked
    for the GIL during finalization. nbtrain frees every group before the rank exits."""
    for launch in range(12):
        values = notebook_launcher(
            all_reduce, (launch % 2 == 0,), num_processes=3, start_method="spawn",
            return_all=True, timeout=120, **QUIET,
        )
        assert values == [3.0, 3.0, 3.0]
