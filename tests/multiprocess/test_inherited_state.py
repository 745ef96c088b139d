"""Forked ranks never inherit a Hugging Face Accelerate state the launching process formed
(issue 28, point 1), with the real Accelerate and Transformers: a 1-process launch (which runs
in this process) or a ``TrainingArguments(...).device`` here first, then a 2-process fork launch
whose ranks must see a world of 2, not "process 0 of 1" each. This process keeps its own state.
The same sequences in a real Jupyter kernel: tests/kernel/test_inherited_state_kernel.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from nbtrain import debug_launcher, notebook_launcher

pytestmark = pytest.mark.timeout(240)

QUIET: dict[str, Any] = {"progress": "off", "output": "none"}


def accelerate_world() -> tuple[int, int, str]:
    from accelerate import Accelerator, PartialState

    accelerator = Accelerator()
    assert PartialState().num_processes == accelerator.num_processes
    return accelerator.num_processes, accelerator.process_index, str(accelerator.distributed_type)


def training_args_world(directory: str) -> tuple[int, int, str]:
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=directory, report_to=[])
    return args.world_size, args.process_index, str(args.parallel_mode)


KERNEL_ARGS: Any = None  # a TrainingArguments made (and its device read) in the launching process


def kernel_args_world() -> tuple[int, int, str]:
    return KERNEL_ARGS.world_size, KERNEL_ARGS.process_index, str(KERNEL_ARGS.parallel_mode)


def kernel_args_trainer() -> tuple[int, int, int]:
    """Transformers' real Trainer, trained on the rank with the launching process's arguments."""
    from tinytrainer import Pairs, Regression
    from transformers import Trainer

    trainer = Trainer(model=Regression(), args=KERNEL_ARGS, train_dataset=Pairs())
    trainer.train()
    batches = len(trainer.get_train_dataloader())
    return trainer.accelerator.num_processes, trainer.accelerator.process_index, batches


@pytest.fixture
def own_state() -> Iterator[None]:
    """This process's Accelerate state is formed by the test; emptied again afterwards."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def two_ranks(function: Any, *args: Any) -> list[Any]:
    return notebook_launcher(
        function, args, num_processes=2, start_method="fork", return_all=True, **QUIET
    )


def test_a_one_process_launch_first_does_not_make_fork_ranks_single(own_state):
    from accelerate import PartialState

    assert notebook_launcher(accelerate_world, num_processes=1, **QUIET) == (
        1,
        0,
        "DistributedType.NO",
    )
    assert two_ranks(accelerate_world) == [
        (2, 0, "DistributedType.MULTI_CPU"),
        (2, 1, "DistributedType.MULTI_CPU"),
    ]
    assert PartialState().num_processes == 1  # this process's own state is left as it was


def test_debug_launcher_one_process_then_two(own_state):
    assert debug_launcher(accelerate_world, num_processes=1) == (1, 0, "DistributedType.NO")
    # (debug_launcher returns rank 0's value)
    assert debug_launcher(accelerate_world) == (2, 0, "DistributedType.MULTI_CPU")


def test_training_arguments_device_read_here_first(own_state, tmp_path):
    global KERNEL_ARGS
    from transformers import TrainingArguments

    KERNEL_ARGS = TrainingArguments(
        output_dir=str(tmp_path),
        report_to=[],
        per_device_train_batch_size=2,
        max_steps=2,
        save_strategy="no",
        disable_tqdm=True,
    )
    assert str(KERNEL_ARGS.device) == "cpu" and KERNEL_ARGS.world_size == 1
    try:
        # a TrainingArguments made in the rank, and the one made here, used in the rank
        assert [r[:2] for r in two_ranks(training_args_world, str(tmp_path))] == [(2, 0), (2, 1)]
        assert [r[:2] for r in two_ranks(kernel_args_world)] == [(2, 0), (2, 1)]
        assert {r[2] for r in two_ranks(kernel_args_world)} == {"ParallelMode.DISTRIBUTED"}
        # 16 samples / (2 per rank x 2 ranks) = 4 batches per rank
        assert two_ranks(kernel_args_trainer) == [(2, 0, 4), (2, 1, 4)]
        assert KERNEL_ARGS.world_size == 1  # here, still this process's
    finally:
        KERNEL_ARGS = None


def test_warm_fork_ranks_start_without_this_process_state(own_state):
    import nbtrain

    assert notebook_launcher(accelerate_world, num_processes=1, **QUIET)[0] == 1
    with nbtrain.start_ranks(2, start_method="fork", return_all=True, **QUIET) as ranks:
        assert [r[:2] for r in ranks.run(accelerate_world)] == [(2, 0), (2, 1)]


def test_warm_fork_ranks_set_up_a_kernel_training_arguments_once(own_state, tmp_path):
    global KERNEL_ARGS
    from transformers import TrainingArguments

    import nbtrain

    KERNEL_ARGS = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    assert KERNEL_ARGS.world_size == 1
    try:
        with nbtrain.start_ranks(2, start_method="fork", return_all=True, **QUIET) as ranks:
            for _ in range(2):  # (the second call finds it set up already)
                assert [r[:2] for r in ranks.run(kernel_args_world)] == [(2, 0), (2, 1)]
    finally:
        KERNEL_ARGS = None
