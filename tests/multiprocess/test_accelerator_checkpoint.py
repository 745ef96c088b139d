"""save_state / load_state on real ranks: a resumed run matches an uninterrupted one bitwise,
an interrupted save leaves the previous checkpoint loadable, misuse is explained."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import pytest
import torch
import torch._dynamo  # (DDP imports it; loading it once here keeps forked ranks fast)
from torch.nn.functional import mse_loss
from torch.utils.data import DataLoader, TensorDataset

from nbtrain import Accelerator, WorkerError, notebook_launcher, set_seed

pytestmark = pytest.mark.timeout(180)

QUIET: dict[str, Any] = {"progress": "off", "output": "none"}
EPOCHS = 3


class Progress:
    """A user object registered for checkpointing."""

    def __init__(self) -> None:
        self.epoch = 0
        self.micro_steps = 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "micro_steps": self.micro_steps}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.micro_steps = state["epoch"], state["micro_steps"]


def build(seed: int):
    set_seed(seed)
    acc = Accelerator(gradient_accumulation_steps=2, mixed_precision="fp16")
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 16), torch.nn.Dropout(0.3), torch.nn.ReLU(), torch.nn.Linear(16, 1)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)
    x = torch.randn(22, 4, generator=torch.Generator().manual_seed(5))
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=2, shuffle=True)
    progress = Progress()
    model, optimizer, loader, schedule = acc.prepare(model, optimizer, loader, schedule)
    acc.register_for_checkpointing(progress)
    return acc, model, optimizer, loader, schedule, progress


def train(parts, save_at=None, directory=None) -> dict:
    acc, model, optimizer, loader, schedule, progress = parts
    for epoch in range(progress.epoch, EPOCHS):
        progress.epoch = epoch
        for x, y in loader:
            with acc.accumulate(model):
                noise = float(np.random.randn()) * 1e-3 + random.random() * 1e-3
                acc.backward(mse_loss(model(x), y + noise))
                optimizer.step()
                schedule.step()
                optimizer.zero_grad()
            progress.micro_steps += 1
            if progress.micro_steps == save_at:
                acc.save_state(directory)
        progress.epoch = epoch + 1
    return {
        "params": [p.detach().clone() for p in acc.unwrap_model(model).parameters()],
        "adam": [s["exp_avg"].clone() for s in optimizer.state_dict()["state"].values()],
        "lr": schedule.get_last_lr(),
        "scale": acc.scaler.get_scale(),
        "micro_steps": progress.micro_steps,
        "draws": (torch.rand(3), np.random.rand(3).tolist(), random.random()),
    }


def run_and_resume(directory: str) -> tuple[dict, dict]:
    # 6 batches per rank per epoch: save in the 2nd epoch, right after a synchronised step.
    uninterrupted = train(build(seed=1), save_at=10, directory=directory)
    resumed_parts = build(seed=999)  # other weights, other RNG: everything must come from disk
    resumed_parts[0].load_state(directory)
    assert resumed_parts[5].micro_steps == 10
    resumed = train(resumed_parts)
    return uninterrupted, resumed


def test_resumed_run_matches_uninterrupted_run_bitwise(tmp_path):
    # The directory already holds a file of the user's: the ranks save next to it (in place).
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "tokenizer.json").write_text("{}")
    results = notebook_launcher(
        run_and_resume,
        (str(tmp_path / "ck"),),
        num_processes=2,
        start_method="fork",
        return_all=True,
        **QUIET,
    )
    for uninterrupted, resumed in results:
        assert resumed["micro_steps"] == uninterrupted["micro_steps"] == 6 * EPOCHS
        for key in ("params", "adam"):
            for a, b in zip(uninterrupted[key], resumed[key], strict=True):
                assert torch.equal(a, b), key
        assert uninterrupted["lr"] == resumed["lr"]
        assert uninterrupted["scale"] == resumed["scale"]
        torch.testing.assert_close(uninterrupted["draws"][0], resumed["draws"][0], rtol=0, atol=0)
        assert uninterrupted["draws"][1:] == resumed["draws"][1:]
    files = sorted(os.listdir(tmp_path / "ck"))
    assert files == sorted(
        [
            "custom_checkpoint_0.pkl",
            "model.safetensors",
            "nbtrain_checkpoint.json",
            "optimizer.bin",
            "random_states_0.pkl",
            "random_states_1.pkl",
            "scaler.pt",
            "scheduler.bin",
            "tokenizer.json",
        ]
    )
    assert (tmp_path / "ck" / "tokenizer.json").read_text() == "{}"
    assert sorted(os.listdir(tmp_path)) == ["ck"], "no partial or old directory left behind"


class Value:
    def __init__(self, value: int, die_on_save: int | None = None) -> None:
        self.value = value
        self.die_on_save = die_on_save

    def state_dict(self) -> dict:
        if self.value == self.die_on_save:
            os._exit(3)  # killed in the middle of save_state: files already half written
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


def save_then_die(directory: str) -> None:
    acc = Accelerator()
    model = acc.prepare(torch.nn.Linear(2, 2))
    value = Value(1, die_on_save=2)
    acc.register_for_checkpointing(value)
    acc.save_state(directory)
    value.value = 2
    with torch.no_grad():
        acc.unwrap_model(model).weight.fill_(7.0)
    acc.save_state(directory)


def load_value(directory: str) -> tuple[int, float, str]:
    acc = Accelerator()
    model = acc.prepare(torch.nn.Linear(2, 2))
    value = Value(0)
    acc.register_for_checkpointing(value)
    source = acc.load_state(directory)
    return value.value, float(acc.unwrap_model(model).weight[0, 0]), source


def test_a_save_killed_midway_leaves_the_previous_checkpoint(tmp_path):
    directory = str(tmp_path / "ck")
    with pytest.raises(WorkerError) as info:
        notebook_launcher(
            save_then_die, (directory,), num_processes=2, start_method="fork", **QUIET
        )
    assert info.value.rank == 0 and info.value.exitcode == 3
    assert (tmp_path / ".ck.partial").is_dir(), "the interrupted save had started writing"
    value, weight, source = notebook_launcher(
        load_value, (directory,), num_processes=2, start_method="fork", **QUIET
    )
    assert (value, source) == (1, directory)
    assert weight != 7.0


def load_into_two_ranks(directory: str) -> None:
    acc = Accelerator()
    acc.prepare(torch.nn.Linear(2, 2))
    acc.load_state(directory)


def save_one_rank(directory: str) -> None:
    acc = Accelerator()
    acc.prepare(torch.nn.Linear(2, 2))
    acc.save_state(directory)


def test_load_state_misuse_is_explained(tmp_path):
    with pytest.raises(WorkerError, match="there is no checkpoint at that path") as info:
        notebook_launcher(
            load_into_two_ranks,
            (str(tmp_path / "missing"),),
            num_processes=2,
            start_method="fork",
            **QUIET,
        )
    assert info.value.type_name == "FileNotFoundError"
    notebook_launcher(save_one_rank, (str(tmp_path / "one"),), num_processes=1, **QUIET)
    with pytest.raises(WorkerError, match=r"written by 1 rank\(s\), but this run has 2"):
        notebook_launcher(
            load_into_two_ranks,
            (str(tmp_path / "one"),),
            num_processes=2,
            start_method="fork",
            **QUIET,
        )
