"""The collectives transport on XLA devices (xla.py's strategy hands it to ``Collectives``); what
this process knows of its ordinals is kept on the rank side (rank/xla_ordinals.py), where the
XLA host (rank/xla_host.py) reports their ends."""

from __future__ import annotations

import pickle
import threading
from typing import Any

import torch

from nbtrain.accelerator.comm.backends import Pending
from nbtrain.accelerator.devices.xla_runtime import sync
from nbtrain.rank.xla_ordinals import check_usable, ordinals_lock, peers_lost_for, record_of

# ---------------------------------------------------------------------------------------------
# Collectives transport


class XlaBackend:
    """XLA collectives across every ordinal, each in a graph of its own: a sync (the step mark)
    first runs the pending work, which may differ between ordinals (e.g. the padding of uneven
    tensors, the last batch's forward), and one after the collective runs it, the same graph on
    every replica, before its values are read."""

    _OPS = {"sum": "sum", "max": "max", "min": "min"}

    def __init__(self, device: torch.device) -> None:
        import torch_xla.runtime as xr

        self.device = device
        self.rank = int(xr.global_ordinal())
        self.world_size = int(xr.world_size())

    def all_gather_async(self, tensor: torch.Tensor) -> Pending:
        check_usable(self.rank)
        return _GatherInThread(self, tensor)

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        check_usable(self.rank)
        return self.gather_now(tensor)

    def gather_now(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """all_gather, unchecked: also what a gather's helper thread runs."""
        import torch_xla.core.xla_model as xm

        flat = tensor.to(self.device).unsqueeze(0)
        sync()
        # pin_layout=False: the native all-gather, one graph for every replica (the pinned
        # variant builds it from an all-reduce with the ordinal baked in as a constant).
        gathered = xm.all_gather(flat, dim=0, pin_layout=False)
        sync()
        return [part.squeeze(0).to(tensor.device) for part in gathered.cpu().split(1, dim=0)]

    def all_reduce(self, tensor: torch.Tensor, op: str) -> None:
        import torch_xla.core.xla_model as xm

        check_usable(self.rank)
        work = tensor.to(self.device)
        sync()
        xm.all_reduce(self._OPS[op], [work])
        sync()
        if work is not tensor:
            tensor.copy_(work.to(tensor.device))

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        import torch_xla.core.xla_model as xm

        check_usable(self.rank)
        work = tensor.to(self.device)
        sync()
        xm.collective_broadcast([work], root_ordinal=src)
        sync()
        if work is not tensor:
            tensor.copy_(work.to(tensor.device))

    def all_gather_object(self, obj: Any) -> list[Any]:
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        sizes = self.all_gather(torch.tensor([data.numel()], dtype=torch.int64))
        longest = max(int(size) for size in sizes)
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[: data.numel()] = data
        parts = self.all_gather(padded)
        return [
            pickle.loads(part[: int(size)].numpy().tobytes())
            for part, size in zip(parts, sizes, strict=True)
        ]

    def broadcast_object(self, obj: Any, src: int) -> Any:
        return self.all_gather_object(obj if self.rank == src else None)[src]


class _GatherInThread:
    """An all-gather run by a helper thread, awaited in bounded slices by the ordinal's thread.

    XLA offers no timeout: an ordinal inside a collective its peers never join waits forever (on
    XLA:CPU, until XLA aborts the whole process). Waiting here instead lets collectives.py time
    out, announce a stall, and fail at once when a peer ordinal of this process has ended
    without taking part in this gather (one that ended after completing it is no loss: this
    side completes too, however long its sync takes, within collectives.py's timeout).

    After such a timeout or loss the helper stays inside XLA's collective, where nothing can
    cancel it (a daemon thread: it does not keep the process alive). The ordinal's error,
    PeerLostError or CollectiveTimeoutError, normally ends its function, and xla_host.py then
    ends the process. Code that catches the error and goes on gets XlaCollectiveAbandoned (not
    an Exception) at its next collective, optimizer step or batch, and a function that returns
    after it fails with that error too."""

    def __init__(self, backend: XlaBackend, tensor: torch.Tensor) -> None:
        self._backend = backend
        self._done = threading.Event()
        self._value: list[torch.Tensor] = []
        self._failure: BaseException | None = None  # XLA's own error in the helper
        self._lost: RuntimeError | None = None  # peers ended while this ordinal waited
        with ordinals_lock:
            record = record_of(backend.rank)
            record.begun += 1
            self._number = record.begun
            record.latest = self
        helper = threading.Thread(
            target=self._run, args=(tensor,), name=f"nbtrain-xla-gather-{backend.rank}"
        )
        helper.daemon = True  # a gather that never completes must not keep the process alive
        helper.start()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def _run(self, tensor: torch.Tensor) -> None:
        try:
            import torch_xla

            # The default XLA device is per thread: this one must work on the ordinal's.
            torch_xla.device(self._backend.device.index or 0)
            self._value = self._backend.gather_now(tensor)
            with ordinals_lock:  # before done is set: the ordinal can only end after it
                record = record_of(self._backend.rank)
                record.completed = max(record.completed, self._number)
        except BaseException as exc:
            self._failure = exc
        finally:
            self._done.set()

    def wait(self, seconds: float) -> bool:
        if self._done.wait(seconds):
            if self._failure is not None:
                # Raised from here, not result(): collectives.py reads an error from result()
                # as a lost peer, and XLA's own error must reach the user as it is.
                raise self._failure
            return True
        lost = peers_lost_for(self._backend.rank, self._number)
        if not lost:
            return False  # peers still running, or done with this gather: keep waiting
        self._lost = RuntimeError(
            f"ordinal(s) {lost} ended before completing this collective, so it never will"
        )
        return True

    def result(self) -> list[torch.Tensor]:
        if self._lost is not None:
            raise self._lost
        return self._value
