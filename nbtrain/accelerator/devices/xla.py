"""The Accelerator on XLA devices (TPU cores, XLA:CPU): the DistributedType.XLA strategy.

Selected through ``parallel.STRATEGIES``; torch_xla is imported only inside these functions, so
importing this module costs nothing where torch_xla is missing.

- device: ``torch_xla.device()`` of the calling ordinal (``current_device``, used by devices.py);
- models: no DDP; parameters are broadcast from ordinal 0 when prepared, so every replica starts
  identical whatever each one's RNG drew;
- optimizers: the gradients are averaged across ordinals just before the optimizer steps (a step
  pre-hook, so accumulation and fp16/bf16 wrappers are unchanged); the step only happens on
  synchronising micro-steps, so the all-reduce does too. Gradient clipping averages them earlier
  (``reduce_gradients``: the norm must be the full gradient's, the same on every ordinal), and the
  step then skips what is already averaged;
- dataloaders: the same sharding as every other strategy; the dataset runs on the training
  thread with ``num_workers=0`` (random augmentations draw as on the CPU), else in the workers,
  whose batches torch_xla's ParallelLoader moves to the device in a background thread
  (prefetch). The step boundary (``torch_xla.sync()``, which cuts and runs the lazy graph) comes
  when the next batch is asked for, so each training step is one graph;
- collectives: XLA all-gather / all-reduce / broadcast, followed by a sync, so their values are
  ready when nbtrain reads them. The handshake's all-gather runs in a helper thread, so a rank
  left alone in a collective (a peer ended, or never makes the call) gets collectives.py's
  bounded waits and clear errors instead of waiting inside XLA forever; an ordinal that catches
  such an error and goes on fails anyway (``XlaCollectiveAbandoned``);
- checkpoints: save_state marks XLA steps (the device RNG is read at a step boundary, and the
  barriers are steps of their own), and each mark moves the device RNG on. So a run that saves
  and then goes on draws other device random numbers afterwards than a run that never saved; a
  run resumed from the checkpoint draws the same as the run that never saved.

Every ``torch_xla.sync`` is looked up at call time (tests on XLA:CPU replace it: tests/xla).
"""

from __future__ import annotations

import contextlib
import pickle
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from nbtrain.accelerator.comm.backends import LocalBackend, Pending
from nbtrain.accelerator.comm.collectives import Collectives
from nbtrain.accelerator.data.prepared import PreparedDataLoader
from nbtrain.accelerator.training.parallel import DistributedType
from nbtrain.rank import rankenv


def current_device() -> str | None:
    """This ordinal's XLA device, when this process runs XLA: torch_xla already imported (by
    nbtrain's XLA host, or by the user's code) and a PJRT device chosen. Never imports it."""
    if "torch_xla" not in sys.modules or not rankenv.xla_device_chosen():
        return None
    import torch_xla

    return str(torch_xla.device())


def sync() -> None:
    import torch_xla

    torch_xla.sync()


def world_size() -> int:
    try:
        import torch_xla.runtime as xr
    except ImportError as exc:
        raise ModuleNotFoundError(
            "DistributedType.XLA needs torch_xla, which is not installed: pip install "
            "'torch_xla[tpu]' (its version must match torch's), or train on CPU/CUDA."
        ) from exc

    return int(xr.world_size())


class XlaStrategy:
    distributed_type = DistributedType.XLA

    def __init__(self, device: torch.device, *, backend: str, timeout: float) -> None:
        self.device = device
        self.world_size = world_size()
        # Optimizers are usually made before prepare() moves the model. Moving a CPU parameter
        # to XLA cannot happen in place (different tensor types), so torch would hand the model
        # new Parameter objects and the optimizer would keep stepping the old CPU ones. Swapping
        # on conversion keeps every Parameter object and moves its payload instead.
        torch.__future__.set_swap_module_params_on_conversion(True)
        transport = XlaBackend(device) if self.world_size > 1 else LocalBackend()
        self.collectives = Collectives(transport, device, timeout)
        self.dataloader_class = XlaDataLoader
        # Keyed by the parameters themselves, held weakly (never by id(): a parameter made after
        # one was collected may get its id, and would then be taken for it and never watched).
        # An entry goes with its parameter; forget() drops the rest (Accelerator.free_memory).
        self._averaged = WeakIdKeyDictionary()  # parameters whose .grad is this step's average
        self._watched = WeakIdKeyDictionary()  # parameter -> handle of our accumulate-grad hook

    def wrap_model(self, model: nn.Module, ddp_kwargs: dict[str, Any]) -> nn.Module:
        if self.world_size > 1:
            import torch_xla.core.xla_model as xm

            xm.broadcast_master_param(model)  # every replica starts from ordinal 0's values
            sync()
        return model

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return model

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        # Gradients are only reduced when the optimizer really steps (a synchronising
        # micro-step), so there is nothing to switch off.
        return contextlib.nullcontext()

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Average the gradients across ordinals right before each real optimizer step."""
        if self.world_size > 1:
            optimizer.register_step_pre_hook(self._before_step)

    def reduce_gradients(self, parameters: Iterable[torch.Tensor]) -> None:
        """Average these parameters' gradients across ordinals now, for gradient clipping: DDP
        has averaged them in backward, XLA only does at the optimizer step, and clipping each
        ordinal's own gradient by its own norm would step every replica differently."""
        if self.world_size == 1:
            return
        fresh = [p for p in parameters if p.grad is not None and p not in self._averaged]
        _average([p.grad for p in fresh if p.grad is not None], self.world_size)
        for parameter in fresh:
            self._averaged[parameter] = True
            self._watch(parameter)

    def _watch(self, parameter: torch.Tensor) -> None:
        # Another backward pass adds this ordinal's own gradient to the average: from then on
        # the gradient needs averaging again.
        if parameter not in self._watched:
            self._watched[parameter] = parameter.register_post_accumulate_grad_hook(
                self._accumulated
            )

    def _accumulated(self, parameter: torch.Tensor) -> None:
        self._averaged.pop(parameter, None)

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        check_usable(self.collectives.rank)  # the step's all-reduce is an XLA collective too
        params = [p for group in optimizer.param_groups for p in group["params"]]
        pending = [p.grad for p in params if p.grad is not None and p not in self._averaged]
        _average(pending, self.world_size)
        for parameter in params:
            self._averaged.pop(parameter, None)

    def forget(self) -> None:
        """Accelerator.free_memory: drop what this strategy knows of parameters, and take its
        hook off those still alive (a model kept past free_memory no longer calls into it)."""
        for handle in list(self._watched.values()):
            handle.remove()
        self._watched.clear()
        self._averaged.clear()

    def close(self) -> None:
        return None


def _average(gradients: list[torch.Tensor], world: int) -> None:
    """In place, across every ordinal (one all-reduce, in the step's graph)."""
    if gradients:
        import torch_xla.core.xla_model as xm

        xm.all_reduce(xm.REDUCE_SUM, gradients, scale=1.0 / world)


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


# ---------------------------------------------------------------------------------------------
# Collectives transport


# What this process knows of its own ordinals (threads on XLA:CPU, device threads of one TPU
# process): whether each one's function has ended (reported by the XLA host, xla_host.py) and how
# far it got in the handshake gathers, which every ordinal makes in the same order (the n-th of
# one meets the n-th of the others). A peer that ended after completing gather n took part in
# it: a rank still finishing its own side of gather n (its sync and .cpu() after the meeting
# point, slow on a loaded host) only has to wait. A peer that ended before completing it never
# will: the rank waits in vain.


@dataclass
class _OrdinalRecord:
    ended: bool = False
    begun: int = 0  # handshake gathers this ordinal has started
    completed: int = 0  # the number of the last one XLA completed for it
    latest: _GatherInThread | None = None


_ordinals: dict[int, _OrdinalRecord] = {}
_ordinals_lock = threading.Lock()


def _record(ordinal: int) -> _OrdinalRecord:
    # (The caller holds _ordinals_lock.) Also for ordinals not started by nbtrain's XLA host.
    return _ordinals.setdefault(ordinal, _OrdinalRecord())


def ordinal_started(ordinal: int) -> None:
    with _ordinals_lock:
        _ordinals[ordinal] = _OrdinalRecord()


def ordinal_ended(ordinal: int) -> None:
    with _ordinals_lock:
        _record(ordinal).ended = True


def peers_lost_for(rank: int, number: int) -> list[int]:
    """The peers of ``rank`` that ended without completing its gather number ``number``."""
    with _ordinals_lock:
        return sorted(
            ordinal
            for ordinal, record in _ordinals.items()
            if ordinal != rank and record.ended and record.completed < number
        )


class XlaCollectiveAbandoned(BaseException):
    """This ordinal went on after giving up on an XLA collective (collectives.py's timeout or
    lost peers, an error its code caught). That all-gather is still pending inside XLA, which
    cannot cancel it, so any further XLA work of this ordinal could hang, or meet a peer's next
    collective. A BaseException, like SystemExit, so that ``except Exception`` does not swallow
    it as well: the ordinal fails (also when its function returns: xla_host.py), and on a
    multi-ordinal host its process ends with it."""


def abandoned(rank: int, after: str) -> XlaCollectiveAbandoned | None:
    """The error to fail ``rank`` with, if its last gather was given up on and is still in XLA."""
    with _ordinals_lock:
        record = _ordinals.get(rank)
        latest = record.latest if record is not None else None
    if latest is None or latest.done:
        return None
    return XlaCollectiveAbandoned(
        f"ordinal {rank} {after} after giving up on a collective (it timed out, or its peers "
        "were gone, and the error was caught). That XLA all-gather is still pending and cannot "
        "be cancelled, so this ordinal cannot go on on its XLA device. Let a collective's error "
        "end the function instead of catching it, and relaunch."
    )


def check_usable(rank: int) -> None:
    """Before more XLA work of ``rank``: refuse it once a collective of its was abandoned."""
    error = abandoned(rank, "went on to more XLA work")
    if error is not None:
        raise error


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
        with _ordinals_lock:
            record = _record(backend.rank)
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
            with _ordinals_lock:  # before done is set: the ordinal can only end after it
                record = _record(self._backend.rank)
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


# ---------------------------------------------------------------------------------------------
# Checkpoints: safetensors reads tensor storage directly, which XLA tensors do not expose, so
# XLA models are written from a CPU copy of their state (tied weights stored once, as
# safetensors' own save_model does) and read back by copying CPU values into the parameters.


def _tied_groups(model: nn.Module) -> list[list[str]]:
    groups: dict[int, list[str]] = {}
    for name, value in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(value), []).append(name)
    return list(groups.values())


def write_safetensors(model: nn.Module, path: str) -> None:
    from safetensors.torch import save_file

    state = model.state_dict()
    cpu = {names[0]: state[names[0]].detach().cpu().contiguous() for names in _tied_groups(model)}
    save_file(cpu, path, metadata={"format": "pt"})


def read_safetensors(model: nn.Module, path: str, *, strict: bool = True) -> None:
    """``strict`` as in safetensors' load_model (load_state(dir, strict=False) passes it): keys
    missing from the file, or in the file but not in the model, are an error only if strict."""
    from safetensors.torch import load_file

    saved = load_file(path, device="cpu")
    state: dict[str, torch.Tensor] = {}
    known: set[str] = set()
    for names in _tied_groups(model):
        known.update(names)
        found = next((saved[name] for name in names if name in saved), None)
        if found is not None:
            state.update(dict.fromkeys(names, found))
    # Keys of no parameter or buffer go in too, for load_state_dict to report (or, not strict,
    # to skip) as unexpected.
    state.update({name: value for name, value in saved.items() if name not in known})
    model.load_state_dict(state, strict=strict)  # copies into the XLA parameters in place
