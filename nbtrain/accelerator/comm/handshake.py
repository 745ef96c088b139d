"""The handshake's wire format: what each rank states before a collective (the operation, an
argument tag, and per tensor its dtype, rank and shape), packed into one small fixed-size tensor
that every rank gathers (see collectives.py)."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

import torch


class CollectiveError(RuntimeError):
    """Ranks disagreed about a collective call, so it was refused on every rank."""


class CollectiveTimeoutError(CollectiveError):
    """A rank waited longer than the timeout for its peers to make the same call."""


class PeerLostError(CollectiveError):
    """A peer ended (finished or failed) while this rank waited for it in a collective."""


class Op(IntEnum):
    WAIT_FOR_EVERYONE = 1
    GATHER = 2
    REDUCE = 3
    BROADCAST = 4
    PAD = 5
    GATHER_OBJECT = 6
    BROADCAST_OBJECT = 7
    SAVE_STATE = 8
    LOAD_STATE = 9
    MAIN_PROCESS_FIRST = 10
    GET_STATE_DICT = 11

    @property
    def call(self) -> str:
        return _CALL_NAMES.get(self, self.name.lower()) + "()"


_CALL_NAMES = {Op.PAD: "pad_across_processes"}

MAGIC = 0x6E62  # "nb": a header from anything else is refused, not misread
SLOTS = 16  # tensors described in the first round; more take a second, rare round
LEAF_FIELDS = 4  # per tensor: dtype code, ndim, size along the operation's dim, hash of other dims
HEAD_FIELDS = 4  # magic, op, tag, number of tensors
DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
    torch.complex128,
]


@dataclass(frozen=True)
class LeafMeta:
    dtype: int
    ndim: int
    size: int
    rest: int

    @classmethod
    def of(cls, tensor: torch.Tensor, dim: int = 0) -> LeafMeta:
        shape = tuple(tensor.shape)
        if tensor.ndim == 0:
            return cls(dtype_code(tensor.dtype), 0, 1, 0)
        others = shape[:dim] + shape[dim + 1 :]
        return cls(dtype_code(tensor.dtype), tensor.ndim, shape[dim], _crc(repr(others)))


@dataclass(frozen=True)
class Call:
    op: int
    tag: int
    leaves: tuple[LeafMeta, ...]


def dtype_code(dtype: torch.dtype) -> int:
    try:
        return DTYPES.index(dtype)
    except ValueError:
        return 1000 + _crc(str(dtype)) % 1000


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


def tag_of(*values: object) -> int:
    """A stable integer for call arguments that must agree across ranks (e.g. a directory)."""
    return _crc(repr(values))


def encode_head(op: Op, tag: int, metas: Sequence[LeafMeta], slots: int) -> torch.Tensor:
    values = [MAGIC, int(op), tag, len(metas)]
    for meta in list(metas)[:slots]:
        values += [meta.dtype, meta.ndim, meta.size, meta.rest]
    values += [0] * (HEAD_FIELDS + slots * LEAF_FIELDS - len(values))
    return torch.tensor(values, dtype=torch.int64)


def decode_head(row: torch.Tensor) -> tuple[int, int, int]:
    magic, op, tag, count = (int(v) for v in row[:HEAD_FIELDS].tolist())
    if magic != MAGIC:
        raise CollectiveError(
            "A peer sent data that is not an nbtrain collective header: the ranks' collective "
            "calls are out of step (a rank is in another collective, e.g. its own "
            "torch.distributed call). Make every rank issue the same calls in the same order."
        )
    return op, tag, count


def decode_leaves(row: torch.Tensor, start: int, count: int) -> tuple[LeafMeta, ...]:
    values = row[start : start + count * LEAF_FIELDS].tolist()
    return tuple(LeafMeta(*values[i * LEAF_FIELDS : (i + 1) * LEAF_FIELDS]) for i in range(count))


# ---------------------------------------------------------------------------------------------
# Collectives
