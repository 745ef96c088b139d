"""progress() and log(): how code in a rank reports to the kernel's live view.

Usable from any rank (raw DDP code, an Accelerator, a Trainer callback). In a rank the calls go
to the rank's ``Reporter`` (reporter.py), which coalesces them into a few updates a second;
outside a launch (``runtime.current()`` is None) the same calls draw a text bar and print.
"""

from __future__ import annotations

import contextlib
import numbers
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol, TypeVar

from nbtrain.rank import runtime
from nbtrain.rank.reporter import Reporter, reporter_for
from nbtrain.shared.events import ResumedFrom, Status, Strategy

T = TypeVar("T")


def progress(
    iterable: Iterable[T], total: int | None = None, desc: str | None = None
) -> Iterator[T]:
    """Yield the items of ``iterable`` while reporting this rank's progress through them.

    ``total`` defaults to ``len(iterable)`` when it has one; ``desc`` names the loop
    (e.g. "train"). In a rank the kernel's live view shows the bar; outside a launch a text bar
    is drawn on stderr.
    """
    total = _resolve_total(iterable, total)
    if desc is not None and not isinstance(desc, str):
        raise TypeError(f"progress(desc={desc!r}) must be a string or None, e.g. desc='train'.")
    current = runtime.current()
    if current is None:
        from nbtrain.rank.textbar import text_progress

        return text_progress(iterable, total, desc)
    return _rank_progress(reporter_for(current), iterable, total, desc)


def announce_strategy(name: str) -> None:
    """Show ``name`` (e.g. 'fsdp2') beside this rank's device in the live view."""
    current = runtime.current()
    if current is not None:
        current.sink.send(Strategy(current.info.rank, name))


def say(text: str) -> None:
    """What this rank is busy with while it shows no progress ('forming the process group'),
    in its row until it moves on; '' clears it. Nothing outside a launch."""
    current = runtime.current()
    if current is not None:
        with contextlib.suppress(OSError):  # the kernel's end is gone: being stopped anyway
            current.sink.send(Status(current.info.rank, text))


def resumed_at(step: int) -> None:
    """A run resumed from a checkpoint taken after ``step`` loop steps: default log() steps go on
    from there, so the chart's step axis continues the first run's instead of restarting."""
    current = runtime.current()
    if current is not None:
        reporter = reporter_for(current)
        reporter.global_step = reporter.log_calls = step


def resumed_from(source: str, step: int) -> None:
    """Say in the dashboard's header that the run resumed from checkpoint ``source`` after
    ``step`` optimizer steps; outside a launch, on stderr."""
    current = runtime.current()
    if current is None:
        print(f"[nbtrain] resumed from {source} (step {step})", file=sys.stderr, flush=True)
        return
    with contextlib.suppress(OSError):  # the kernel's end is gone: being stopped anyway
        current.sink.send(ResumedFrom(current.info.rank, source, step))


def optimizer_stepped(optimizer: object) -> None:
    """``optimizer`` (an Accelerator's prepared one) really stepped: not an accumulation
    micro-step, not a step the fp16 grad scaler skipped. The live view's rate counts these
    optimizer steps; with several optimizers (a GAN's) the one that stepped most counts."""
    current = runtime.current()
    if current is not None:
        counts = reporter_for(current).optimizer_steps
        counts[id(optimizer)] = counts.get(id(optimizer), 0) + 1


def log(values: Mapping[str, Any], step: int | None = None) -> None:
    """Report metrics of this rank, e.g. ``log({"loss": loss.item()})``.

    Values may be Python numbers, NumPy scalars or one-element tensors. ``step`` defaults to the
    number of progress() iterations this rank completed, counting the one running (the first
    step's loss is at step 1, the N-th's at N, as "Stopped at step N" counts), or of log()
    calls, this one included, when it uses no progress() (the N-th call at step N). Inside a
    progress() loop logs go out with the loop's updates (coalesced messages; every value logged
    reaches the kernel).

    :param values: metric names and numbers.
    :param step: the step the values belong to.
    :raises TypeError: a value that is not a number, or a ``step`` that is not an int.
    """
    numbers_only = _check_values(values)
    if step is not None and (isinstance(step, bool) or not isinstance(step, numbers.Integral)):
        raise TypeError(f"log(step={step!r}) must be an int or None, e.g. step=100.")
    current = runtime.current()
    if current is None:
        from nbtrain.rank.textbar import print_metrics

        print_metrics(numbers_only, None if step is None else int(step))
        return
    reporter_for(current).log(numbers_only, None if step is None else int(step))


class ProgressHandle(Protocol):
    def update_to(self, step: int) -> None: ...

    def close(self, *, complete: bool = False) -> None: ...


def open_bar(total: int | None = None, desc: str | None = None) -> ProgressHandle:
    """A bar driven by explicit step counts, for code that is told the step (e.g. callbacks).

    Call ``update_to(step)`` as steps complete and ``close(complete=True)`` at the end.
    """
    total = _resolve_total((), total) if total is not None else None
    current = runtime.current()
    if current is None:
        from nbtrain.rank.textbar import TextBar

        return TextBar(total, desc)
    return reporter_for(current).open(total, desc)


def _rank_progress(
    reporter: Reporter, iterable: Iterable[T], total: int | None, desc: str | None
) -> Iterator[T]:
    # A resumed loader's pass goes on where the checkpoint was: its bar counts from there.
    bar = reporter.open(total, desc, start=_starts_at(iterable))
    bar.in_body = True
    complete = False
    monotonic = time.monotonic
    try:
        for item in iterable:
            yield item
            # The hot path: a few attribute updates and a clock read per step.
            bar.n += 1
            if bar.leaf:
                reporter.global_step += 1
            if monotonic() >= reporter.next_due:
                reporter.flush()
        complete = True
    finally:
        # OSError: the kernel's end of the pipe is gone; this rank is being stopped anyway.
        with contextlib.suppress(OSError):
            bar.close(complete=complete)


def _starts_at(iterable: object) -> int:
    """Steps of this pass done before it began: a prepared DataLoader that resumes mid-epoch
    says how many batches it skips (``nbtrain_starts_at``); anything else starts at 0."""
    start = getattr(iterable, "nbtrain_starts_at", 0)
    return start if isinstance(start, int) and not isinstance(start, bool) else 0


def _resolve_total(iterable: Iterable[Any], total: int | None) -> int | None:
    if total is not None:
        if isinstance(total, bool) or not isinstance(total, numbers.Integral) or total < 0:
            raise TypeError(
                f"progress(total={total!r}) must be a non-negative int or None "
                "(None: taken from len(iterable) when it has one)."
            )
        return int(total)
    try:
        return len(iterable)  # type: ignore[arg-type]
    except TypeError:
        return None


def _check_values(values: Mapping[str, Any]) -> dict[str, float]:
    # Called every step: exact-type fast paths before the general (slower) checks.
    if type(values) is not dict and not isinstance(values, Mapping):
        raise TypeError(
            f"log(values={values!r}) must be a dict of metric name to number, "
            "e.g. log({'loss': loss.item()})."
        )
    result = {}
    for name, value in values.items():
        if type(name) is not str and not isinstance(name, str):
            raise TypeError(f"log() metric names must be strings; got {name!r} in {values!r}.")
        result[name] = value if type(value) is float else _to_float(name, value)
    return result


def _to_float(name: str, value: Any) -> float:
    if isinstance(value, (str, bytes)):
        raise TypeError(_not_a_number(name, value))
    try:
        return float(value)  # numbers, NumPy scalars, one-element tensors
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(_not_a_number(name, value)) from None


def _not_a_number(name: str, value: Any) -> str:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return (
        f"log() value for {name!r} must be a number (int, float, NumPy scalar or one-element "
        f"tensor); got {shown}. Log a scalar, e.g. loss.item() or tensor.mean().item()."
    )
