"""The prepared dataloader on XLA devices (xla.py's strategy hands it to ``prepare``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from nbtrain.accelerator.data.prepared import PreparedDataLoader
from nbtrain.accelerator.devices.xla_collectives import check_usable
from nbtrain.accelerator.devices.xla_runtime import sync

# ---------------------------------------------------------------------------------------------
# Dataloaders


class XlaDataLoader(PreparedDataLoader):
    """A prepared loader on XLA: batches go to the device, and the XLA step is marked when the
    next batch is asked for.

    Where the CPU side runs: with ``num_workers=0``, the dataset, collate and any random
    augmentation run on the training thread when the loop asks for the batch, exactly as on the
    CPU, so they draw from the global RNG in the same order every run and save_state's RNG state
    lies before the next batch; with ``num_workers > 0`` the workers make the batches and
    torch_xla's ParallelLoader moves them to the device in a background thread, ahead of the loop.

    The prefetching sits under the parent's bookkeeping: position (save_state / load_state),
    end_of_dataloader and gradient accumulation count the batches handed to the user, not the
    ones already on their way. No step mark before a pass's first batch: a run resumed by
    load_state then starts from the XLA RNG state saved. save_state itself marks steps (it reads
    the device RNG at a step boundary, and its barriers are XLA steps), and every mark moves the
    device RNG on: a run that saves and then goes on draws other device random numbers (dropout)
    from then on than a run that never saved, while a run resumed from that checkpoint draws
    exactly those of the run that never saved."""

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        for batch in super().__iter__():
            yield batch
            check_usable(self.spec.rank)  # not one more step after a collective gone astray
            sync()  # the user's step on this batch is one graph: run it before the next batch

    def _counted(self, batches: Iterator[Any], index: int, total: int) -> Iterator[Any]:
        return super()._counted(self._on_device(batches), index, total)

    def _looking_ahead(self, batches: Iterator[Any], index: int) -> Iterator[Any]:
        return super()._looking_ahead(self._on_device(batches), index)

    def _place(self, batch: Any) -> Any:
        return batch  # on the device already (or device placement is off)

    def _on_device(self, batches: Iterator[Any]) -> Iterator[Any]:
        if self.device is None:
            return batches
        if self.num_workers == 0:
            # torch_xla's loader thread would run the dataset (and its random augmentations)
            # up to ~24 batches ahead, interleaved with the training thread's own draws: keep
            # that on the training thread. The copy itself does not wait for the device.
            return _copied(batches, self.device)
        return _prefetched(batches, self.device)


def _copied(batches: Iterator[Any], device: torch.device) -> Iterator[Any]:
    import torch_xla.core.xla_model as xm

    for batch in batches:
        # The transfer ParallelLoader makes (any nesting of CPU tensors), one batch at a time.
        yield xm.send_cpu_data_to_device([batch], device)[0]


class _CpuBatches:
    """The batches of the DataLoader's workers, as torch_xla's loader thread reads them. An
    error there would only end the thread (and so, silently, the pass): it is kept to be raised
    in the training thread."""

    def __init__(self, batches: Iterator[Any]) -> None:
        self._batches = batches
        self.count = 0
        self.error: Exception | None = None

    def __iter__(self) -> Iterator[Any]:
        try:
            for batch in self._batches:
                self.count += 1
                yield batch
        except Exception as exc:
            self.error = exc


def _prefetched(batches: Iterator[Any], device: torch.device) -> Iterator[Any]:
    """One pass of ``batches`` through torch_xla's ParallelLoader onto ``device``."""
    from torch_xla.distributed.parallel_loader import ParallelLoader

    source = _CpuBatches(batches)
    loader = ParallelLoader(source, [device])
    handed = 0
    try:
        while (batch := loader.next_item(device)) is not None:
            handed += 1
            yield batch
        if source.error is not None:
            raise source.error
        # A failed transfer also just ends the device queue; ParallelLoader keeps its error here
        # (its own per-device iterator raises it the same way).
        failed = getattr(loader, "_exception_queue", None)
        if failed is not None and not failed.empty():
            raise failed.get()
        if handed < source.count:
            raise RuntimeError(
                f"{source.count - handed} of {source.count} batches never reached {device}: "
                "torch_xla's ParallelLoader stopped early without saying why."
            )
    finally:
        loader.close()  # also when the loop is left early (break): its threads end here
