"""split_between_processes: this rank's contiguous share of a list, tuple, tensor or dict.

Accelerate's semantics: the first ``len % world`` ranks get one item more; with
``apply_padding`` every rank's share is completed to the same length with the input's *last*
item (so a later gather lines up, and a rank past the end still gets one item); dicts are split
value by value (nested dicts too; other values are kept whole); a Hugging Face
``datasets.Dataset`` is split with ``select``. A single process gets the inputs unchanged.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import torch

from nbtrain.accelerator.data.sharding import padded_share, process_slice

_SEQUENCES = (list, tuple, torch.Tensor)


def share(inputs: Any, world_size: int, rank: int, apply_padding: bool = False) -> Any:
    if not isinstance(inputs, (*_SEQUENCES, Mapping)) and not _is_hf_dataset(inputs):
        raise TypeError(
            f"split_between_processes() splits lists, tuples, tensors, datasets.Dataset and "
            f"dicts of them, not {type(inputs).__name__}. Convert it with list(...) first."
        )
    if world_size == 1:
        return inputs
    if isinstance(inputs, Mapping):
        _check_same_lengths(inputs)
    return _share(inputs, world_size, rank, apply_padding)


def _share(inputs: Any, world_size: int, rank: int, apply_padding: bool) -> Any:
    if isinstance(inputs, Mapping):
        return {
            key: _share(value, world_size, rank, apply_padding) for key, value in inputs.items()
        }
    if isinstance(inputs, _SEQUENCES):
        return _share_sequence(inputs, world_size, rank, apply_padding)
    if _is_hf_dataset(inputs):
        return inputs.select(_shared_indices(len(inputs), world_size, rank, apply_padding))
    return inputs  # a dict's other values: every rank gets them whole


def _share_sequence(inputs: Any, world_size: int, rank: int, apply_padding: bool) -> Any:
    length = len(inputs)
    start, end = process_slice(length, world_size, rank)
    part = inputs[start:end]
    missing = padded_share(length, world_size) - (end - start)
    if not apply_padding or missing <= 0:
        return part
    if isinstance(inputs, torch.Tensor):
        last = inputs[-1:]
        return torch.cat([part, last.repeat(missing, *([1] * (inputs.ndim - 1)))])
    padding = [inputs[-1]] * missing
    return part + (tuple(padding) if isinstance(part, tuple) else padding)


def _shared_indices(length: int, world_size: int, rank: int, apply_padding: bool) -> list[int]:
    start, end = process_slice(length, world_size, rank)
    indices = list(range(start, end))
    if apply_padding and length:
        indices += [length - 1] * (padded_share(length, world_size) - len(indices))
    return indices


def _check_same_lengths(inputs: Mapping) -> None:
    lengths: dict[str, int] = {}
    _collect_lengths(inputs, "", lengths)
    if len(set(lengths.values())) > 1:
        detail = ", ".join(f"{key}: {length}" for key, length in lengths.items())
        raise ValueError(
            f"split_between_processes() needs every list/tensor in the dict to have the same "
            f"length, got {detail}."
        )


def _collect_lengths(inputs: Mapping, prefix: str, lengths: dict[str, int]) -> None:
    for key, value in inputs.items():
        name = f"{prefix}{key!r}"
        if isinstance(value, Mapping):
            _collect_lengths(value, f"{name}/", lengths)
        elif isinstance(value, _SEQUENCES) or _is_hf_dataset(value):
            lengths[name] = len(value)


def _is_hf_dataset(value: object) -> bool:
    datasets = sys.modules.get("datasets")  # never imported here: only if the user has
    kind = getattr(datasets, "Dataset", None)
    return isinstance(kind, type) and isinstance(value, kind)
