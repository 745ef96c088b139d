"""Issue 28, point 1, in a real Jupyter kernel: a 1-process launch (which runs in the kernel) or a
``TrainingArguments(...).device`` in a cell forms Hugging Face Accelerate's state in the kernel;
a later 2-process fork launch must still form a world of 2 (before the fix: "process 0 of 1" on
each rank, ``DistributedType.NO``, no error). The kernel keeps its own state."""

from __future__ import annotations

import pytest
from kernelutil import running_kernel

pytestmark = pytest.mark.timeout(300)

SETUP = """
from nbtrain import debug_launcher, notebook_launcher
QUIET = dict(progress="off", output="none")

def accelerate_world():
    from accelerate import Accelerator
    accelerator = Accelerator()
    return accelerator.num_processes, accelerator.process_index, str(accelerator.distributed_type)

def args_world():
    return training_args.world_size, training_args.process_index, str(training_args.device)
"""


@pytest.fixture
def kernel(tmp_path):
    with running_kernel(tmp_path, SETUP) as k:
        yield k


def test_one_process_launch_then_two_process_fork_launch(kernel):
    assert kernel.value("notebook_launcher(accelerate_world, num_processes=1, **QUIET)") == (
        1,
        0,
        "DistributedType.NO",
    )
    worlds = kernel.value(
        "notebook_launcher(accelerate_world, num_processes=2, start_method='fork', "
        "return_all=True, **QUIET)"
    )
    assert worlds == [(2, 0, "DistributedType.MULTI_CPU"), (2, 1, "DistributedType.MULTI_CPU")]
    # debug_launcher, as Accelerate's tests call it (num_processes=1 first), and the kernel's
    # own state untouched throughout
    assert kernel.value("debug_launcher(accelerate_world, num_processes=1)")[0] == 1
    assert kernel.value("debug_launcher(accelerate_world)") == (
        2,
        0,
        "DistributedType.MULTI_CPU",
    )
    assert kernel.value("__import__('accelerate').PartialState().num_processes") == 1


def test_training_arguments_device_read_in_the_kernel_first(kernel, tmp_path):
    out = kernel.run(
        "from transformers import TrainingArguments\n"
        f"training_args = TrainingArguments(output_dir={str(tmp_path)!r}, report_to=[])\n"
        "print(training_args.device, training_args.world_size)"
    )
    assert out.error is None, out.traceback_text
    assert out.stdout.split() == ["cpu", "1"]
    worlds = kernel.value(
        "notebook_launcher(accelerate_world, num_processes=2, start_method='fork', "
        "return_all=True, **QUIET)"
    )
    assert [w[:2] for w in worlds] == [(2, 0), (2, 1)]
    # the kernel's TrainingArguments, used in the ranks: the rank's world and device
    worlds = kernel.value(
        "notebook_launcher(args_world, num_processes=2, start_method='fork', return_all=True, "
        "**QUIET)"
    )
    assert [w[:2] for w in worlds] == [(2, 0), (2, 1)]
    assert all(w[2].startswith("cpu") for w in worlds)
    assert kernel.value("training_args.world_size") == 1
