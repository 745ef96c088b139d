"""Nested containers of tensors (batches, model outputs, metrics): flatten, rebuild, move.

Containers are lists, tuples (named tuples keep their type) and mappings (dict, OrderedDict,
Hugging Face BatchEncoding...). Order of leaves is the container's own iteration order, which is
the same on every rank when every rank runs the same code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch


def is_namedtuple(data: object) -> bool:
    return isinstance(data, tuple) and hasattr(data, "_fields")


def leaves(data: Any) -> list[Any]:
    """Every non-container value, depth first."""
    found: list[Any] = []
    _collect(data, found)
    return found


def _collect(data: Any, found: list[Any]) -> None:
    if isinstance(data, Mapping):
        for value in data.values():
            _collect(value, found)
    elif isinstance(data, (list, tuple)):
        for value in data:
            _collect(value, found)
    else:
        found.append(data)


def rebuild(data: Any, new_leaves: list[Any]) -> Any:
    """``data``'s structure with its leaves replaced, in order, by ``new_leaves``."""
    iterator = iter(new_leaves)
    result = _rebuild(data, iterator)
    if next(iterator, _END) is not _END:
        raise ValueError("rebuild() got more leaves than the structure holds.")
    return result


_END = object()


def _rebuild(data: Any, iterator: Any) -> Any:
    if isinstance(data, Mapping):
        return same_type(data, {key: _rebuild(value, iterator) for key, value in data.items()})
    if is_namedtuple(data):
        return type(data)(*(_rebuild(value, iterator) for value in data))
    if isinstance(data, (list, tuple)):
        return type(data)(_rebuild(value, iterator) for value in data)
    return next(iterator)


def same_type(original: Mapping, values: dict) -> Any:
    if type(original) is dict:
        return values
    kind: Any = type(original)
    try:
        return kind(values)
    except Exception:  # a mapping type whose constructor wants something else
        return values


def map_tensors(fn: Callable[[torch.Tensor], Any], data: Any) -> Any:
    """Apply ``fn`` to every tensor leaf; other leaves stay as they are."""
    return rebuild(data, [fn(x) if isinstance(x, torch.Tensor) else x for x in leaves(data)])


def tensor_leaves_only(data: Any, what: str) -> list[torch.Tensor]:
    """The leaves, which must all be tensors (``what`` names the calling operation)."""
    found = leaves(data)
    for leaf in found:
        if not isinstance(leaf, torch.Tensor):
            raise TypeError(
                f"{what} works on tensors and (nested) lists, tuples and dicts of tensors, but "
                f"got a {type(leaf).__name__} ({leaf!r:.60}). Convert it with torch.tensor(...), "
                "or use gather_for_metrics(), which also gathers plain Python objects."
            )
    return found


def send_to_device(data: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Move every tensor (and every object with ``.to``, e.g. BatchEncoding) to ``device``."""
    if isinstance(data, torch.Tensor):
        return data if data.device == device else data.to(device, non_blocking=non_blocking)
    if isinstance(data, Mapping):
        move = getattr(data, "to", None)
        if type(data) is not dict and callable(move):
            return move(device)  # BatchEncoding & co. know how to move themselves
        return same_type(
            data, {key: send_to_device(value, device, non_blocking) for key, value in data.items()}
        )
    if is_namedtuple(data):
        return type(data)(*(send_to_device(value, device, non_blocking) for value in data))
    if isinstance(data, (list, tuple)):
        return type(data)(send_to_device(value, device, non_blocking) for value in data)
    to = getattr(data, "to", None)
    if callable(to) and not isinstance(data, (str, bytes, type)):
        try:
            return to(device)
        except TypeError:  # a `.to` with another meaning: leave the object alone
            return data
    return data
