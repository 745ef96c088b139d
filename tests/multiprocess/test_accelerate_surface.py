"""Accelerate's public names on real gloo ranks (issue 18): join_uneven_inputs, pickling the
Accelerator, save_state into a directory per rank, accelerator.state.destroy_process_group."""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from nbtrain import Accelerator, notebook_launcher

pytestmark = pytest.mark.timeout(180)

QUIET: dict[str, Any] = {"progress": "off", "output": "none"}


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(3))


def joined() -> dict[str, Any]:
    acc = Accelerator(even_batches=False)
    torch.manual_seed(0)
    model = acc.prepare(torch.nn.Linear(1, 1))
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(3.0)[:, None]), batch_size=1))
    acc.prepare(DataLoader(Stream(), batch_size=1))
    steps = []
    with acc.join_uneven_inputs([model]):
        for step, (x,) in enumerate(loader):  # rank 0: 2 batches, rank 1: 1
            model(x).sum().backward()
            steps.append(step)
    acc.wait_for_everyone()  # the rank that finished first did not hang in DDP's all-reduce
    grad = acc.unwrap_model(model).weight.grad.clone()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with acc.join_uneven_inputs([model], even_batches=True):
            inside = loader.batch_sampler.even_batches
    return {
        "steps": steps,
        "grad": acc.gather(grad[None]),
        "inside": inside,
        "after": loader.batch_sampler.even_batches,
        "warned": [str(w.message) for w in caught],
    }


def test_join_uneven_inputs_on_gloo():
    results = notebook_launcher(
        joined, num_processes=2, start_method="fork", return_all=True, **QUIET
    )
    assert [r["steps"] for r in results] == [[0, 1], [0]]
    grads = results[0]["grad"]
    # Step 0: both ranks, grad (0 + 1)/2 = 0.5. Step 1 on rank 0 alone: its accumulated grad
    # 0.5 + 2 is all-reduced against the joined rank's zeros: 2.5/2; rank 1 keeps 0.5.
    assert grads.flatten().tolist() == pytest.approx([1.25, 0.5])
    assert results[0]["inside"] is True and results[0]["after"] is False
    assert any("only supported for map-style" in w for w in results[0]["warned"])


def surface(directory: str) -> dict[str, Any]:
    acc = Accelerator()
    data = acc.prepare(DataLoader(list(range(16)), batch_size=2, shuffle=True))
    copy = pickle.loads(pickle.dumps(acc))
    out: dict[str, Any] = {
        "pickled": (copy.num_processes, copy.process_index, copy.state.__dict__),
        "config": type(acc.dataloader_config).__name__,
    }
    mine = f"{directory}/rank{acc.process_index}"  # a directory per rank, as Accelerate allows
    seen, rest = [], []
    for step, batch in enumerate(data):
        if step == 1:
            acc.save_state(mine)
        (rest if step > 1 else seen).append(batch.tolist())
    acc.load_state(mine)
    out["resumed_equal"] = [batch.tolist() for batch in data] == rest
    try:
        acc.state.no_such_name  # noqa: B018
    except AttributeError as error:
        out["error"] = str(error)
    acc.state.destroy_process_group()
    out["initialized_after"] = dist.is_initialized()
    return out


def test_pickling_per_rank_checkpoints_and_destroying_the_group(tmp_path):
    results = notebook_launcher(
        surface, (str(tmp_path),), num_processes=2, start_method="fork", return_all=True, **QUIET
    )
    for rank, result in enumerate(results):
        assert result["pickled"] == (2, rank, {})
        assert result["resumed_equal"], f"rank {rank} did not resume where it saved"
        assert "accelerator.state" in result["error"]
        assert "'Accelerator' object" not in result["error"]  # (it named the wrong object)
        assert result["initialized_after"] is False
        assert (tmp_path / f"rank{rank}" / f"random_states_{rank}.pkl").is_file()


def test_pickled_accelerator_in_one_process():
    acc = Accelerator()
    acc.prepare(DataLoader(list(range(4)), batch_size=2))
    copy = pickle.loads(pickle.dumps(acc))
    assert copy.state.__dict__ == acc.state.__dict__
    assert copy.dataloader_config == acc.dataloader_config
