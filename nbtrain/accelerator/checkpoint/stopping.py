"""Stop points: where a rank may save a checkpoint and stop, and how the ranks agree on one.

A *stop point* is a prepared DataLoader about to hand out its next batch right after an
optimizer step: the user's whole iteration (step, scheduler, zero_grad, their own counters) is
done and the next batch not yet drawn, so a checkpoint taken there resumes bitwise (the loader
continues at that batch, data/). Steps are seen through torch's global optimizer step hook
(every optimizer counts, prepared or not).

Agreement: the ranks must save and stop at the *same* step, or one would wait in a collective for
a peer that already stopped. A rank cannot block at a stop point to ask the others (a peer not yet
told may be in the next step's gradient all-reduce, waiting for this rank), so the flags travel
one exchange behind: at an exchange step every rank starts an asynchronous MAX all-reduce of its
flag (2: stop requested, 1: a timed checkpoint is due, 0: nothing) on a gloo group of its own,
and reads the previous exchange's result. Every rank reads the same results at the same step, so
they act alike. Exchanges come about every 50 ms of training (``_Agreement``), so a stop lands
within about 0.1 s plus two steps. Only launches that need agreement (``on_interrupt=
"checkpoint"``, ``checkpoint_every`` in time) pay for it; periodic checkpoints by steps need none.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook

from nbtrain.accelerator.checkpoint import automatic
from nbtrain.accelerator.checkpoint import state as checkpoint
from nbtrain.accelerator.checkpoint.resume import Resume
from nbtrain.rank import interrupts, runtime
from nbtrain.shared.checkpoints import automatic_name
from nbtrain.shared.events import Status
from nbtrain.shared.stopping import StopPolicy, TrainingStopped

if TYPE_CHECKING:
    from nbtrain.accelerator.checkpoint.target import CheckpointTarget

NOTHING, SAVE, STOP = 0, 1, 2


class Stops:
    """Stop points of one launch (or one warm call) in this process; shared by its
    Accelerators, since the step count and the agreement belong to the process."""

    def __init__(self, policy: StopPolicy | None) -> None:
        self.policy = policy
        self.steps = policy.resumed_steps if policy is not None else 0
        self._stepped = False
        self._number = policy.next_number if policy is not None else 0
        self._saved_at = time.monotonic()
        self._agreement: _Agreement | None = None
        self._hook: Any = None  # torch's handle of the global optimizer step hook
        # resume=True: loaded by the first Accelerator's prepare() (resume.py)
        self.resume = Resume(policy.resume_from) if policy and policy.resume_from else None

    @property
    def active(self) -> bool:
        return self.policy is not None

    def watch_steps(self) -> None:
        """Count every optimizer's steps (prepared or not) through torch's global hook."""
        if self.policy is not None and self._hook is None:
            self._hook = register_optimizer_step_post_hook(self._on_step)

    def forget(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _on_step(self, *_: Any) -> None:
        current = runtime.current()
        if current is None or current.stopping is not self.policy:
            self.forget()  # the run is over (num_processes=1: this process is the kernel)
            return
        self._stepped = True

    def arm(self) -> None:
        """A prepared loader exists: an interrupt can now wait for a stop point."""
        if self.policy is not None and self.policy.on_interrupt:
            interrupts.arm()

    def resumed(self, steps: int) -> None:
        """A checkpoint was loaded: the step count continues from it."""
        self.steps = steps

    def after_prepare(self, accelerator: CheckpointTarget) -> None:
        steps = self.resume.after_prepare(accelerator) if self.resume is not None else None
        if steps is not None:
            self.resumed(steps)

    def registered(self, objects: list[Any], first: int) -> None:
        if self.resume is not None:
            self.resume.registered(objects, first)

    def cancel_resume(self) -> None:
        """The function loads a checkpoint itself: resume=True's load is not applied."""
        if self.resume is not None:
            self.resume.cancel()

    def point(self, accelerator: CheckpointTarget) -> None:
        """A prepared loader of ``accelerator`` is about to hand out its next batch."""
        if self.resume is not None:
            self.resume.at_loop_start(accelerator)
        if not self._stepped:
            return
        self._stepped = False
        self.steps += 1
        policy = self.policy
        assert policy is not None
        decision = self._agree() if policy.agrees else NOTHING
        if decision == STOP:
            path = self.save(accelerator, "saving checkpoint…")
            raise TrainingStopped(self.steps, str(path))
        every = policy.every_steps
        if decision == SAVE or (every is not None and self.steps % every == 0):
            self.save(accelerator, "saving checkpoint…")

    def _agree(self) -> int:
        if self._agreement is None:
            self._agreement = _Agreement()
        return self._agreement.at_step(self.steps, self._flag)

    def _flag(self) -> int:
        policy = self.policy
        assert policy is not None
        if interrupts.requested():
            return STOP
        if policy.every_seconds is not None:
            due = time.monotonic() - self._saved_at >= policy.every_seconds
            return SAVE if due else NOTHING
        return NOTHING

    def save(self, accelerator: CheckpointTarget, note: str) -> str:
        """Every rank: save the registered state as the next numbered checkpoint."""
        policy = self.policy
        assert policy is not None
        _say(note)
        target = automatic_name(policy.project_dir, self._number)
        self._number += 1
        checkpoint.save_state(target, accelerator.training_state(), accelerator.collectives)
        if policy.total_limit is not None and accelerator.is_main_process:
            automatic.prune_automatic(policy.project_dir, policy.total_limit, target)
        self._saved_at = time.monotonic()
        _say(f"saved {target.name} at step {self.steps}")
        return str(target)


class _Agreement:
    """The one-exchange-behind MAX all-reduce of the ranks' flags, on a gloo group of its own
    (CPU tensors whatever the training backend; never queued behind the gradients' collectives).

    A tiny gloo all-reduce costs a few hundred microseconds here, too much for every step of a
    fast loop, so the ranks exchange every ``interval`` steps, chosen to come about every
    EVERY seconds of training: each exchange also carries each rank's wish for the next interval
    (from its own step time), and the ranks take the smallest. Everyone learns the interval from
    the same result at the same step, so the schedule stays identical on every rank."""

    EVERY = 0.05  # seconds of training between exchanges (a stop lands within about twice this)

    def __init__(self) -> None:
        self._world = dist.get_world_size() if dist.is_initialized() else 1
        # new_group is collective: every rank reaches its first step point in the same order.
        self._group = dist.new_group(backend="gloo") if self._world > 1 else None
        self._buffers = (torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))
        self._turn = 0
        self._pending: tuple[Any, torch.Tensor] | None = None
        self._local = (NOTHING, -1)
        self._next = 0  # the step of the next exchange
        self._since: tuple[float, int] | None = None  # (time, step) of the last exchange

    def at_step(self, step: int, flag: Callable[[], int]) -> int:
        """At every step point: the agreed flag when this step is an exchange, else NOTHING."""
        if step < self._next:
            return NOTHING
        now, wish = time.monotonic(), 1
        if self._since is not None:  # (the first exchange has no step time to go by)
            then, last = self._since
            per_step = (now - then) / max(1, step - last)
            wish = max(1, min(10_000, int(self.EVERY / per_step) if per_step > 0 else 1))
        self._since = (now, step)
        agreed, interval = self._exchange(flag(), wish)
        self._next = step + interval
        return agreed

    def _exchange(self, flag: int, wish: int) -> tuple[int, int]:
        """Send (flag, wish); return the previous exchange's (MAX flag, MIN wish)."""
        if self._group is None:
            previous, self._local = self._local, (flag, -wish)
            return previous[0], max(1, -previous[1])
        agreed, interval = NOTHING, 1
        if self._pending is not None:
            work, buffer = self._pending
            work.wait()
            agreed, interval = int(buffer[0]), max(1, -int(buffer[1]))
        buffer = self._buffers[self._turn]
        self._turn ^= 1
        buffer[0], buffer[1] = flag, -wish  # MAX of -wish is -(the smallest wish)
        work = dist.all_reduce(buffer, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        self._pending = (work, buffer)
        return agreed, interval


def _say(text: str) -> None:
    """The rank's row in the live view shows it (a Status event)."""
    current = runtime.current()
    if current is not None:
        current.sink.send(Status(current.info.rank, text))


# One per process and policy: a new launch (or warm call) brings a new policy object.
_current: Stops = Stops(None)


def for_this_run() -> Stops:
    """The stop points of the run this process is in (inactive outside a stop policy)."""
    global _current
    current = runtime.current()
    policy = current.stopping if current is not None else None
    if policy is not _current.policy:
        _current.forget()
        _current = Stops(policy)
        _current.watch_steps()
    return _current
