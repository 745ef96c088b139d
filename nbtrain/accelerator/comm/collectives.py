"""Collectives across ranks that cannot silently hang or corrupt data.

Every operation starts with a *handshake*: one small fixed-size all_gather in which each rank
states which operation it is in (gather, reduce, save_state, wait_for_everyone, ...), an argument
tag, and the dtype/shape of each tensor it brings. All ranks then see the same table and take the
same decision:

- ranks in different operations (``save_state`` on rank 0, ``wait_for_everyone`` on rank 1: the
  Accelerate deadlock of acc #1171 / #2690) raise a clear error on every rank at once;
- mismatched structures, dtypes or shapes raise instead of hanging in, or garbling, the transfer;
- tensors whose first dimension differs between ranks (including empty ones) are gathered
  correctly, so a rank without samples never blocks the others.

The handshake is awaited by polling, so a rank whose peer ended (finished or died) gets an error
at once, a long wait is announced, and no wait lasts beyond ``timeout``. A rank stuck in a
collective nbtrain does not see (e.g. DDP's gradient all-reduce) can still hold its peers until
that timeout: then the error explains the likely cause.

The transport is a small ``Backend`` (torch.distributed here; XLA can add its own), chosen by the
parallel strategy.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch

from nbtrain.accelerator.comm import nested
from nbtrain.accelerator.comm.backends import Backend, Pending
from nbtrain.accelerator.comm.handshake import (
    DTYPES,
    HEAD_FIELDS,
    SLOTS,
    Call,
    CollectiveError,
    CollectiveTimeoutError,
    LeafMeta,
    Op,
    PeerLostError,
    decode_head,
    decode_leaves,
    encode_head,
    tag_of,
)
from nbtrain.accelerator.comm.padding import has_dim, pad, pad_meta
from nbtrain.rank import runtime

DEFAULT_TIMEOUT = 1800.0  # seconds: torch's own default process-group timeout
STALL_NOTICE = 120.0  # seconds waited in one call before the rank says so
PEER_LOSS_GRACE = 1.0  # seconds a rank that lost its peers waits before reporting it
_SLICE = 0.5  # seconds per bounded wait, between checks of the stall notice and the timeout



# ---------------------------------------------------------------------------------------------
# Transport


class Collectives:
    """The collective operations of one rank, over one backend."""

    def __init__(
        self,
        backend: Backend,
        device: torch.device,
        timeout: float = DEFAULT_TIMEOUT,
        stall_notice: float = STALL_NOTICE,
        on_stall: Callable[[str], None] | None = None,
    ) -> None:
        self.backend = backend
        self.device = device
        self.timeout = timeout
        self.stall_notice = stall_notice
        self._on_stall = on_stall or _announce

    @property
    def rank(self) -> int:
        return self.backend.rank

    @property
    def world_size(self) -> int:
        return self.backend.world_size

    # -- handshake --------------------------------------------------------------------------

    def handshake(self, op: Op, tag: int = 0, metas: Sequence[LeafMeta] = ()) -> list[Call]:
        """Every rank's (op, tag, tensor descriptions); raises on every rank if ops or tags
        differ. Also a barrier: it completes only when every rank has made the call."""
        header = encode_head(op, tag, metas, SLOTS).to(self.device)
        rows = [row.cpu() for row in self._wait(self.backend.all_gather_async(header), op)]
        heads = [decode_head(row) for row in rows]
        self._check_same_call(op, tag, heads)
        counts = [count for _, _, count in heads]
        if max(counts) <= SLOTS:
            described = [
                decode_leaves(row, HEAD_FIELDS, count)
                for row, count in zip(rows, counts, strict=True)
            ]
        else:  # every rank sees the same counts, so every rank takes this second round
            longest = max(counts)
            full = encode_head(op, tag, metas, longest).to(self.device)
            rows = [row.cpu() for row in self.backend.all_gather(full)]
            described = [
                decode_leaves(row, HEAD_FIELDS, count)
                for row, count in zip(rows, counts, strict=True)
            ]
        return [
            Call(op_, tag_, leaves) for (op_, tag_, _), leaves in zip(heads, described, strict=True)
        ]

    def _check_same_call(self, op: Op, tag: int, heads: list[tuple[int, int, int]]) -> None:
        ops = [head[0] for head in heads]
        if len(set(ops)) > 1:
            calls = ", ".join(f"rank {r}: {_call_name(o)}" for r, o in enumerate(ops))
            raise CollectiveError(
                f"Ranks made different collective calls at the same point ({calls}); this rank "
                f"({self.rank}) is in {op.call} at {_user_site()}. Every rank must make the same "
                "collective calls in the same order. A common cause is a call inside `if "
                "accelerator.is_main_process:`: save_state(), load_state(), "
                "wait_for_everyone(), gather() and reduce() must run on every rank (save_state "
                "already writes shared files from the main process only)."
            )
        tags = [head[1] for head in heads]
        if len(set(tags)) > 1:
            raise CollectiveError(
                f"{op.call} was called with different arguments on different ranks (this is rank "
                f"{self.rank}, at {_user_site()}). Pass the same values on every rank, e.g. the "
                "same directory to save_state()/load_state() and the same from_process to "
                "broadcast()."
            )

    # Error texts here avoid the words the launcher reads as "lost a peer, not the root cause"
    # (worker.is_collateral): a rank waiting alone *is* the root cause; when a peer really
    # failed, its report is earlier in time (it is sent before its connections close).
    def _wait(self, pending: Pending, op: Op) -> list[torch.Tensor]:
        start = time.monotonic()
        announced = False
        while not pending.wait(_SLICE):
            waited = time.monotonic() - start
            if waited > self.timeout:
                raise CollectiveTimeoutError(
                    f"Rank {self.rank} gave up after waiting {waited:.0f} s in {op.call} at "
                    f"{_user_site()} for the other ranks to make the same call. A rank that never "
                    "makes it (e.g. a call inside `if accelerator.is_main_process:`) or that is "
                    "stuck in another collective leaves the others waiting. Make every rank issue "
                    "the same collective calls in the same order; if a rank is only slow, raise "
                    "the limit with InitProcessGroupKwargs(timeout=timedelta(...))."
                )
            if not announced and waited > self.stall_notice:
                announced = True
                self._on_stall(
                    f"rank {self.rank} has waited {waited:.0f} s in {op.call} at {_user_site()} "
                    "for ranks that have not made the same call yet. Fine if they are busy; if one "
                    "never makes it (e.g. the call sits inside `if accelerator.is_main_process:`)"
                    f", this rank stops after {self.timeout:.0f} s."
                )
        try:
            return pending.result()
        except RuntimeError as exc:
            # If the peer died of its own failure (a crash, a kill), the launcher stops this rank
            # within this pause, so the peer's failure stays the reported root cause. If the peer
            # simply finished (it skipped this call), nobody stops us and the error below is the
            # root cause.
            time.sleep(PEER_LOSS_GRACE)
            raise PeerLostError(
                f"{op.call} on rank {self.rank} (at {_user_site()}) lost its peers: another "
                "rank ended, or failed, before making the same call. If no other rank failed, "
                "one skipped this call: every rank must make it (e.g. not inside `if "
                "accelerator.is_main_process:`)."
            ) from exc

    # -- tensor operations --------------------------------------------------------------------

    def barrier(self, op: Op = Op.WAIT_FOR_EVERYONE, tag: int = 0) -> None:
        if self.world_size > 1:
            self.handshake(op, tag)

    def gather(self, data: Any) -> Any:
        """Concatenate every rank's tensors along dim 0 (0-dim tensors become shape (world,)).

        First dimensions may differ between ranks, including zero."""
        tensors = nested.tensor_leaves_only(data, "gather()")
        if self.world_size == 1:
            return data
        tensors = [t.reshape(1) if t.ndim == 0 else t for t in tensors]
        calls = self.handshake(Op.GATHER, 0, [LeafMeta.of(t) for t in tensors])
        self._check_leaves(calls, Op.GATHER, same_size=False)
        gathered = [
            self._gather_one(t, [call.leaves[i].size for call in calls])
            for i, t in enumerate(tensors)
        ]
        return nested.rebuild(data, gathered)

    def _gather_one(self, tensor: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        longest = max(sizes)
        if longest == 0:
            return tensor.new_empty((0, *tensor.shape[1:]))
        send = tensor.detach().contiguous()
        if tensor.shape[0] < longest:
            filler = tensor.new_zeros((longest - tensor.shape[0], *tensor.shape[1:]))
            send = torch.cat([send, filler])
        parts = self.backend.all_gather(send)
        return torch.cat([part[:size] for part, size in zip(parts, sizes, strict=True)])

    def reduce(self, data: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        if reduction not in {"sum", "mean", "max", "min", "none"}:
            raise ValueError(
                f"reduce(reduction={reduction!r}) is not supported: use 'sum', 'mean', 'max', "
                "'min' or 'none'."
            )
        tensors = nested.tensor_leaves_only(data, "reduce()")
        if reduction == "none":
            return data
        results = [t.detach().clone() for t in tensors]  # values, not part of a graph
        if self.world_size > 1:
            calls = self.handshake(Op.REDUCE, tag_of(reduction), [LeafMeta.of(t) for t in tensors])
            self._check_leaves(calls, Op.REDUCE, same_size=True)
            for tensor in results:
                self.backend.all_reduce(tensor, "sum" if reduction == "mean" else reduction)
        if reduction == "mean":
            results = [t / self.world_size for t in results]
        if scale != 1.0:
            results = [t * scale for t in results]
        return nested.rebuild(data, results)

    def broadcast(self, data: Any, from_process: int = 0) -> Any:
        """Every rank's tensors get ``from_process``'s values, in place (shapes must match)."""
        self._check_source(from_process, "broadcast")
        tensors = nested.tensor_leaves_only(data, "broadcast()")
        if self.world_size == 1:
            return data
        calls = self.handshake(Op.BROADCAST, from_process, [LeafMeta.of(t) for t in tensors])
        self._check_leaves(calls, Op.BROADCAST, same_size=True)
        for tensor in tensors:
            if tensor.is_contiguous():
                self.backend.broadcast(tensor, from_process)
            else:
                buffer = tensor.contiguous()
                self.backend.broadcast(buffer, from_process)
                tensor.copy_(buffer)
        return data

    def pad_across_processes(
        self, data: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False
    ) -> Any:
        """Pad each tensor along ``dim`` to the largest size any rank has.

        A tensor that has no dimension ``dim`` (e.g. the 1-D leaves of a batch padded along
        dim=1) is returned unchanged, as in Accelerate."""
        tensors = nested.tensor_leaves_only(data, "pad_across_processes()")
        if self.world_size == 1:
            return data
        metas = [pad_meta(t, dim) for t in tensors]
        calls = self.handshake(Op.PAD, tag_of(dim), metas)
        self._check_leaves(calls, Op.PAD, same_size=False)
        padded = [
            pad(t, dim, max(call.leaves[i].size for call in calls), pad_index, pad_first)
            if has_dim(t, dim)
            else t
            for i, t in enumerate(tensors)
        ]
        return nested.rebuild(data, padded)

    # -- objects ------------------------------------------------------------------------------

    def gather_object(self, obj: Any) -> Any:
        """Every rank's object, in one list, as Accelerate's gather_object: a rank's list, tuple
        or tensor contributes its items (a tensor its rows), any other object itself. In a
        world of one, ``obj`` itself."""
        if self.world_size == 1:
            return obj
        self.handshake(Op.GATHER_OBJECT)
        gathered: list[Any] = []
        for part in self.backend.all_gather_object(obj):
            if isinstance(part, (list, tuple)) or (isinstance(part, torch.Tensor) and part.ndim):
                gathered.extend(part)
            else:  # (Accelerate iterates these too: a dict's keys, a string's characters)
                gathered.append(part)
        return gathered

    def broadcast_object(self, obj: Any, from_process: int = 0) -> Any:
        self._check_source(from_process, "broadcast_object")
        if self.world_size == 1:
            return obj
        self.handshake(Op.BROADCAST_OBJECT, from_process)
        return self.backend.broadcast_object(obj, from_process)

    # -- checks -------------------------------------------------------------------------------

    def _check_source(self, from_process: int, what: str) -> None:
        if (
            isinstance(from_process, bool)
            or not isinstance(from_process, int)
            or not (0 <= from_process < self.world_size)
        ):
            raise ValueError(
                f"{what}(from_process={from_process!r}) must be a rank in 0..{self.world_size - 1}."
            )

    def _check_leaves(self, calls: list[Call], op: Op, *, same_size: bool) -> None:
        counts = [len(call.leaves) for call in calls]
        if len(set(counts)) > 1:
            raise CollectiveError(
                f"{op.call} got a different number of tensors on each rank ("
                + ", ".join(f"rank {r}: {n}" for r, n in enumerate(counts))
                + "). Pass the same structure (same keys, same list lengths) on every rank."
            )
        for index in range(counts[0]):
            metas = [call.leaves[index] for call in calls]
            where = f"tensor #{index} of {op.call}"
            if len({m.dtype for m in metas}) > 1:
                raise CollectiveError(
                    f"{where} has a different dtype on different ranks (this rank {self.rank}: "
                    f"{_dtype_name(metas[self.rank].dtype)}; others: "
                    f"{sorted({_dtype_name(m.dtype) for m in metas})}). Cast it to one dtype first."
                )
            if len({(m.ndim, m.rest) for m in metas}) > 1 or (
                same_size and len({m.size for m in metas}) > 1
            ):
                hint = (
                    "Shapes must be identical on every rank."
                    if same_size
                    else "Only the gathered/padded dimension may differ: use "
                    "pad_across_processes(tensor, dim=...) on the others first."
                )
                raise CollectiveError(
                    f"{where} has a different shape on different ranks (sizes along the "
                    f"dimension: {[m.size for m in metas]}, dims: {[m.ndim for m in metas]}). "
                    + hint
                )


def truncate_for_metrics(data: Any, remainder: int, as_objects: bool = False) -> Any:
    """Keep the first ``remainder`` samples: the real ones of a last batch completed by
    wrapping around. Gathered tensors are cut along dim 0, each leaf; what gather_object
    returned (one flat list of every rank's items) is cut as a whole."""
    if as_objects:
        return data[:remainder] if isinstance(data, (list, tuple, torch.Tensor)) else data
    return nested.map_tensors(lambda t: t[:remainder] if t.ndim else t, data)


def _dtype_name(code: int) -> str:
    return str(DTYPES[code]) if 0 <= code < len(DTYPES) else f"dtype#{code}"


def _call_name(op: int) -> str:
    try:
        return Op(op).call
    except ValueError:
        return f"operation #{op}"


def _user_site() -> str:
    """The first frame outside nbtrain: where the user made the call."""
    package = __name__.rsplit(".", 1)[0]
    for frame in reversed(traceback.extract_stack()[:-1]):
        path = frame.filename.replace("\\", "/")
        name = path.rsplit("/", 1)[-1]
        if f"/{package}/" not in path and name not in _PLUMBING:
            return f"{name}:{frame.lineno}"
    return "<unknown>"


_PLUMBING = {"contextlib.py", "functools.py"}  # frames between the user's `with` and ours


def _announce(text: str) -> None:
    """Tell the user while a rank waits: stderr, and the live view's status line in a launch."""
    print(f"[nbtrain] {text}", file=sys.stderr, flush=True)
    current = runtime.current()
    if current is not None:
        from nbtrain.shared.events import Status

        current.sink.send(Status(current.info.rank, text))
