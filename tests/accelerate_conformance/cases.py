"""The cases: each call that the ``main()`` of one of Accelerate's test scripts makes (with its
arguments, its loops unrolled), as a function of the script module. Cases that only run on one
process, or need the network (GLUE, BERT) are not listed."""

from __future__ import annotations

import itertools
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SCRIPTS = "accelerate.test_utils.scripts"


@dataclass(frozen=True)
class Case:
    script: str  # module under accelerate.test_utils.scripts
    name: str
    run: Callable[[Any], None]

    @property
    def id(self) -> str:
        return f"{self.script.rsplit('.', 1)[-1]}::{self.name}"


def _call(function: str, *args: Any, **kwargs: Any) -> Callable[[Any], None]:
    return lambda mod: getattr(mod, function)(*args, **kwargs)


def _with_state(function: str) -> Callable[[Any], None]:
    """test_ops' functions take the state main() made: PartialState() (bound: nbtrain's)."""
    return lambda mod: getattr(mod, function)(mod.PartialState())


def _with_accelerator(function: str) -> Callable[[Any], None]:
    return lambda mod: getattr(mod, function)(mod.Accelerator())


def _join_non_ddp(mod: Any) -> None:
    accelerator = mod.create_accelerator()
    original = accelerator.state.distributed_type
    accelerator.state.distributed_type = mod.DistributedType.FSDP
    mod.test_join_raises_warning_for_non_ddp_distributed(accelerator)
    accelerator.state.distributed_type = original


def _data_loader(kind: str) -> Callable[[Any], None]:
    def run(mod: Any) -> None:
        from torch.utils.data import BatchSampler, DataLoader, RandomSampler, default_collate

        accelerator = mod.create_accelerator()
        dataset = mod.DummyDataset()
        workers, size = mod.NUM_WORKERS, mod.BATCH_SIZE
        if kind in ("shuffle=False", "shuffle=True"):
            shuffle = kind == "shuffle=True"
            loader = DataLoader(dataset, shuffle=shuffle, batch_size=size, num_workers=workers)
        elif kind == "batch_sampler":
            sampler = BatchSampler(RandomSampler(dataset), batch_size=size, drop_last=False)
            loader = DataLoader(dataset, batch_sampler=sampler, num_workers=workers)
        else:
            sampler = BatchSampler(RandomSampler(dataset), batch_size=size, drop_last=False)
            loader = DataLoader(
                dataset,
                sampler=sampler,
                batch_size=None,
                collate_fn=default_collate,
                num_workers=workers,
            )
        mod.test_data_loader(loader, accelerator)

    return run


def _torch_metrics(split: bool, dispatch: bool, length: int = 99) -> Callable[[Any], None]:
    def run(mod: Any) -> None:
        config = mod.DataLoaderConfiguration(split_batches=split, dispatch_batches=dispatch)
        mod.test_torch_metrics(mod.Accelerator(dataloader_config=config), length)

    return run


def _metrics_default(mod: Any) -> None:
    mod.test_torch_metrics(mod.Accelerator(), 512)


def _split_dataset(mod: Any) -> None:
    from datasets import Dataset

    mod.test_split_between_processes_dataset(Dataset)


def _cases() -> list[Case]:
    ops = f"{SCRIPTS}.test_ops"
    sync = f"{SCRIPTS}.test_sync"
    script = f"{SCRIPTS}.test_script"
    loop = f"{SCRIPTS}.test_distributed_data_loop"
    metrics = f"{SCRIPTS}.external_deps.test_metrics"
    cases = [
        Case(ops, name, _with_state(f"test_{name}"))
        for name in (
            "gather",
            "gather_object",
            "gather_non_contiguous",
            "broadcast",
            "pad_across_processes",
            "reduce_sum",
            "reduce_mean",
            "reduce_max",
            "op_checker",
            "copy_tensor_to_devices",
        )
    ]
    cases += [
        Case(sync, "dataloader_break", _call("test_dataloader_break")),
        Case(sync, "distributed_sync", _with_accelerator("test_distributed_sync")),
        Case(
            sync,
            "distributed_sync_multiple_fwd",
            _with_accelerator("test_distributed_sync_multiple_fwd"),
        ),
    ]
    for split, dispatch, each in itertools.product((True, False), repeat=3):
        flags = f"split={split},dispatch={dispatch},sync_each={each}"
        cases.append(
            Case(
                sync,
                f"gradient_accumulation[{flags}]",
                _call("test_gradient_accumulation", split, dispatch, each),
            )
        )
        cases.append(
            Case(
                sync,
                f"gradient_accumulation_with_opt_and_scheduler[{flags}]",
                _call("test_gradient_accumulation_with_opt_and_scheduler", split, dispatch, each),
            )
        )
    cases += [
        Case(script, name, _call(name))
        for name in (
            "init_state_check",
            "process_execution_check",
            "test_split_between_processes_list",
            "test_split_between_processes_nested_dict",
            "test_split_between_processes_tensor",
            "test_split_between_processes_evenly",
            "rng_sync_check",
            "dl_preparation_check",
            "central_dl_preparation_check",
            "custom_sampler_check",
            "check_seedable_sampler",
            "check_seedable_sampler_with_data_seed",
            "check_seedable_sampler_in_batch_sampler_shard",
        )
    ]
    cases += [
        Case(script, "test_split_between_processes_dataset", _split_dataset),
        Case(script, "training_check[use_seedable_sampler=False]", _call("training_check", False)),
        Case(script, "training_check[use_seedable_sampler=True]", _call("training_check", True)),
        Case(script, "test_trigger", _call("test_trigger")),
        Case(script, "test_reinstantiated_state", _call("test_reinstantiated_state")),
    ]
    cases += [
        Case(loop, name, _call(f"test_{name}"))
        for name in (
            "default_ensures_even_batch_sizes",
            "can_disable_even_batches",
            "can_join_uneven_inputs",
            "join_can_override_even_batches",
            "join_can_override_for_mixed_type_dataloaders",
            "join_raises_warning_for_iterable_when_overriding_even_batches",
            "pickle_accelerator",
        )
    ]
    cases += [Case(loop, "join_raises_warning_for_non_ddp_distributed", _join_non_ddp)]
    cases += [
        Case(loop, f"data_loader[{kind}]", _data_loader(kind))
        for kind in ("shuffle=False", "shuffle=True", "batch_sampler", "sampler=BatchSampler")
    ]
    cases += [
        Case(
            loop,
            "stateful_dataloader",
            lambda mod: mod.test_stateful_dataloader(mod.create_accelerator()),
        ),
        Case(
            loop,
            "stateful_dataloader_save_state",
            lambda mod: mod.test_stateful_dataloader_save_state(mod.create_accelerator()),
        ),
    ]
    for split, dispatch in itertools.product((True, False), repeat=2):
        cases.append(
            Case(
                metrics,
                f"torch_metrics[split={split},dispatch={dispatch},n=99]",
                _torch_metrics(split, dispatch),
            )
        )
    cases += [
        Case(metrics, "torch_metrics[n=512]", _metrics_default),
        Case(
            metrics,
            "gather_for_metrics_with_iterable_dataset",
            _call("test_gather_for_metrics_with_iterable_dataset"),
        ),
        Case(
            metrics,
            "gather_for_metrics_with_non_tensor_objects_iterable_dataset",
            _call("test_gather_for_metrics_with_non_tensor_objects_iterable_dataset"),
        ),
        Case(metrics, "gather_for_metrics_drop_last", _call("test_gather_for_metrics_drop_last")),
    ]
    return cases


CASES = _cases()


def load_script(script: str) -> Any:
    """Import one of Accelerate's test scripts. test_metrics imports ``datasets`` and
    ``evaluate`` for its GLUE cases (network: not run here); a package that is not installed is
    replaced by a module whose every name raises, saying so."""
    import importlib

    if not script.endswith("test_metrics"):
        return importlib.import_module(script)
    missing = []
    for name in ("datasets", "evaluate"):
        try:
            importlib.import_module(name)
        except ImportError:
            sys.modules[name] = _Missing(name)
            missing.append(name)
    try:
        return importlib.import_module(script)
    finally:  # only the script holds the stand-ins: Accelerate must still see them missing
        for name in missing:
            del sys.modules[name]


def start(module: Any) -> None:
    """What the script's main() does before its first test: make the Accelerator (or state)
    the test functions then find (Accelerate's AcceleratorState() needs one)."""
    import torch

    name = module.__name__.rsplit(".", 1)[-1]
    if name == "test_ops":
        module.PartialState()
    elif name == "test_distributed_data_loop":
        accelerator = module.create_accelerator()
        torch.manual_seed(accelerator.process_index)
    elif name == "test_metrics":
        config = module.DataLoaderConfiguration(split_batches=False, dispatch_batches=False)
        module.Accelerator(dataloader_config=config)
    else:
        module.Accelerator()


class _Missing(types.ModuleType):
    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)

        def missing(*_: Any, **__: Any) -> Any:
            raise ModuleNotFoundError(f"{self.__name__} is not installed ({attribute})")

        return missing
