"""How fast a rank goes, as a person reads it: optimizer steps per second where the rank's
Accelerator reports optimizer steps, else the loop's items per second.

With gradient accumulation N loop iterations make one optimizer step, so the loop's it/s would
overstate the training's speed N times; a loop without optimizer steps (eval, raw DDP code, an
epoch loop) is measured in its own items. The live rows, the status line, the summary and the
saved static view all say it through ``format_rate`` and ``summary_rate``.
"""

from __future__ import annotations

import time
from typing import Protocol


class Paced(Protocol):
    """What of a rank's view (runstate.Paced) the rates read and keep."""

    rate: float | None  # the loop's items per second, smoothed
    opt_rate: float | None  # optimizer steps per second in a loop that takes them, else None
    iterations: int  # loop items counted this attempt
    optimizer_steps: int  # optimizer steps taken this attempt
    rate_anchor: tuple[float, int, int] | None  # (time, iterations, optimizer steps)
    loop: tuple[str | None, int | None]  # the running loop's (description, total)
    started_at: float | None  # of this attempt
    ended_at: float | None

RATE_SMOOTHING = 0.3  # weight of the newest interval in the smoothed rates
RATE_WINDOW = 0.05  # seconds: closer updates (a loop's final step right after a periodic one)
#                     are folded into the next interval instead of giving a wild rate


def update_rate(view: Paced, at: float) -> None:
    """Fold the progress reported at ``at`` into the rank's smoothed it/s and opt steps/s."""
    last = view.rate_anchor
    if last is None:
        view.rate_anchor = (at, view.iterations, view.optimizer_steps)
        return
    dt = at - last[0]
    if dt < RATE_WINDOW:
        return  # keep the older anchor: the next interval spans this one too
    view.rate = _smoothed(view.rate, (view.iterations - last[1]) / dt)
    # Measured in optimizer steps once this loop has taken one (a train loop, not eval's).
    if view.opt_rate is not None or view.optimizer_steps > last[2]:
        view.opt_rate = _smoothed(view.opt_rate, (view.optimizer_steps - last[2]) / dt)
    view.rate_anchor = (at, view.iterations, view.optimizer_steps)


def _smoothed(rate: float | None, instant: float) -> float:
    return instant if rate is None else (1 - RATE_SMOOTHING) * rate + RATE_SMOOTHING * instant


def format_rate(view: Paced) -> str:
    """'2.5 opt steps/s' in a loop that takes optimizer steps, else '10.0 it/s'; '' unknown."""
    if view.opt_rate is not None:
        return f"{view.opt_rate:.1f} opt steps/s"
    return f"{view.rate:.1f} it/s" if view.rate else ""


def summary_rate(views: list[Paced], started_at: float, ended_at: float | None) -> str:
    """The summary's rate: '84 optimizer steps, 7.0 opt steps/s' where the ranks took optimizer
    steps, else '95.0 it/s (train)' (the progress() loops' items, named by the loop: an epoch
    loop's are epochs); '' without progress. A mean over the ranks of their own rate over their
    run time (the run's ``started_at`` and ``ended_at`` stand in for a rank's unknown ones):
    ranks of a data-parallel run step together, so it is the run's rate, not a sum."""
    span = (started_at, ended_at)
    rate = mean_rate(span, [(view, view.optimizer_steps) for view in views])
    if rate:
        steps = max(view.optimizer_steps for view in views)
        return f"{steps} optimizer steps, {rate:.1f} opt steps/s"
    rate = mean_rate(span, [(view, view.iterations) for view in views])
    if not rate:
        return ""
    loops = {view.loop[0] for view in views if view.iterations}
    named = f" ({loops.pop()})" if len(loops) == 1 and None not in loops else ""
    return f"{rate:.1f} it/s{named}"


def mean_rate(
    span: tuple[float, float | None], counts: list[tuple[Paced, int]]
) -> float | None:
    """Mean over the ranks with a count of count / the rank's run time of this attempt."""
    rates = [
        count / busy for view, count in counts if count and (busy := _busy(view, *span)) > 0
    ]
    return sum(rates) / len(rates) if rates else None


def _busy(view: Paced, started_at: float, ended_at: float | None) -> float:
    start = view.started_at if view.started_at is not None else started_at
    end = next((t for t in (view.ended_at, ended_at) if t is not None), time.time())
    return end - start
