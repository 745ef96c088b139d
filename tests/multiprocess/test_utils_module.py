"""``nbtrain.utils`` (issue 28, point 3): ``from accelerate.utils import X`` becomes
``from nbtrain.utils import X``. Each name exists in Accelerate with at least Accelerate's
parameters; the free functions give, on 2 real ranks, what Accelerate's own give there; and
a mismatched collective raises the public ``DistributedOperationException``."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import pytest

import nbtrain.utils
from nbtrain import notebook_launcher

pytestmark = pytest.mark.timeout(240)

QUIET: dict[str, Any] = {"progress": "off", "output": "none"}


def accelerates(name: str) -> Any:
    if name == "DistributedOperationException":  # (not re-exported by accelerate.utils)
        return importlib.import_module("accelerate.utils.operations").DistributedOperationException
    return getattr(importlib.import_module("accelerate.utils"), name)


@pytest.mark.parametrize("name", nbtrain.utils.__all__)
def test_each_name_has_accelerates_parameters(name):
    ours, theirs = getattr(nbtrain.utils, name), accelerates(name)
    if name == "DistributedOperationException":
        assert issubclass(ours, Exception)
        return
    if name in ("DistributedType", "LoggerType"):  # enums: a subset of Accelerate's members
        assert {(m.name, m.value) for m in ours} <= {(m.name, m.value) for m in theirs}
        return
    mine = inspect.signature(ours).parameters
    for position, (parameter, spec) in enumerate(inspect.signature(theirs).parameters.items()):
        assert parameter in mine, f"{name} lacks Accelerate's parameter {parameter!r}"
        if not inspect.isclass(ours) and spec.kind is spec.POSITIONAL_OR_KEYWORD:
            assert list(mine)[position] == parameter  # positional calls mean the same
            assert mine[parameter].default == spec.default  # e.g. reduce's "mean"


def test_an_unknown_name_says_which_exist():
    with pytest.raises(AttributeError, match="gather_object"):
        nbtrain.utils.extract_model_from_parallel  # noqa: B018


def free_functions(module_name: str) -> dict[str, Any]:
    """Accelerate's free functions, from ``module_name`` (accelerate.utils or nbtrain.utils)."""
    import torch

    utils = importlib.import_module(module_name)
    rank = int(__import__("os").environ["RANK"])
    if module_name == "accelerate.utils":
        from accelerate import PartialState

        PartialState(cpu=True)  # (Accelerate's functions need its state formed: on CPU, cpu=True)
    rows = torch.arange(rank + 1, dtype=torch.float32)  # 1 row on rank 0, 2 on rank 1
    sent = torch.tensor([float(rank)])
    objects = [f"rank{rank}", rank]
    utils.broadcast_object_list(objects, from_process=1)
    moved = utils.send_to_device({"x": torch.ones(1), "ids": [1, 2]}, "cpu", skip_keys="ids")
    utils.wait_for_everyone()
    return {
        "gather": utils.gather(torch.tensor([rank, 10 + rank])).tolist(),
        "gather_object": utils.gather_object([f"r{rank}"]),
        "broadcast": utils.broadcast(sent, from_process=1).tolist(),
        "broadcast_object_list": objects,
        "reduce": utils.reduce(torch.tensor([rank + 1.0])).tolist(),  # "mean" by default
        "reduce_sum": utils.reduce(torch.tensor([rank + 1.0]), "sum").tolist(),
        "pad": utils.pad_across_processes(rows, pad_first=True).tolist(),
        "send_to_device": (str(moved["x"].device), moved["ids"]),
    }


def mismatched_calls() -> str:
    import os

    import torch

    from nbtrain.utils import DistributedOperationException, gather, wait_for_everyone

    try:
        if os.environ["RANK"] == "0":
            gather(torch.ones(1))
        else:
            wait_for_everyone()
    except DistributedOperationException as error:
        return type(error).__name__ + ": " + str(error)[:60]
    return "no error"


def test_free_functions_give_what_accelerates_give(tmp_path):
    results = {
        module: notebook_launcher(
            free_functions,
            (module,),
            num_processes=2,
            start_method="fork",
            return_all=True,
            **QUIET,
        )
        for module in ("accelerate.utils", "nbtrain.utils")
    }
    assert results["nbtrain.utils"] == results["accelerate.utils"]
    first = results["nbtrain.utils"][0]
    assert first["gather"] == [0, 10, 1, 11] and first["reduce"] == [1.5]
    assert first["broadcast_object_list"] == ["rank1", 1]


def test_a_mismatched_call_raises_distributed_operation_exception():
    errors = notebook_launcher(
        mismatched_calls, num_processes=2, start_method="fork", return_all=True, **QUIET
    )
    assert all(e.startswith("CollectiveError: Ranks made different collective") for e in errors)


def test_the_ddp_handler_takes_accelerates_comm_fields():
    from nbtrain.accelerator.front import handlers
    from nbtrain.utils import DistributedDataParallelKwargs

    handler = DistributedDataParallelKwargs(find_unused_parameters=True, comm_state_option={"a": 1})
    assert handlers.collect([handler]).ddp == {"find_unused_parameters": True}  # not DDP's own
    with pytest.raises(ValueError, match="comm_hook='fp16'"):
        handlers.collect([DistributedDataParallelKwargs(comm_hook="fp16")])
