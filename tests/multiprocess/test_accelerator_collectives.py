"""Accelerator collectives and prepared dataloaders on real ranks (gloo, CPU).

Many cases run inside one launch per world size, to keep the suite fast; each rank returns what
it saw and the test compares it with what a single process computes here."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo  # (DDP imports it; loading it once here keeps forked ranks fast)
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, TensorDataset

from nbtrain import Accelerator, WorkerError, notebook_launcher

pytestmark = pytest.mark.timeout(180)

QUIET: dict[str, Any] = {"progress": "off", "output": "none"}


class Stream(IterableDataset):
    """An IterableDataset with (optionally) no length."""

    def __init__(self, count: int, sized: bool) -> None:
        self.count = count
        self.sized = sized

    def __iter__(self):
        return iter(torch.arange(self.count).tolist())

    def __len__(self) -> int:
        if not self.sized:
            raise TypeError("no length")
        return self.count


def metrics_over_many_sizes():
    """gather_for_metrics over prepared loaders of many dataset and batch sizes; uneven batches;
    no_sync; all in a process group the user's own code made."""
    torch.distributed.init_process_group("gloo")  # before the Accelerator, as user code may
    acc = Accelerator()
    world = acc.num_processes
    seen: dict[Any, Any] = {}
    for length in range(1, 14):
        for batch in (1, 2, 3, 4):
            for split in (False, True):
                size = batch * world if split else batch
                acc.split_batches = split
                loader = acc.prepare(
                    DataLoader(TensorDataset(torch.arange(length)), batch_size=size)
                )
                got = [acc.gather_for_metrics(x) for (x,) in loader]
                seen[("map", length, size, split)] = torch.cat(got).tolist()
    acc.split_batches = False
    for length in (1, 2, 5, 7):
        for sized in (True, False):
            loader = acc.prepare(DataLoader(Stream(length, sized), batch_size=2))
            got = [acc.gather_for_metrics(x) for x in loader]
            seen[("iterable", length, sized)] = torch.cat(got).tolist()
            if sized:
                seen[("iterable_len", length)] = (len(loader), len(got))
    # Objects (strings) are gathered as objects, duplicates dropped alike.
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(5)), batch_size=2))
    names = [acc.gather_for_metrics([f"s{int(i)}" for i in x]) for (x,) in loader]
    seen["objects"] = [name for step in names for name in step]
    # Shuffled: same order on every rank, a new order each epoch, all samples once per epoch.
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(11)), batch_size=2, shuffle=True))
    epochs = [torch.cat([acc.gather_for_metrics(x) for (x,) in loader]).tolist() for _ in range(2)]
    seen["shuffled"] = epochs
    # A sampler drawing fewer samples than the dataset holds: gathered metrics follow it.
    subset = RandomSampler(range(10), num_samples=5)
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(10)), batch_size=2, sampler=subset))
    seen["sampled"] = torch.cat([acc.gather_for_metrics(x) for (x,) in loader]).tolist()
    # Worker processes inside a rank.
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(9)), batch_size=2, num_workers=2))
    seen["workers"] = torch.cat([acc.gather_for_metrics(x) for (x,) in loader]).tolist()
    # Tensors gathered as objects: every rank's rows in one list, duplicates dropped alike.
    for length in (5, 7):
        loader = acc.prepare(DataLoader(TensorDataset(torch.arange(length)), batch_size=2))
        rows = [acc.gather_for_metrics(x, use_gather_object=True) for (x,) in loader]
        seen[("object_rows", length)] = [int(row) for step in rows for row in step]
    # even_batches=False: what each rank gets (no collective inside the loops: ranks get
    # different numbers of batches), with the end of its dataloader flagged on its last batch.
    acc.even_batches = False
    for length, batch, split in itertools.product((5, 7, 9), (1, 2, 3), (False, True)):
        acc.split_batches = split
        size = batch * world if split else batch
        loader = acc.prepare(DataLoader(TensorDataset(torch.arange(length)), batch_size=size))
        got = [(x.tolist(), loader.end_of_dataloader) for (x,) in loader]
        seen[("uneven", length, size, split)] = (len(loader), got)
    acc.even_batches, acc.split_batches = True, False
    # no_sync(model): gradients stay local inside the block and are averaged outside it.
    model = acc.prepare(torch.nn.Linear(2, 1, bias=False))
    x = torch.ones(1, 2) * (acc.process_index + 1)
    with acc.no_sync(model):
        model(x).sum().backward()
    local = acc.unwrap_model(model).weight.grad.clone()
    model.zero_grad()
    model(x).sum().backward()
    synced = acc.unwrap_model(model).weight.grad.clone()
    # Two forwards without sync; the second backward, triggered, all-reduces both.
    model.zero_grad()
    with acc.no_sync(model):
        first, second = model(x).sum(), model(2 * x).sum()
    acc.backward(first)
    with acc.trigger_sync_in_backward(model):
        acc.backward(second)
    seen["no_sync"] = (local, synced, acc.unwrap_model(model).weight.grad.clone())
    acc.end_training()  # the group is the user's: it stays
    seen["user_group_kept"] = torch.distributed.is_initialized()
    torch.distributed.destroy_process_group()
    return seen


@pytest.mark.parametrize("world", [2, 3])
def test_gather_for_metrics_counts_every_sample_once(world):
    seen = notebook_launcher(
        metrics_over_many_sizes, num_processes=world, start_method="fork", return_all=True, **QUIET
    )
    per_rank = {"no_sync", "user_group_kept"}
    gathered = [
        {k: v for k, v in s.items() if k not in per_rank and k[0] != "uneven"} for s in seen
    ]
    assert all(g == gathered[0] for g in gathered), "every rank gathers the same data"
    result = seen[0]
    for key, values in result.items():
        if key[0] == "map" or key[0] == "iterable":
            assert values == list(range(key[1])), key
        elif key[0] == "iterable_len":
            assert values[0] == values[1], key
    assert result["objects"] == [f"s{i}" for i in range(5)]
    first, second = result["shuffled"]
    assert sorted(first) == sorted(second) == list(range(11))
    assert first != second, "a new order each epoch"
    assert first != list(range(11)), "shuffled"
    assert sorted(result["workers"]) == list(range(9))
    assert len(result["sampled"]) == len(set(result["sampled"])) == 5
    for length in (5, 7):
        assert result[("object_rows", length)] == list(range(length))
    for key in [k for k in result if k[0] == "uneven"]:
        _, length, size, split = key
        per_rank = [s[key] for s in seen]
        for count, got in per_rank:
            assert count == len(got), key
            assert [end for _, end in got] == [False] * (len(got) - 1) + [True] * bool(got), key
        batches = [batch for _, got in per_rank for batch, _ in got]
        assert sorted(i for batch in batches for i in batch) == list(range(length)), key
        if not split:  # batch i of the original loader goes to rank i % world
            original = [list(range(i, min(i + size, length))) for i in range(0, length, size)]
            for rank, (_, got) in enumerate(per_rank):
                assert [batch for batch, _ in got] == original[rank::world], key
    for rank, s in enumerate(seen):
        local, synced, triggered = s["no_sync"]
        assert torch.equal(local, torch.full((1, 2), rank + 1.0)), "no all-reduce inside no_sync"
        assert torch.equal(synced, torch.full((1, 2), (world + 1) / 2)), "averaged outside"
        assert torch.equal(triggered, torch.full((1, 2), 3 * (world + 1) / 2)), "both averaged"
        assert s["user_group_kept"], "end_training() left the user's process group alone"


def every_collective(markers: str):
    acc = Accelerator()
    rank, world = acc.process_index, acc.num_processes
    out = {}
    # gather: nested structures, scalars, uneven first dims including an empty one
    nested = {"a": torch.full((2, 3), rank), "b": [torch.tensor(rank), (torch.ones(1) * rank,)]}
    out["nested"] = acc.gather(nested)
    out["uneven"] = acc.gather(torch.arange(rank * 2, dtype=torch.float32).reshape(rank, 2))
    out["bool"] = acc.gather(torch.tensor([rank % 2 == 0]))
    out["bf16"] = acc.gather(torch.ones(2, dtype=torch.bfloat16) * rank)
    # reduce
    out["sum"] = acc.reduce(torch.tensor([1.0, rank]), "sum")
    out["mean"] = acc.reduce({"x": torch.tensor([float(rank)])}, "mean")
    out["max"] = acc.reduce(torch.tensor([rank]), "max")
    loss = torch.ones(2, requires_grad=True) * rank  # e.g. a loss to log: part of a graph
    out["loss"] = (acc.reduce(loss, "mean"), acc.gather(loss))
    # pad
    out["pad"] = acc.pad_across_processes(torch.ones(rank + 1, 2), dim=0, pad_index=-1)
    out["pad_first"] = acc.pad_across_processes(torch.ones(2, rank + 1), dim=1, pad_first=True)
    # Leaves without the padded dim come back unchanged (a batch of 2-D ids and 1-D lengths).
    batch = {"ids": torch.ones(2, rank + 1), "lengths": torch.tensor([rank + 1, 1])}
    out["pad_mixed"] = acc.pad_across_processes(
        {**batch, "count": torch.tensor(rank)}, dim=1, pad_index=-1
    )
    # broadcast (in place)
    values = torch.full((3,), float(rank))
    acc.broadcast(values, from_process=world - 1)
    out["broadcast"] = values
    # objects, barriers, main-process helpers
    from nbtrain.accelerator.comm.collectives import Collectives

    assert isinstance(acc._collectives, Collectives)
    out["objects"] = acc._collectives.gather_object([f"r{rank}"])
    acc.wait_for_everyone()
    # The main process runs the block first: the others enter only after it left (it writes a
    # marker late in the block; a missing or inverted barrier lets them in before it exists).
    for name, first in (
        ("main_first", acc.main_process_first),
        ("local", acc.local_main_process_first),
    ):
        marker = Path(markers) / name
        with first():
            if rank == 0:
                time.sleep(0.3)
                marker.write_text("done")
            out[name] = marker.exists()
    with acc.split_between_processes(list(range(7))) as mine:
        out["split"] = acc.gather_for_metrics(list(mine))
    decorated = acc.on_main_process(lambda: "main")
    out["on_main"] = decorated()
    out["flags"] = (acc.is_main_process, acc.is_local_main_process, acc.is_last_process)
    out["state"] = (repr(acc.state), acc.state.num_processes, acc.state.process_index)
    out["eval_model"] = type(acc.prepare_model(torch.nn.Linear(2, 2), evaluation_mode=True))
    out["ddp_model"] = type(acc.prepare_model(torch.nn.Linear(2, 2)))
    if rank == 1:
        acc.set_trigger()  # e.g. early stopping decided on one rank
    out["trigger"] = (acc.check_trigger(), acc.check_trigger())
    out["type"] = acc.distributed_type.value
    acc.init_trackers("project", config={"lr": 0.1})  # as in Accelerate without log_with
    acc.end_training()  # releases the process group this Accelerator made
    out["after_end"] = (acc.trackers, torch.distributed.is_initialized())
    return out


def test_every_collective_on_three_ranks(tmp_path):
    results = notebook_launcher(
        every_collective,
        (str(tmp_path),),
        num_processes=3,
        start_method="fork",
        return_all=True,
        **QUIET,
    )
    for rank, out in enumerate(results):
        nested = out["nested"]
        assert torch.equal(
            nested["a"], torch.tensor([0, 1, 2]).repeat_interleave(2)[:, None].expand(6, 3)
        )
        assert torch.equal(nested["b"][0], torch.tensor([0, 1, 2]))
        assert torch.equal(nested["b"][1][0], torch.tensor([0.0, 1.0, 2.0]))
        assert out["uneven"].shape == (3, 2)  # ranks bring 0, 1 and 2 rows
        assert torch.equal(out["uneven"], torch.tensor([[0.0, 1.0], [0.0, 1.0], [2.0, 3.0]]))
        assert out["bool"].tolist() == [True, False, True]
        assert out["bf16"].dtype == torch.bfloat16 and out["bf16"].tolist() == [0, 0, 1, 1, 2, 2]
        assert out["sum"].tolist() == [3.0, 3.0]
        assert out["mean"]["x"].tolist() == [1.0]
        assert out["max"].tolist() == [2]
        assert out["loss"][0].tolist() == [1.0, 1.0] and out["loss"][1].shape == (6,)
        assert out["pad"].shape == (3, 2) and (out["pad"][rank + 1 :] == -1).all()
        assert out["pad_first"].shape == (2, 3) and (out["pad_first"][:, : 2 - rank] == 0).all()
        mixed = out["pad_mixed"]
        assert mixed["ids"].shape == (2, 3) and (mixed["ids"][:, rank + 1 :] == -1).all()
        assert mixed["lengths"].tolist() == [rank + 1, 1] and mixed["count"].item() == rank
        assert out["main_first"] and out["local"], "the main process ran the block first"
        assert out["broadcast"].tolist() == [2.0, 2.0, 2.0]
        assert out["objects"] == ["r0", "r1", "r2"]
        assert out["split"] == list(range(7))
        assert out["on_main"] == ("main" if rank == 0 else None)
        assert out["flags"] == (rank == 0, rank == 0, rank == 2)
        summary, processes, index = out["state"]
        assert (processes, index) == (3, rank)
        assert summary.startswith("Distributed environment: MULTI_CPU  Backend: gloo\n")
        assert f"Num processes: 3\nProcess index: {rank}\n" in summary
        assert out["eval_model"] is torch.nn.Linear, "evaluation_mode: no DDP wrapper"
        assert out["ddp_model"].__name__ == "DistributedDataParallel"
        assert out["trigger"] == (True, False), "every rank sees the trigger, once"
        assert out["type"] == "MULTI_CPU"
        assert out["after_end"] == ([], False)


def mismatched_shapes():
    acc = Accelerator()
    acc.reduce(torch.ones(acc.process_index + 1))


def main_only_wait():
    acc = Accelerator()
    if acc.is_main_process:
        acc.wait_for_everyone()  # the other rank returns: rank 0 must not hang


def main_only_save(directory):
    acc = Accelerator()
    if acc.is_main_process:
        acc.save_state(directory)
    acc.wait_for_everyone()


def test_misuse_fails_at_once_with_a_clear_error(tmp_path):
    with pytest.raises(WorkerError, match="different shape") as info:
        notebook_launcher(mismatched_shapes, num_processes=2, start_method="fork", **QUIET)
    assert info.value.type_name == "CollectiveError"
    with pytest.raises(WorkerError, match=r"lost its peers.*is_main_process") as info:
        notebook_launcher(main_only_wait, num_processes=2, start_method="fork", timeout=60, **QUIET)
    assert info.value.rank == 0
    with pytest.raises(WorkerError, match=r"save_state\(\), rank 1: wait_for_everyone\(\)"):
        notebook_launcher(
            main_only_save,
            (str(tmp_path / "ck"),),
            num_processes=2,
            start_method="fork",
            timeout=60,
            **QUIET,
        )
    assert not (tmp_path / "ck").exists(), "a refused save leaves no checkpoint behind"


def slow_and_absent_peers():
    from nbtrain.accelerator.comm.backends import ProcessGroupBackend
    from nbtrain.accelerator.comm.collectives import Collectives, CollectiveTimeoutError

    acc = Accelerator()  # initialises the process group
    notes: list[str] = []
    patient = Collectives(
        ProcessGroupBackend(), acc.device, timeout=60, stall_notice=0.3, on_stall=notes.append
    )
    if acc.process_index == 1:
        time.sleep(1.0)  # slow, but it comes
    patient.barrier()
    impatient = Collectives(ProcessGroupBackend(), acc.device, timeout=0.5)
    if acc.process_index == 1:
        time.sleep(1.5)  # never makes the next call
        return notes, None
    try:
        impatient.barrier()
    except CollectiveTimeoutError as exc:
        return notes, str(exc)
    return notes, "no error"


def test_a_long_wait_is_announced_and_bounded():
    (notes0, error0), (notes1, _) = notebook_launcher(
        slow_and_absent_peers, num_processes=2, start_method="fork", return_all=True, **QUIET
    )
    assert len(notes0) == 1 and "rank 0 has waited" in notes0[0] and not notes1
    assert error0 is not None and "gave up after waiting" in error0
