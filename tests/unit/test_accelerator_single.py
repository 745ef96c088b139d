"""The Accelerator in one plain Python process (no launcher): DistributedType.NO, accumulation
rules, precision, errors for misuse, checkpoints on disk."""

from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import os
import random

import numpy as np
import pytest
import torch
import torch._dynamo  # (torch optimizers import it, setting an env variable)
from torch.nn.functional import mse_loss
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from nbtrain import Accelerator, DistributedType, set_seed
from nbtrain.accelerator.checkpoint import dirs as checkpoint_dirs
from nbtrain.accelerator.checkpoint import state as checkpoint
from nbtrain.accelerator.front.core import GradientAccumulationPlugin
from nbtrain.accelerator.front.training import MicroStep
from nbtrain.accelerator.training.accumulation import GradientState


@pytest.fixture(autouse=True)
def _no_launch_env(monkeypatch):
    for name in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "ACCELERATE_MIXED_PRECISION",
        "ACCELERATE_USE_CPU",
    ):
        monkeypatch.delenv(name, raising=False)


def loader(samples: int = 10, batch: int = 2, **options) -> DataLoader:
    x = torch.arange(samples * 2, dtype=torch.float32).reshape(samples, 2)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=batch, **options)


def test_single_process_without_a_launcher():
    acc = Accelerator()
    assert acc.distributed_type is DistributedType.NO
    assert (acc.num_processes, acc.process_index, acc.local_process_index) == (1, 0, 0)
    assert acc.is_main_process and acc.is_local_main_process and acc.is_last_process
    assert acc.device == torch.device("cpu") and acc.mixed_precision == "no"
    assert not acc.use_distributed and acc.sync_gradients and acc.gradient_accumulation_steps == 1
    assert not torch.distributed.is_initialized()


def test_precision_defaults_and_errors(monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    assert Accelerator().mixed_precision == "bf16"
    assert Accelerator(mixed_precision="no").mixed_precision == "no"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp32")
    with pytest.raises(ValueError, match="ACCELERATE_MIXED_PRECISION"):
        Accelerator()
    with pytest.raises(ValueError, match=r"mixed_precision='half'.*'no', 'fp16' or 'bf16'"):
        Accelerator(mixed_precision="half")
    with pytest.raises(ValueError, match="fp8 is not supported"):
        Accelerator(mixed_precision="fp8")


def test_bad_arguments_are_explained():
    with pytest.raises(ValueError, match="gradient_accumulation_steps=0"):
        Accelerator(gradient_accumulation_steps=0)
    with pytest.raises(TypeError, match="cpu='yes'"):
        Accelerator(cpu="yes")
    with pytest.raises(TypeError, match="accepts DistributedDataParallelKwargs"):
        Accelerator(kwargs_handlers=[object()])
    with pytest.raises(ValueError, match="not both"):
        Accelerator(
            gradient_accumulation_steps=2,
            gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2),
        )


def test_prepare_keeps_order_and_refuses_what_it_cannot_prepare():
    acc = Accelerator()
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    got = acc.prepare(schedule, loader(), optimizer, model, None)
    assert [type(x).__name__ for x in got] == [
        "PreparedScheduler",
        "PreparedDataLoader",
        "PreparedOptimizer",
        "Linear",
        "NoneType",
    ]
    assert acc.prepare(model) is model and acc.unwrap_model(model) is model
    assert isinstance(got[2], torch.optim.Optimizer), "schedulers accept a prepared optimizer"
    with pytest.raises(TypeError, match=r"object #1.*Wrap a Dataset in a DataLoader"):
        acc.prepare(model, TensorDataset(torch.ones(2)))
    with pytest.raises(TypeError, match=r"the class Linear.*Pass an instance"):
        acc.prepare(torch.nn.Linear)
    with pytest.raises(TypeError, match=r"a builtins\.str"):
        acc.prepare("model")


def test_backward_before_prepare_is_explained(monkeypatch):
    # A process in which nothing was prepared yet (earlier tests here prepared models, which an
    # Accelerator made later may train: the registry is per process, as Accelerate's state).
    import weakref

    from nbtrain.accelerator.front import base as front_base
    from nbtrain.accelerator.front import training as front_training

    nothing: weakref.WeakSet = weakref.WeakSet()
    monkeypatch.setattr(front_base, "PREPARED_MODELS", nothing)
    monkeypatch.setattr(front_training, "PREPARED_MODELS", nothing)
    acc = Accelerator()
    loss = torch.nn.Linear(2, 1)(torch.ones(1, 2)).sum()
    with pytest.raises(RuntimeError, match=r"backward\(\) was called before accelerator.prepare"):
        acc.backward(loss)


def sync_pattern(acc: Accelerator, batches: int, epochs: int = 1) -> list[bool]:
    model = torch.nn.Linear(2, 1)
    model, data = acc.prepare(model, loader(samples=batches, batch=1))
    pattern = []
    for _ in range(epochs):
        for _batch in data:
            with acc.accumulate(model):
                pattern.append(acc.sync_gradients)
    return pattern


class RecordingStrategy:
    """Stands in for DDP's no_sync (one process has no DDP): records entries and exits."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    @contextlib.contextmanager
    def no_sync(self, model: object):  # type: ignore[no-untyped-def]
        self.events.append(("enter", model))
        try:
            yield
        finally:
            self.events.append(("exit", model))


def test_accumulate_skips_sync_only_inside_non_final_micro_steps_and_lets_errors_through():
    strategy = RecordingStrategy()
    state = GradientState(num_steps=2)
    with MicroStep(state, strategy, ("a", "b")):
        assert strategy.events == [("enter", "a"), ("enter", "b")]
        assert not state.sync_gradients
    assert strategy.events[2:] == [("exit", "b"), ("exit", "a")]
    strategy.events.clear()
    with MicroStep(state, strategy, ("a",)):  # the synchronising step: no no_sync
        assert state.sync_gradients
    assert strategy.events == []
    with pytest.raises(ValueError, match="inside"), MicroStep(state, strategy, ("a",)):
        raise ValueError("inside")
    assert strategy.events == [("enter", "a"), ("exit", "a")]


def test_accumulate_works_as_a_decorator_too():
    acc = Accelerator(gradient_accumulation_steps=2)
    model = acc.prepare(torch.nn.Linear(2, 1))
    seen = []

    @acc.accumulate(model)
    def micro_step() -> None:
        seen.append(acc.sync_gradients)

    for _ in range(4):
        micro_step()
    assert seen == [False, True, False, True]


def test_accumulation_syncs_every_n_and_at_the_end_of_the_dataloader():
    assert (
        sync_pattern(Accelerator(gradient_accumulation_steps=2), 5, 2)
        == [False, True, False, True, True] * 2
    )
    plugin = GradientAccumulationPlugin(num_steps=2, sync_with_dataloader=False)
    # Counting across epochs instead: no forced step on the last batch (acc #1847).
    assert sync_pattern(Accelerator(gradient_accumulation_plugin=plugin), 5, 2) == [
        False,
        True,
        False,
        True,
        False,
        True,
        False,
        True,
        False,
        True,
    ]


def test_minibatches_of_the_last_batch_all_sync_as_documented():
    """acc #1847: inside the dataloader's last batch every accumulate() block syncs."""
    acc = Accelerator(gradient_accumulation_steps=4)
    model, data = acc.prepare(torch.nn.Linear(2, 1), loader(samples=4, batch=2))
    pattern = []
    for x, _y in data:
        for _row in x:
            with acc.accumulate(model):
                pattern.append(acc.sync_gradients)
    assert pattern == [False, False, True, True]


def test_optimizer_and_scheduler_act_only_on_synced_steps():
    acc = Accelerator(gradient_accumulation_steps=3)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    model, optimizer, schedule, data = acc.prepare(model, optimizer, schedule, loader(6, 1))
    weights, lrs = [], []
    for x, y in data:
        with acc.accumulate(model):
            acc.backward(mse_loss(model(x), y))
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
        weights.append(model.weight.detach().clone())
        lrs.append(schedule.get_last_lr()[0])
    changed = [not torch.equal(a, b) for a, b in itertools.pairwise(weights)]
    assert changed == [False, True, False, False, True]
    assert lrs == [1.0, 1.0, 0.5, 0.5, 0.5, 0.25]


def test_clipping_waits_for_the_full_gradient():
    acc = Accelerator(gradient_accumulation_steps=2)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, data = acc.prepare(model, optimizer, loader(4, 1))
    norms = []
    for x, y in data:
        with acc.accumulate(model):
            acc.backward(mse_loss(model(x), y) * 100)
            before = model.weight.grad.clone()
            norms.append(acc.clip_grad_norm_(model.parameters(), 0.01))
            clipped = not torch.equal(before, model.weight.grad)
            assert clipped == acc.sync_gradients, "partial gradients are left alone"
            acc.clip_grad_value_(model.parameters(), 0.001)
            optimizer.step()
            optimizer.zero_grad()
    assert all(float(n) > 0.01 for n in norms)


def test_fp16_scaler_skips_steps_with_inf_gradients():
    acc = Accelerator(mixed_precision="fp16")
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
    model, optimizer, schedule = acc.prepare(model, optimizer, schedule)
    weight = model.weight.detach().clone()
    acc.backward(model(torch.ones(1, 2)).sum())
    model.weight.grad[0, 0] = float("inf")
    acc.clip_grad_norm_(model.parameters(), 1.0)  # unscales first; must not break the step
    optimizer.step()
    schedule.step()
    assert acc.optimizer_step_was_skipped and torch.equal(model.weight, weight)
    assert schedule.get_last_lr() == [0.1], "no scheduler step after a skipped optimizer step"
    optimizer.zero_grad()
    acc.backward(model(torch.ones(1, 2)).sum())
    optimizer.step()
    schedule.step()
    assert not acc.optimizer_step_was_skipped and not torch.equal(model.weight, weight)


def test_world_of_one_collectives_and_helpers(capsys):
    acc = Accelerator()
    t = torch.arange(3)
    assert acc.gather(t) is t and torch.equal(acc.reduce(t, "mean"), t.float())
    assert acc.pad_across_processes(t) is t and acc.broadcast(t) is t
    with pytest.raises(TypeError, match="gather_for_metrics"):
        acc.gather(["text"])
    with pytest.raises(ValueError, match="reduction='avg'"):
        acc.reduce(t, "avg")
    with acc.split_between_processes({"a": [1, 2, 3]}) as mine:
        assert mine == {"a": [1, 2, 3]}
    acc.wait_for_everyone()
    with acc.main_process_first():
        pass
    acc.print("hello")
    assert capsys.readouterr().out == "hello\n"
    assert acc.on_main_process(lambda: 5)() == 5
    assert acc.on_process(process_index=1)(lambda: 5)() is None


def test_prepared_loader_positions_epochs_and_skips():
    from accelerate.utils import DataLoaderConfiguration

    # use_seedable_sampler: each epoch's order is drawn from seed + epoch, so set_epoch replays.
    acc = Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    data = acc.prepare(loader(7, 2, shuffle=True))
    assert len(data) == 4 and data.batch_size == 2 and data.total_batch_size == 2
    first = [x[:, 0].tolist() for x, _ in data]
    second = [x[:, 0].tolist() for x, _ in data]
    assert first != second and data.iteration == 2
    data.set_epoch(0)
    assert [x[:, 0].tolist() for x, _ in data] == first, "the same epoch, the same order"
    acc.skip_first_batches(data, 3)
    assert [x[:, 0].tolist() for x, _ in data] == second[3:]
    # By default the order follows the loader's own generator, as a plain DataLoader's does:
    # seeding it after prepare() takes effect, and the prepared loader draws what the raw one does.
    generator = torch.Generator()
    raw = loader(7, 2, shuffle=True, generator=generator)
    data = Accelerator().prepare(raw)
    generator.manual_seed(42)
    followed = [[x[:, 0].tolist() for x, _ in data] for _ in range(2)]
    generator.manual_seed(42)
    assert followed == [[x[:, 0].tolist() for x, _ in raw] for _ in range(2)]
    assert followed[0] != followed[1]
    plain = loader(7, 2)
    assert len(acc.skip_first_batches(plain, 3)) == 1
    assert [len(x) for x, _ in acc.skip_first_batches(plain, 2)] == [2, 1]


class Countdown(IterableDataset):
    def __iter__(self):
        return iter(range(5, 0, -1))


def test_iterable_datasets_are_prepared_too():
    acc = Accelerator()
    data = acc.prepare(DataLoader(Countdown(), batch_size=2))
    got = [acc.gather_for_metrics(batch).tolist() for batch in data]
    assert got == [[5, 4], [3, 2], [1]]
    unbatched = acc.prepare(DataLoader(Countdown(), batch_size=None))
    assert list(unbatched) == [5, 4, 3, 2, 1]


def training_run(directory, save_after=None, load=False):
    set_seed(0)
    acc = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Dropout(0.5), torch.nn.Linear(4, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model, optimizer, data = acc.prepare(model, optimizer, loader(9, 2, shuffle=True))
    if load:
        acc.load_state(directory)
    seen = []
    for step, (x, y) in enumerate(data):
        acc.backward(mse_loss(model(x), y + random.random() + float(np.random.rand())))
        optimizer.step()
        optimizer.zero_grad()
        seen.append(x[:, 0].tolist())
        if step + 1 == save_after:
            acc.save_state(directory)
    return seen, [p.detach().clone() for p in model.parameters()]


def test_save_and_load_state_resume_the_epoch_exactly(tmp_path):
    directory = str(tmp_path / "ck")
    seen, params = training_run(directory, save_after=2)
    resumed_seen, resumed_params = training_run(directory, load=True)
    assert resumed_seen == seen[2:]
    assert all(torch.equal(a, b) for a, b in zip(params, resumed_params, strict=True))
    meta = json.loads((tmp_path / "ck" / checkpoint_dirs.MARKER).read_text())
    assert meta["world_size"] == 1 and meta["models"] == 1 and meta["dataloaders"] == 1


def test_checkpoint_directories_are_replaced_atomically(tmp_path):
    acc = Accelerator()
    model = acc.prepare(torch.nn.Linear(2, 1))
    final = tmp_path / "ck"
    slots = checkpoint_dirs.Slots.of(final)
    acc.save_state(str(final))
    assert sorted(os.listdir(tmp_path)) == ["ck"]
    # A save killed while writing: a partial directory without the marker is never loaded.
    slots.partial.mkdir()
    (slots.partial / "model.safetensors").write_bytes(b"half")
    assert checkpoint_dirs.resolve_complete(final) == final
    # Killed between the two renames: the previous checkpoint is found at .old.
    final.rename(slots.old)
    assert acc.load_state(str(final)) == str(slots.old)
    # The next save replaces everything and removes .old only once the new one is in place.
    with torch.no_grad():
        model.weight.fill_(3.0)
    acc.save_state(str(final))
    assert sorted(os.listdir(tmp_path)) == ["ck"]
    with torch.no_grad():
        model.weight.fill_(0.0)
    acc.load_state(str(final))
    assert (model.weight == 3.0).all()


def test_checkpoint_misuse_is_explained(tmp_path):
    acc = Accelerator()
    acc.prepare(torch.nn.Linear(2, 1))
    with pytest.raises(ValueError, match=r"needs output_dir.*automatic_checkpoint_naming"):
        acc.save_state()
    with pytest.raises(ValueError, match="needs input_dir"):
        acc.load_state()
    with pytest.raises(FileNotFoundError, match="no checkpoint at that path"):
        acc.load_state(str(tmp_path / "nothing"))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(FileNotFoundError, match="not a complete nbtrain checkpoint"):
        acc.load_state(str(tmp_path / "notes"))
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="that path is a file"):
        acc.save_state(str(tmp_path / "file"))
    acc.save_state(str(tmp_path / "ck"))
    other = Accelerator()
    other.prepare(torch.nn.Linear(2, 1), torch.nn.Linear(2, 1))
    with pytest.raises(ValueError, match="holds 1 models but this Accelerator has 2"):
        other.load_state(str(tmp_path / "ck"))
    with pytest.raises(TypeError, match="state_dict"):
        acc.register_for_checkpointing(object())


def test_save_model_with_and_without_safetensors(tmp_path, monkeypatch):
    acc = Accelerator(mixed_precision="bf16")
    model = acc.prepare(torch.nn.Linear(3, 2))
    acc.save_model(model, str(tmp_path / "safe"))
    from safetensors.torch import load_file

    loaded = load_file(str(tmp_path / "safe" / "model.safetensors"))
    assert torch.equal(loaded["weight"], model.weight)
    monkeypatch.setattr(checkpoint, "safetensors_available", lambda: False)
    acc.save_model(model, str(tmp_path / "plain"))
    state = torch.load(tmp_path / "plain" / "pytorch_model.bin", weights_only=True)
    assert torch.equal(state["bias"], model.bias)
    plain = acc.unwrap_model(model, keep_fp32_wrapper=False)
    assert "forward" not in vars(plain) and plain(torch.ones(1, 3)).dtype == torch.float32


def test_set_seed_reproduces_every_generator():
    def draws():
        return torch.rand(2).tolist(), np.random.rand(2).tolist(), random.random()

    set_seed(7)
    first = draws()
    set_seed(7)
    assert draws() == first
    set_seed(7, device_specific=True)  # rank 0: the same seed
    assert draws() == first
    with pytest.raises(TypeError, match="needs an int"):
        set_seed("7")


def test_progress_and_log_delegate_to_reporting(capsys):
    acc = Accelerator()
    assert list(acc.progress(range(3), desc="train")) == [0, 1, 2]
    assert "train" in capsys.readouterr().err
    acc.log({"loss": 0.5}, step=1)
    assert "loss 0.5" in capsys.readouterr().out
    with pytest.raises(TypeError):  # reporting's own argument checks come through
        acc.log({"loss": 0.5}, step="one")


class EvenOddBatches:
    """A custom batch sampler: even indices first, then odd ones; records set_epoch calls."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __iter__(self):
        order = list(range(0, self.length, 2)) + list(range(1, self.length, 2))
        return iter([order[i : i + 2] for i in range(0, self.length, 2)])

    def __len__(self) -> int:
        return (self.length + 1) // 2


def test_custom_batch_samplers_are_kept_and_told_the_epoch():
    acc = Accelerator()
    data = acc.prepare(DataLoader(TensorDataset(torch.arange(5)), batch_sampler=EvenOddBatches(5)))
    assert [x.tolist() for (x,) in data] == [[0, 2], [4, 1], [3]]
    assert [x.tolist() for (x,) in data] == [[0, 2], [4, 1], [3]]
    kept = data.batch_sampler.batch_sampler
    assert isinstance(kept, EvenOddBatches) and kept is not data.base_dataloader.batch_sampler
    assert kept.epochs == [0, 1]


def test_kwargs_handlers_from_nbtrain_and_from_accelerate():
    from datetime import timedelta

    import accelerate.utils

    from nbtrain.accelerator.front import handlers

    options = handlers.collect(
        [
            accelerate.utils.DistributedDataParallelKwargs(find_unused_parameters=True),
            handlers.InitProcessGroupKwargs(timeout=timedelta(seconds=5)),
            handlers.AutocastKwargs(cache_enabled=False),
        ]
    )
    assert options.ddp == {"find_unused_parameters": True}
    assert options.timeout == 5.0 and options.autocast == {"cache_enabled": False}
    acc = Accelerator(
        mixed_precision="fp16", kwargs_handlers=[handlers.GradScalerKwargs(init_scale=1024.0)]
    )
    assert acc.scaler is not None and acc.scaler.get_scale() == 1024.0
    with pytest.raises(ValueError, match="init_method"):
        handlers.collect([handlers.InitProcessGroupKwargs(init_method="tcp://x:1")])


def test_a_scheduler_made_from_the_prepared_optimizer_steps_with_it():
    import warnings

    acc = Accelerator(gradient_accumulation_steps=2)
    model = torch.nn.Linear(2, 1)
    model, optimizer, data = acc.prepare(
        model, torch.optim.SGD(model.parameters(), lr=1.0), loader(4, 1)
    )
    schedule = acc.prepare(torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "lr_scheduler.step() before optimizer.step()"
        for x, y in data:
            with acc.accumulate(model):
                acc.backward(mse_loss(model(x), y))
                optimizer.step()
                schedule.step()
                optimizer.zero_grad()
    assert schedule.get_last_lr() == [0.25]


# -- checkpoint directories holding other files --------------------------------------------------


class Counter:
    """A registered object; ``fail`` makes its state_dict raise (a save stopped midway)."""

    def __init__(self, value: int) -> None:
        self.value = value
        self.fail = False

    def state_dict(self) -> dict:
        if self.fail:
            raise RuntimeError("stopped while saving")
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


def counted(mixed_precision: str = "no") -> tuple[Accelerator, torch.nn.Module, Counter]:
    acc = Accelerator(mixed_precision=mixed_precision)
    model = acc.prepare(torch.nn.Linear(2, 1))
    counter = Counter(0)
    acc.register_for_checkpointing(counter)
    return acc, model, counter


def generation(acc: Accelerator, model: torch.nn.Module, counter: Counter, value: int) -> None:
    with torch.no_grad():
        acc.unwrap_model(model).weight.fill_(float(value))
    counter.value = value


def loaded_generation(directory, mixed_precision: str = "no") -> tuple[float, int]:
    acc, model, counter = counted(mixed_precision)
    acc.load_state(str(directory))
    return float(acc.unwrap_model(model).weight[0, 0].item()), counter.value


def user_files(directory) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): path.read_text()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
        and path.suffix in {".json", ".txt"}
        and path.name != checkpoint_dirs.MARKER
    }


def test_save_state_into_a_directory_with_other_files_keeps_them(tmp_path):
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    (out / "tokenizer.json").write_text("{}")
    (out / "logs" / "run.txt").write_text("epoch 1")
    theirs = user_files(out)
    acc, model, counter = counted("fp16")  # (a grad scaler: scaler.pt)
    generation(acc, model, counter, 1)
    acc.save_state(str(out))
    assert user_files(out) == theirs
    assert (out / "scaler.pt").exists() and not (out / checkpoint_dirs.IN_PLACE).exists()
    assert sorted(os.listdir(tmp_path)) == ["out"], "written in place: nothing next to it"
    assert loaded_generation(out, "fp16") == (1.0, 1)
    # Saving again replaces nbtrain's own files only: the user's stay, and a file the previous
    # save wrote that this one does not (scaler.pt, no fp16 now) goes.
    acc, model, counter = counted()
    generation(acc, model, counter, 2)
    acc.save_state(str(out))
    assert user_files(out) == theirs and not (out / "scaler.pt").exists()
    assert loaded_generation(out) == (2.0, 2)


def saved_in_place_then_trained(tmp_path):
    """A checkpoint of generation 1 saved in place (beside the user's notes.txt), and the
    Accelerator trained on to generation 2, not saved yet."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    acc, model, counter = counted()
    generation(acc, model, counter, 1)
    acc.save_state(str(out))
    generation(acc, model, counter, 2)
    return out, acc, model, counter


def test_an_in_place_save_stopped_before_its_commit_leaves_the_previous_checkpoint(tmp_path):
    out, acc, model, counter = saved_in_place_then_trained(tmp_path)
    counter.fail = True
    with pytest.raises(RuntimeError, match="stopped while saving"):
        acc.save_state(str(out))
    assert (out / checkpoint_dirs.IN_PLACE).is_dir(), "it had started writing"
    assert loaded_generation(out) == (1.0, 1)
    counter.fail = False
    generation(acc, model, counter, 3)
    acc.save_state(str(out))  # also clears what the stopped save left
    assert not (out / checkpoint_dirs.IN_PLACE).exists()
    assert loaded_generation(out) == (3.0, 3) and user_files(out) == {"notes.txt": "mine"}


def test_an_in_place_save_stopped_after_its_commit_is_finished_by_the_next_load(
    tmp_path, monkeypatch
):
    out, acc, _, _ = saved_in_place_then_trained(tmp_path)
    moves = []

    def replace_then_stop(source, target):  # the process dies after moving one file
        partial = checkpoint_dirs.IN_PLACE
        moving = partial in str(source) and partial not in str(target)
        if moving and moves:
            raise KeyboardInterrupt
        if moving:
            moves.append(target)
        os.rename(source, target)

    monkeypatch.setattr(checkpoint_dirs.os, "replace", replace_then_stop)
    with pytest.raises(KeyboardInterrupt):
        acc.save_state(str(out))
    monkeypatch.undo()
    assert not checkpoint_dirs.is_complete(out), "mid-move: the directory alone is not a checkpoint"
    assert loaded_generation(out) == (2.0, 2), "committed: the new checkpoint is finished"
    assert checkpoint_dirs.is_complete(out) and not (out / checkpoint_dirs.IN_PLACE).exists()
    assert user_files(out) == {"notes.txt": "mine"}


def test_files_added_to_a_checkpoint_while_it_is_replaced_are_carried_over(tmp_path, monkeypatch):
    ck = tmp_path / "ck"
    acc, model, counter = counted()
    generation(acc, model, counter, 1)
    acc.save_state(str(ck))  # a checkpoint of nbtrain's files only: the next save swaps
    written = checkpoint._write_shared

    inodes = []

    def write_and_meanwhile(target, state, safe):  # someone writes into ck during the save
        written(target, state, safe)
        (ck / "late.txt").write_text("late")
        (ck / "sub").mkdir()
        (ck / "sub" / "deep.txt").write_text("deep")
        inodes.append((ck / "late.txt").stat().st_ino)

    monkeypatch.setattr(checkpoint, "_write_shared", write_and_meanwhile)
    generation(acc, model, counter, 2)
    acc.save_state(str(ck))
    assert user_files(ck) == {"late.txt": "late", "sub/deep.txt": "deep"}
    assert (ck / "late.txt").stat().st_ino == inodes[0], "hard-linked, not copied"
    assert sorted(os.listdir(tmp_path)) == ["ck"]
    assert loaded_generation(ck) == (2.0, 2)


def test_checkpoint_files_have_accelerates_names_and_old_checkpoints_load(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "safetensors_available", lambda: False)
    acc, model, counter = counted()
    generation(acc, model, counter, 4)
    acc.save_state(str(tmp_path / "ck"))
    names = set(os.listdir(tmp_path / "ck"))
    assert {"pytorch_model.bin", "random_states_0.pkl", "custom_checkpoint_0.pkl"} <= names
    # The layout of format 1 (model.bin, rank_0.pt) still loads.
    old = tmp_path / "ck"
    os.rename(old / "pytorch_model.bin", old / "model.bin")
    os.rename(old / "random_states_0.pkl", old / "rank_0.pt")
    meta = json.loads((old / checkpoint_dirs.MARKER).read_text())
    (old / checkpoint_dirs.MARKER).write_text(json.dumps({**meta, "format": 1}))
    assert loaded_generation(old) == (4.0, 4)


def test_load_state_passes_accelerates_keyword_arguments_on(tmp_path, monkeypatch):
    class WithExtra(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(2, 1)
            self.extra = torch.nn.Parameter(torch.zeros(1))

    for safe in (True, False):
        monkeypatch.setattr(checkpoint, "safetensors_available", lambda safe=safe: safe)
        directory = str(tmp_path / f"ck{safe}")
        acc = Accelerator()
        acc.prepare(torch.nn.Sequential(torch.nn.Linear(2, 1)))
        acc.save_state(directory)
        other = Accelerator()
        wider = other.prepare(WithExtra())
        with pytest.raises(RuntimeError):  # strict by default: the keys differ
            other.load_state(directory)
        other.load_state(directory, strict=False)  # as model.load_state_dict(strict=False)
        assert torch.equal(wider.extra, torch.zeros(1))
    # load_kwargs reach torch.load of the other states (here: a stricter weights_only).
    acc = Accelerator()
    acc.register_for_checkpointing(Stamp())
    acc.save_state(str(tmp_path / "stamped"))
    acc.load_state(str(tmp_path / "stamped"))
    with pytest.raises(Exception, match="weights_only"):
        acc.load_state(str(tmp_path / "stamped"), load_kwargs={"weights_only": True})


class Stamp:
    """A registered object whose state holds a plain Python object (loaded only when trusted)."""

    def state_dict(self) -> dict:
        return {"when": datetime.date(2024, 1, 1)}

    def load_state_dict(self, state: dict) -> None:
        assert state["when"].year == 2024


def test_automatic_checkpoint_naming_keeps_the_newest(tmp_path):
    from accelerate.utils import ProjectConfiguration

    config = ProjectConfiguration(
        project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2
    )
    acc = Accelerator(project_config=config)
    model = acc.prepare(torch.nn.Linear(2, 1))
    for value in (1.0, 2.0, 3.0):
        with torch.no_grad():
            model.weight.fill_(value)
        acc.save_state()
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["checkpoint_1", "checkpoint_2"]
    assert acc.save_iteration == config.iteration == 3 and acc.project_dir == str(tmp_path)
    with torch.no_grad():
        model.weight.fill_(0.0)
    assert acc.load_state().endswith("checkpoint_2") and (model.weight == 3.0).all()
    config.iteration = 2
    with pytest.raises(FileExistsError, match=r"iteration = 3"):
        acc.save_state()


def test_a_symlinked_checkpoint_directory_stays_a_link(tmp_path):
    (tmp_path / "disk").mkdir()
    (tmp_path / "ck").symlink_to(tmp_path / "disk")
    acc, model, counter = counted()
    for value in (1, 2):
        generation(acc, model, counter, value)
        acc.save_state(str(tmp_path / "ck"))
    assert (tmp_path / "ck").is_symlink() and checkpoint_dirs.is_complete(tmp_path / "disk")
    assert loaded_generation(tmp_path / "ck") == (2.0, 2)


def test_pruning_never_deletes_the_checkpoint_just_saved(tmp_path):
    """A fresh Accelerator restarts the numbering below older checkpoints: its new save is the
    one to keep, with the newest of the others (Accelerate's total_limit counts the new one)."""
    from accelerate.utils import ProjectConfiguration

    def config() -> ProjectConfiguration:
        return ProjectConfiguration(
            project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2
        )

    first = Accelerator(project_config=config())
    first.prepare(torch.nn.Linear(2, 1))
    for _ in range(3):
        first.save_state()
    again = Accelerator(project_config=config())  # numbering starts at 0 again
    again.prepare(torch.nn.Linear(2, 1))
    saved = again.save_state()
    assert saved.endswith("checkpoint_0")
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["checkpoint_0", "checkpoint_2"]
    limit_zero = Accelerator(
        project_config=ProjectConfiguration(
            project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=0,
            iteration=7,
        )
    )
    limit_zero.prepare(torch.nn.Linear(2, 1))
    limit_zero.save_state()
    assert os.listdir(tmp_path / "checkpoints") == ["checkpoint_7"]


def test_a_commit_marker_is_whole_or_absent(tmp_path, monkeypatch):
    """The marker of an in-place save is its commit point: a save stopped while writing it
    leaves no marker (never a torn one), so the previous checkpoint still loads."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # in-place mode
    acc, model, counter = counted()
    generation(acc, model, counter, 1)
    acc.save_state(str(out))
    generation(acc, model, counter, 2)
    real_replace = os.replace

    def crash_on_the_marker(source, destination):
        if str(destination).endswith(checkpoint_dirs.MARKER):
            raise KeyboardInterrupt  # stopped between writing the marker and committing it
        real_replace(source, destination)

    monkeypatch.setattr(os, "replace", crash_on_the_marker)
    with pytest.raises(KeyboardInterrupt):
        acc.save_state(str(out))
    monkeypatch.setattr(os, "replace", real_replace)
    assert not (out / checkpoint_dirs.IN_PLACE / checkpoint_dirs.MARKER).exists()
    assert loaded_generation(out) == (1.0, 1)
    acc.save_state(str(out))
    assert loaded_generation(out) == (2.0, 2) and user_files(out) == {"notes.txt": "mine"}


def test_a_directory_that_appears_during_a_save_is_kept(tmp_path, monkeypatch):
    out = tmp_path / "out"
    acc, model, counter = counted()
    generation(acc, model, counter, 1)
    real_write = checkpoint._write_shared

    def someone_else_creates_it(target, state, safe):
        real_write(target, state, safe)
        out.mkdir()
        (out / "notes.txt").write_text("made meanwhile")

    monkeypatch.setattr(checkpoint, "_write_shared", someone_else_creates_it)
    acc.save_state(str(out))
    assert user_files(out) == {"notes.txt": "made meanwhile"}
    assert loaded_generation(out) == (1.0, 1)


@pytest.mark.parametrize("value", ["fp8", "FP8", "half", 16])
def test_the_launcher_and_the_accelerator_refuse_a_precision_with_one_message(value):
    """The same words after the origin (how the user wrote it) from either place."""
    from nbtrain import notebook_launcher

    with pytest.raises((ValueError, TypeError)) as launcher:
        notebook_launcher(print, num_processes=2, mixed_precision=value)
    with pytest.raises((ValueError, TypeError)) as accelerator:
        Accelerator(mixed_precision=value)
    assert launcher.type is accelerator.type
    in_launcher = str(launcher.value).removeprefix(f"mixed_precision={value!r}")
    in_accelerator = str(accelerator.value).removeprefix(f"Accelerator(mixed_precision={value!r})")
    assert in_launcher == in_accelerator, (str(launcher.value), str(accelerator.value))
    if str(value).lower() == "fp8":
        assert "fp8 is not supported by nbtrain; use 'bf16' or 'fp16'" in in_launcher
