"""What a user changes to run Accelerate code on nbtrain: the ``Accelerator`` import, and the
``accelerate.utils`` functions the code calls, which come from ``nbtrain.utils`` instead
(``from accelerate.utils import gather`` -> ``from nbtrain.utils import gather``). Everything
else in Accelerate's scripts (their datasets, models, DataLoaderConfiguration,
GradientAccumulationPlugin, ...) stays Accelerate's.

``bind(module)`` rebinds those names in one of Accelerate's test script modules, inside a rank.
One test helper is rebound too: ``are_the_same_tensors`` (accelerate.test_utils) gathers through
Accelerate's own state, so it gets the same check over nbtrain's gather.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import nbtrain
import nbtrain.utils


@functools.cache
def _accelerator() -> Any:
    """The rank's Accelerator behind the free functions (one per rank, as a script keeps one)."""
    return nbtrain.Accelerator()


class _State:
    """``AcceleratorState()`` / ``PartialState()`` -> ``Accelerator().state``. nbtrain keeps no
    process-wide singleton, so ``_reset_state()`` (which scripts call between Accelerators) has
    nothing to reset."""

    def __new__(cls, *_: Any, **__: Any) -> Any:  # type: ignore[misc]
        return nbtrain.Accelerator().state

    @staticmethod
    def _reset_state(*_: Any, **__: Any) -> None:
        return None


def _prepare_data_loader(
    dataloader: Any,
    device: Any = None,
    num_processes: Any = None,
    process_index: Any = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    use_seedable_sampler: bool = False,
    **_: Any,
) -> Any:
    """``accelerate.data_loader.prepare_data_loader(...)`` -> ``Accelerator(...).prepare(dl)``."""
    from accelerate.utils import DataLoaderConfiguration

    config = DataLoaderConfiguration(
        split_batches=split_batches,
        dispatch_batches=dispatch_batches,
        even_batches=even_batches,
        use_seedable_sampler=use_seedable_sampler,
    )
    accelerator = nbtrain.Accelerator(dataloader_config=config, device_placement=put_on_device)
    return accelerator.prepare(dataloader)


def _are_the_same_tensors(tensor: Any) -> bool:
    """accelerate.test_utils' helper (a collective over Accelerate's own state), over nbtrain's:
    the scripts' fixture, not code under test."""
    import torch

    gathered = _accelerator().gather(tensor[None].clone())
    return all(torch.equal(row, tensor) for row in gathered)


BINDINGS: dict[str, Any] = {
    "Accelerator": nbtrain.Accelerator,
    "DistributedType": nbtrain.DistributedType,
    "set_seed": nbtrain.set_seed,
    "AcceleratorState": _State,
    "PartialState": _State,
    "prepare_data_loader": _prepare_data_loader,
    **{
        name: getattr(nbtrain.utils, name)
        for name in (
            "DistributedOperationException",
            "gather",
            "gather_object",
            "broadcast",
            "pad_across_processes",
            "reduce",
        )
    },
    "are_the_same_tensors": _are_the_same_tensors,
}


def bind(module: ModuleType) -> ModuleType:
    for name, value in BINDINGS.items():
        if name in vars(module):
            setattr(module, name, value)
    return module
