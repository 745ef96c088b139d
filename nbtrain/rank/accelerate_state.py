"""Hugging Face Accelerate's own ``PartialState`` inside a rank describes the launch's world.

A rank's environment is torchrun's (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT), plus, on the
CPU, ``ACCELERATE_USE_CPU=true`` as ``accelerate launch --cpu`` exports it (kernel/rankspec.py).
Accelerate's ``AcceleratorState`` (so its ``Accelerator``) honours that switch, but a bare
``PartialState()`` does not read it: its ``cpu`` argument defaults to False, and without a GPU
that leaves it "process 0 of 1, DistributedType.NO" on every rank. Then Accelerate's
``on_main_process`` (the decorator its tracking guide puts on custom trackers), its
``main_process_first()`` and every library that asks Accelerate who the main process is
(datasets, PEFT, TRL) treat each rank as the main one. Under torchrun with Accelerate's own
Accelerator made first, rank 1 is not main; here it must not be either, whichever comes first.

So in a rank ``PartialState`` takes the switch as ``AcceleratorState`` does: the state it forms
is the CPU world of the launch (MULTI_CPU over gloo, joining the process group the rank already
formed, or forming it as Accelerate would). On a GPU or XLA rank the switch is not set and
nothing changes: Accelerate finds those worlds from the environment itself.

Installed when the rank's code first imports ``accelerate.state`` (imports.when_imported): a rank
that never uses Accelerate neither imports it nor pays for it.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from nbtrain.rank import imports, rankenv

_MARK = "_nbtrain_cpu_switch"  # set on the wrapper: a second install leaves it as it is


def install() -> None:
    imports.when_imported("accelerate.state", _honour_cpu_switch)


def _honour_cpu_switch(module: ModuleType) -> None:
    state_class = getattr(module, "PartialState", None)
    original = getattr(state_class, "__init__", None)
    if state_class is None or original is None or getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def __init__(self: Any, cpu: bool = False, **kwargs: Any) -> None:
        # (read on every call, as AcceleratorState does: the flag is the environment's)
        original(self, cpu or rankenv.force_cpu(), **kwargs)

    setattr(__init__, _MARK, True)
    state_class.__init__ = __init__
