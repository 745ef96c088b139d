"""split_between_processes: this rank's contiguous share of a list, tuple, tensor or dict.

The first ``len % world`` ranks get one item more; with ``apply_padding`` every rank's share is
completed to the same length by repeating the last item (so a later gather lines up).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .sharding import padded_share, process_slice


def share(inputs: Any, world_size: int, rank: int, apply_padding: bool = False) -> Any:
    if isinstance(inputs, Mapping):
        return _share_mapping(inputs, world_size, rank, apply_padding)
    if not isinstance(inputs, (list, tuple, torch.Tensor)):
        raise TypeError(
            f"split_between_processes() splits lists, tuples, tensors and dicts of them, not "
            f"{type(inputs).__name__}. Convert it with list(...) first."
        )
    return _share_sequence(inputs, world_size, rank, apply_padding)


def _share_sequence(inputs: Any, world_size: int, rank: int, apply_padding: bool) -> Any:
    length = len(inputs)
    start, end = process_slice(length, world_size, rank)
    part = inputs[start:end]
    if not apply_padding or length == 0:
        return part
    missing = padded_share(length, world_size) - (end - start)
    if missing <= 0:
        return part
    if isinstance(inputs, torch.Tensor):
        last = (part if len(part) else inputs)[-1:]
        return torch.cat([part, last.repeat(missing, *([1] * (inputs.ndim - 1)))])
    last_item = part[-1] if len(part) else inputs[-1]
    padding = [last_item] * missing
    return part + (tuple(padding) if isinstance(part, tuple) else padding)


def _share_mapping(inputs: Mapping, world_size: int, rank: int, apply_padding: bool) -> dict:
    splittable = {k: v for k, v in inputs.items() if isinstance(v, (list, tuple, torch.Tensor))}
    lengths = {len(v) for v in splittable.values()}
    if len(lengths) > 1:
        detail = ", ".join(f"{k!r}: {len(v)}" for k, v in splittable.items())
        raise ValueError(
            f"split_between_processes() needs every list/tensor in the dict to have the same "
            f"length, got {detail}."
        )
    return {
        key: _share_sequence(value, world_size, rank, apply_padding) if key in splittable else value
        for key, value in inputs.items()
    }
