"""pad_across_processes' arithmetic: which tensors have the padded dimension, what each rank
states of them in the handshake, and the padding itself."""

from __future__ import annotations

from typing import Any

import torch

from nbtrain.accelerator.comm.handshake import LeafMeta, dtype_code


def has_dim(tensor: torch.Tensor, dim: int) -> bool:
    return -tensor.ndim <= dim < tensor.ndim


def pad_meta(tensor: torch.Tensor, dim: int) -> LeafMeta:
    if has_dim(tensor, dim):
        return LeafMeta.of(tensor, dim % tensor.ndim)
    # Not padded: only its number of dimensions must agree across ranks (a tensor with the dim
    # on one rank and without it on another is an error), not its sizes.
    return LeafMeta(dtype_code(tensor.dtype), tensor.ndim, 0, 0)


def pad(
    tensor: torch.Tensor, dim: int, size: int, pad_index: Any, pad_first: bool
) -> torch.Tensor:
    if tensor.shape[dim] >= size:
        return tensor
    dim = dim % tensor.ndim
    shape = list(tensor.shape)
    shape[dim] = size - tensor.shape[dim]
    filler = tensor.new_full(shape, pad_index)
    parts = [filler, tensor] if pad_first else [tensor, filler]
    return torch.cat(parts, dim=dim)
