"""Code written for Hugging Face Accelerate runs with nbtrain's Accelerator after changing the
import: the state view, the constructor arguments, the helper methods the Accelerate examples and
the transformers ``*_no_trainer`` scripts use. One plain process (the multi-rank side of these is
in tests/multiprocess/test_accelerator_collectives.py)."""

from __future__ import annotations

import gc
import io
import logging
import warnings
import weakref

import pytest
import torch
import torch._dynamo  # (torch optimizers import it, setting an env variable)
from torch.nn.functional import mse_loss
from torch.utils.data import DataLoader, TensorDataset

from nbtrain import Accelerator, DistributedType, set_seed
from nbtrain.accelerator.front import compat


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "ACCELERATE_MIXED_PRECISION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(compat, "_WARNED", set())  # one-time warnings: once per test


def loader(samples: int = 9, batch: int = 2, **options) -> DataLoader:
    x = torch.arange(samples * 2, dtype=torch.float32).reshape(samples, 2)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=batch, **options)


def test_the_state_answers_like_accelerates(caplog):
    acc = Accelerator(mixed_precision="bf16")
    state = acc.state
    assert (state.num_processes, state.process_index, state.local_process_index) == (1, 0, 0)
    assert state.device == torch.device("cpu") and state.mixed_precision == "bf16"
    assert state.distributed_type == DistributedType.NO == "NO"
    assert state.is_main_process and not state.use_distributed
    assert state.deepspeed_plugin is None and state.fsdp_plugin is None
    assert repr(state) == (
        "Distributed environment: NO\nNum processes: 1\nProcess index: 0\n"
        "Local process index: 0\nDevice: cpu\n\nMixed precision type: bf16\n"
    )
    with caplog.at_level(logging.INFO):
        logging.getLogger("script").info(acc.state)  # as the *_no_trainer scripts log it
    assert "Num processes: 1" in caplog.text


def test_rng_and_compile_arguments_are_accepted_with_one_warning(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # log_with= is a feature now (test_trackers.py)
        acc = Accelerator(log_with="tensorboard", project_dir=str(tmp_path), dynamo_backend="no")
    assert acc.project_dir == acc.logging_dir == str(tmp_path)
    with pytest.warns(UserWarning, match="seeds every prepared dataloader"):
        Accelerator(rng_types=["generator"])
    with pytest.warns(UserWarning, match=r"torch\.compile\(model\)"):
        Accelerator(dynamo_backend="inductor")


def test_one_time_warnings_point_at_the_line_that_made_the_accelerator():
    from accelerate.utils import ProfileKwargs

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Accelerator(kwargs_handlers=[ProfileKwargs()])  # handlers.py warns
        Accelerator(rng_types=["generator"])  # compat.py warns
    assert [w.filename for w in caught] == [__file__, __file__], [str(w) for w in caught]
    assert "ProfileKwargs is not used" in str(caught[0].message)


def test_parallelism_plugins_and_fp8_are_refused_clearly():
    from accelerate.utils import (
        DDPCommunicationHookType,
        DistributedDataParallelKwargs,
        MSAMPRecipeKwargs,
        ProfileKwargs,
    )

    refused = r"fsdp_plugin=builtins.object.*from nbtrain import FullyShardedDataParallelPlugin"
    with pytest.raises(TypeError, match=refused):
        Accelerator(fsdp_plugin=object())  # Accelerate's own plugin object is not nbtrain's
    with pytest.raises(ValueError, match="DeepSpeed"):
        Accelerator(deepspeed_plugin=object())
    with pytest.raises(ValueError, match="fp8 training is not supported"):
        Accelerator(kwargs_handlers=[MSAMPRecipeKwargs()])
    with pytest.raises(ValueError, match="comm_hook"):
        hook = DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.FP16)
        Accelerator(kwargs_handlers=[hook])
    with pytest.raises(ValueError, match="two DistributedDataParallelKwargs"):
        Accelerator(
            kwargs_handlers=[DistributedDataParallelKwargs(), DistributedDataParallelKwargs()]
        )
    with pytest.warns(UserWarning, match="ProfileKwargs is not used"):
        Accelerator(kwargs_handlers=[ProfileKwargs()])


def test_dataloader_configuration_and_step_scheduler_with_optimizer():
    from accelerate.utils import DataLoaderConfiguration

    acc = Accelerator(
        dataloader_config=DataLoaderConfiguration(even_batches=False, data_seed=5),
        gradient_accumulation_steps=2,
        step_scheduler_with_optimizer=False,
    )
    assert (acc.split_batches, acc.even_batches) == (False, False)
    orders = []
    for draw in range(2):
        torch.manual_seed(draw)  # the global RNG differs; data_seed fixes the shuffling
        data = acc.prepare(loader(shuffle=True))
        orders.append([x[:, 0].tolist() for x, _ in data])
    assert orders[0] == orders[1]
    assert acc.dataloader_config.data_seed == 5  # the user's object, as in Accelerate
    dispatching = DataLoaderConfiguration(dispatch_batches=True)
    assert Accelerator(dataloader_config=dispatching).dispatch_batches
    with pytest.raises(TypeError, match="data_seed='5'"):
        Accelerator(dataloader_config=DataLoaderConfiguration(data_seed="5"))
    # step_scheduler_with_optimizer=False: the scheduler steps whenever the script steps it.
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
    model, optimizer, schedule, data = acc.prepare(model, optimizer, schedule, loader(4, 1))
    for x, y in data:
        with acc.accumulate(model):
            acc.backward(mse_loss(model(x), y))
            optimizer.step()
            with warnings.catch_warnings():  # (torch: "scheduler stepped before optimizer")
                warnings.simplefilter("ignore")
                schedule.step()
    assert schedule.get_last_lr() == [0.5**4]


def test_free_memory_forgets_the_prepared_objects():
    acc = Accelerator(gradient_accumulation_steps=2)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, _ = acc.prepare(model, optimizer, loader())
    with acc.accumulate(model):
        pass
    gone = weakref.ref(acc.unwrap_model(model))
    model, optimizer = acc.free_memory(model, optimizer)
    assert (model, optimizer) == (None, None) and acc.step == 0
    gc.collect()
    assert gone() is None, "the Accelerator holds no reference any more"
    acc.prepare(torch.nn.Linear(3, 1))
    assert len(acc._training_state().models) == 1  # what save_state would write now
    assert acc.clear() == []


def test_free_memory_lets_the_strategy_forget_its_parameters():
    # XLA's strategy keeps hooks and per-parameter state (tests/xla covers what it drops).
    acc = Accelerator()
    forgotten = []
    acc._strategy.forget = lambda: forgotten.append(True)  # type: ignore[attr-defined]
    acc.free_memory()
    assert forgotten == [True]


def test_model_helpers_triggers_and_main_process_decorators(tmp_path):
    acc = Accelerator(mixed_precision="bf16")
    frozen = acc.prepare_model(torch.nn.Linear(2, 2), evaluation_mode=True)
    assert frozen(torch.ones(1, 2)).dtype == torch.float32  # autocast applied, fp32 outputs
    assert set(acc.get_state_dict(frozen)) == {"weight", "bias"}
    with acc.autocast(autocast_handler=compat_autocast(enabled=False)):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    with acc.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    assert not acc.check_trigger()
    acc.set_trigger()
    assert acc.check_trigger() and not acc.check_trigger(), "raised once, then lowered"
    with acc.trigger_sync_in_backward(frozen):  # one process: nothing to synchronise
        pass
    buffer = io.BytesIO()
    acc.save({"a": torch.ones(1)}, buffer)
    assert buffer.getvalue()
    calls = []
    for decorate in (acc.on_local_main_process, acc.on_last_process):
        decorate(lambda: calls.append(1))()
    acc.on_process(process_index=0)(lambda: calls.append(1))()
    with acc.local_main_process_first():
        calls.append(1)
    assert calls == [1, 1, 1, 1] and not acc.use_distributed


def compat_autocast(**options):
    from accelerate.utils import AutocastKwargs

    return AutocastKwargs(**options)


def accelerate_style_run(directory: str, resume: bool) -> list[list[float]]:
    """The resume logic of Accelerate's checkpointing examples: load_state, then
    skip_first_batches in the epoch the checkpoint was saved in."""
    set_seed(0)
    acc = Accelerator()
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, data = acc.prepare(model, optimizer, loader(9, 2, shuffle=True))
    starting_epoch, resume_step = 0, None
    if resume:
        acc.load_state(directory)
        starting_epoch, resume_step = 1, 2  # from the checkpoint's name, as the examples do
    seen = []
    for epoch in range(starting_epoch, 3):
        if resume and epoch == starting_epoch:
            active = acc.skip_first_batches(data, resume_step)
        else:
            active = data
        for step, (x, y) in enumerate(active):
            acc.backward(mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            seen.append(x[:, 0].tolist())
            if not resume and epoch == 1 and step == 1:
                acc.save_state(directory)
    return seen + [p.detach().flatten().tolist() for p in model.parameters()]


def test_load_state_then_skip_first_batches_as_accelerates_examples_do(tmp_path):
    uninterrupted = accelerate_style_run(str(tmp_path / "step_7"), resume=False)
    resumed = accelerate_style_run(str(tmp_path / "step_7"), resume=True)
    assert resumed == uninterrupted[7:], "no batch skipped twice, none repeated"


def test_dataloader_config_join_and_state_in_one_process(recwarn):
    from accelerate.utils import DataLoaderConfiguration

    acc = Accelerator()
    assert acc.dataloader_config.even_batches and not acc.dispatch_batches
    acc.dataloader_config = DataLoaderConfiguration(split_batches=True)  # as Accelerate's tests do
    assert acc.split_batches
    with acc.join_uneven_inputs([torch.nn.Linear(1, 1)]):  # one process: nothing to join
        pass
    assert not recwarn.list
    with (
        pytest.raises(TypeError, match=r"join_uneven_inputs\(joinables="),
        acc.join_uneven_inputs(torch.nn.Linear(1, 1)),
    ):
        pass
    with (
        pytest.raises(TypeError, match=r"even_batches='no'"),
        acc.join_uneven_inputs([], even_batches="no"),
    ):
        pass
    with pytest.raises(AttributeError, match=r"accelerator\.state .* no attribute 'nothing'"):
        acc.state.nothing  # noqa: B018
    assert acc.state.distributed_type == "NO" and DistributedType.DEEPSPEED == "DEEPSPEED"
