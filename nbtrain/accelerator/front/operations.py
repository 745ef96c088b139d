"""Accelerate's free functions across ranks (``accelerate.utils.gather`` and the like), with
Accelerate's signatures and defaults, over the one implementation: an Accelerator's collectives.

Accelerate runs them on its process-wide ``PartialState``, formed on first use; here each rank
process forms, on first use, one Accelerator of its own for them (nbtrain keeps no state shared
between the user's Accelerators). Every rank must make the same calls in the same order, as with
the Accelerator's methods: a rank calling one alone gets ``DistributedOperationException``
(``nbtrain.utils``), not a hang.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nbtrain.accelerator.comm import nested

if TYPE_CHECKING:
    import torch

    from nbtrain.accelerator.comm.collectives import Collectives
    from nbtrain.accelerator.front.core import Accelerator

_process: tuple[int, Accelerator] | None = None  # (pid, its Accelerator): a fork forms its own


def _accelerator() -> Accelerator:
    global _process
    if _process is None or _process[0] != os.getpid():
        from nbtrain.accelerator.front.core import Accelerator

        _process = (os.getpid(), Accelerator())
    return _process[1]


def _collectives() -> Collectives:
    return _accelerator()._collectives


def gather(tensor: Any) -> Any:
    """Every rank's tensors (nested too) concatenated along dim 0.

    :param tensor: a tensor, or a list, tuple or dict of them, on every rank (the same shape but
        for dim 0).
    :raises DistributedOperationException: a rank calls it alone, or with tensors that do not match
        the other ranks' (instead of a hang).
    """
    return _collectives().gather(tensor)


def gather_object(object: Any) -> Any:  # (Accelerate's parameter name)
    """Every rank's object in one list (a rank's list or tuple contributes its items).

    ``object``: any picklable object (every rank must call it).

    :raises DistributedOperationException: a rank calls it alone (instead of a hang).
    """
    return _collectives().gather_object(object)


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """``from_process``'s tensors (nested too) on every rank, in place.

    :param tensor: a tensor, or a nest of them, of the same shape on every rank.
    :param from_process: the rank whose values every rank gets.
    :raises DistributedOperationException: a rank calls it alone, or with tensors that do not match
        the other ranks' (instead of a hang).
    """
    return _collectives().broadcast(tensor, from_process)


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """``from_process``'s list items on every rank, in place (the list is returned too).

    :param object_list: a list of picklable objects, of the same length on every rank.
    :param from_process: the rank whose items every rank gets.
    :raises DistributedOperationException: a rank calls it alone, or with tensors that do not match
        the other ranks' (instead of a hang).
    """
    object_list[:] = _collectives().broadcast_object(list(object_list), from_process)
    return object_list


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """"mean" (Accelerate's default here; the Accelerator method's is "sum"), "sum", "max",
    "min" or "none" over the ranks, times ``scale``.

    :param tensor: a tensor, or a nest of them, of the same shape on every rank.
    :param reduction: "mean", "sum", "max", "min" or "none".
    :param scale: a factor applied after the reduction.
    :raises DistributedOperationException: a rank calls it alone, or with tensors that do not match
        the other ranks' (instead of a hang).
    """
    return _collectives().reduce(tensor, reduction, scale)


def pad_across_processes(
    tensor: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False
) -> Any:
    """Each tensor padded along ``dim`` to the largest size any rank has.

    :param tensor: a tensor, or a nest of them.
    :param dim: the dimension to pad.
    :param pad_index: the value padded with.
    :param pad_first: pad at the start instead of the end.
    :raises DistributedOperationException: a rank calls it alone, or with tensors that do not match
        the other ranks' (instead of a hang).
    """
    return _collectives().pad_across_processes(tensor, dim, pad_index, pad_first)


def wait_for_everyone() -> None:
    """A barrier: every rank must call it."""
    _accelerator().wait_for_everyone()


def send_to_device(
    tensor: Any,
    device: torch.device | str | int,
    non_blocking: bool = False,
    skip_keys: list[str] | str | None = None,
) -> Any:
    """The tensors in ``tensor`` (nested containers too) moved to ``device``; values under the
    keys ``skip_keys`` of a mapping, at any depth, are left where they are (as in Accelerate).

    :param tensor: a tensor or nested lists, tuples, dicts of tensors (other values are returned as
        they are).
    :param device: a ``torch.device``, a name (``"cuda:0"``) or a GPU number.
    :param non_blocking: an asynchronous copy where the device allows it.
    :param skip_keys: keys whose values stay where they are.
    """
    import torch

    target = device if isinstance(device, torch.device) else torch.device(device)
    if isinstance(skip_keys, str):
        skip_keys = [skip_keys]
    if not skip_keys or callable(getattr(tensor, "to", None)):
        return nested.send_to_device(tensor, target, non_blocking)  # (BatchEncoding: all moved)
    if isinstance(tensor, Mapping):
        keep = set(skip_keys)
        moved = {
            key: value if key in keep else send_to_device(value, target, non_blocking, skip_keys)
            for key, value in tensor.items()
        }
        return nested.same_type(tensor, moved)
    if isinstance(tensor, (list, tuple)) and not nested.is_namedtuple(tensor):
        return type(tensor)(send_to_device(v, target, non_blocking, skip_keys) for v in tensor)
    return nested.send_to_device(tensor, target, non_blocking)
