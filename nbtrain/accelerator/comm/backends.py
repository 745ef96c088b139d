"""The transports collectives run over: a ``Backend`` (all_gather, all_reduce, broadcast and
their object forms) with waits that can be polled (``Pending``). torch.distributed's process
group here, a local one for one process; XLA adds its own (devices/xla_collectives.py)."""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta
from typing import Any, Protocol

import torch


class Pending(Protocol):
    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds``; True once the operation finished (succeeded or failed)."""
        ...

    def result(self) -> list[torch.Tensor]: ...


class Backend(Protocol):
    rank: int
    world_size: int

    def all_gather_async(self, tensor: torch.Tensor) -> Pending: ...

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]: ...

    def all_reduce(self, tensor: torch.Tensor, op: str) -> None: ...

    def broadcast(self, tensor: torch.Tensor, src: int) -> None: ...

    def all_gather_object(self, obj: Any) -> list[Any]: ...

    def broadcast_object(self, obj: Any, src: int) -> Any: ...


class Done:
    """A Pending whose value is already there (a world of one, or a synchronous backend)."""

    def __init__(self, value: list[torch.Tensor]) -> None:
        self._value = value

    def wait(self, seconds: float) -> bool:
        return True

    def result(self) -> list[torch.Tensor]:
        return self._value


class LocalBackend:
    """A world of one: every collective is the identity."""

    rank = 0
    world_size = 1

    def all_gather_async(self, tensor: torch.Tensor) -> Pending:
        return Done([tensor])

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        return [tensor]

    def all_reduce(self, tensor: torch.Tensor, op: str) -> None:
        return None

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        return None

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def broadcast_object(self, obj: Any, src: int) -> Any:
        return obj


class _AsyncGather:
    def __init__(self, work: Any, outputs: list[torch.Tensor], blocking_wait: bool) -> None:
        self._work = work
        self._outputs = outputs
        self._blocking_wait = blocking_wait

    def wait(self, seconds: float) -> bool:
        if self._blocking_wait:
            # gloo: a bounded wait returns the moment the operation ends, and may be repeated.
            with contextlib.suppress(RuntimeError):  # not done in time, or failed:
                self._work.wait(timeout=timedelta(seconds=seconds))  # is_completed() tells
            return bool(self._work.is_completed())
        # Other backends (nccl may abort a communicator on a timed-out wait): poll.
        deadline = time.monotonic() + seconds
        while not self._work.is_completed():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.0005)
        return True

    def result(self) -> list[torch.Tensor]:
        self._work.wait()
        return self._outputs


class ProcessGroupBackend:
    """torch.distributed's default process group (gloo or nccl)."""

    _REDUCE_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}

    def __init__(self) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._gloo = dist.get_backend() == "gloo"

    def __getstate__(self) -> dict[str, Any]:
        # (an Accelerator is picklable, as Accelerate's is: not the torch.distributed module)
        return {k: v for k, v in vars(self).items() if k != "_dist"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        import torch.distributed as dist

        vars(self).update(state)
        self._dist = dist

    def all_gather_async(self, tensor: torch.Tensor) -> Pending:
        outputs = [torch.empty_like(tensor) for _ in range(self.world_size)]
        work = self._dist.all_gather(outputs, tensor, async_op=True)
        return _AsyncGather(work, outputs, blocking_wait=self._gloo)

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        outputs = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self._dist.all_gather(outputs, tensor)
        return outputs

    def all_reduce(self, tensor: torch.Tensor, op: str) -> None:
        self._dist.all_reduce(tensor, op=getattr(self._dist.ReduceOp, self._REDUCE_OPS[op]))

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self._dist.broadcast(tensor, src=src)

    def all_gather_object(self, obj: Any) -> list[Any]:
        outputs: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(outputs, obj)
        return outputs

    def broadcast_object(self, obj: Any, src: int) -> Any:
        box = [obj]
        self._dist.broadcast_object_list(box, src=src)
        return box[0]


# ---------------------------------------------------------------------------------------------
# Handshake
