"""Hugging Face Accelerate's own Accelerator and Transformers' Trainer, run unchanged inside
nbtrain's CPU ranks, see the real world (issue 18, point 7): not "process 0 of 1" each."""

from __future__ import annotations

from typing import Any

import pytest

from nbtrain import notebook_launcher

pytestmark = pytest.mark.timeout(240)

QUIET: dict[str, Any] = {"progress": "off", "output": "none"}


def accelerate_world() -> dict[str, Any]:
    import torch
    from accelerate import Accelerator

    acc = Accelerator()
    total = acc.reduce(torch.tensor([acc.process_index + 1.0]), "sum")
    return {
        "world": acc.num_processes,
        "rank": acc.process_index,
        "type": str(acc.distributed_type),
        "sum": total.item(),
    }


def trainer_world(directory: str) -> dict[str, Any]:
    from tinytrainer import Pairs, Regression
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=directory,
        per_device_train_batch_size=2,
        max_steps=2,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = Trainer(model=Regression(), args=args, train_dataset=Pairs())
    trainer.train()
    return {
        "world": args.world_size,
        "rank": args.process_index,
        "accelerator_world": trainer.accelerator.num_processes,
        "batches_per_rank": len(trainer.get_train_dataloader()),
    }


def test_accelerate_and_trainer_see_two_ranks(tmp_path):
    results = notebook_launcher(
        accelerate_world, num_processes=2, start_method="fork", return_all=True, **QUIET
    )
    assert [(r["world"], r["rank"]) for r in results] == [(2, 0), (2, 1)]
    assert {r["type"] for r in results} == {"DistributedType.MULTI_CPU"}
    assert [r["sum"] for r in results] == [3.0, 3.0]  # a real all-reduce over both ranks
    results = notebook_launcher(
        trainer_world,
        (str(tmp_path),),
        num_processes=2,
        start_method="fork",
        return_all=True,
        **QUIET,
    )
    assert [(r["world"], r["rank"], r["accelerator_world"]) for r in results] == [
        (2, 0, 2),
        (2, 1, 2),
    ]
    assert {r["batches_per_rank"] for r in results} == {4}  # 16 samples / (2 per rank x 2)
