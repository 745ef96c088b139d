"""Short human-readable pieces shared by the text and widget views."""

from __future__ import annotations

import time

from nbtrain.display.rates import format_rate
from nbtrain.display.runstate import RankStatus, RankView
from nbtrain.shared.units import MAX_METRICS, format_duration, format_metrics, format_value

__all__ = [
    "MAX_METRICS",
    "format_duration",
    "format_metrics",
    "format_rank",
    "format_status",
    "format_steps",
    "format_value",
    "has_progress",
    "phase",
    "phase_parts",
    "run_eta",
    "status_parts",
]


def format_steps(view: RankView) -> str:
    """'train 40/100 ETA 0:05 3.1 opt steps/s' (the parts that are known; rates.py). The ETA
    comes before the rate: in a narrow column the text is cut at its end, and the ETA says more."""
    parts = [view.desc] if view.desc else []
    # A rank that died without a word may have gone past the last step it reported (updates
    # are coalesced): '≥18/100', not a count that looks exact.
    at_least = "≥" if view.step_unsure and view.step != view.total else ""
    parts.append(f"{at_least}{view.step}" + (f"/{view.total}" if view.total is not None else ""))
    eta = run_eta(view)
    # A note (saving a checkpoint, waiting for a peer) means the loop is not moving: an ETA
    # from the last rate would be stale.
    if eta is not None and not view.finished and not view.note:
        parts.append(f"ETA {format_duration(eta)}")
    rate = format_rate(view)
    if rate:
        parts.append(rate)
    return " ".join(parts)


def run_eta(view: RankView) -> float | None:
    """Seconds left of the whole run when every enclosing loop's total is known, else of the
    current loop; None without a rate, a total, or anything left to do.

    Nested loops count as mixed-radix digits: each remaining pass of an outer loop runs every
    loop inside it in full again (e.g. epochs of a fixed number of batches).
    """
    if not view.rate or view.rate <= 0 or view.total is None:
        return None
    remaining = max(0, view.total - view.step)
    if all(total is not None for _, total in view.outer):
        inner = view.total  # steps in one full pass of the loops inside the current level
        for done, total in reversed(view.outer):
            assert total is not None
            remaining += max(0, total - done - 1) * inner
            inner *= total
    return remaining / view.rate if remaining else None


def format_status(view: RankView) -> str:
    """'running', 'done', 'failed: ValueError: boom', or a phase note while running; then the
    rank's GPU and the memory it holds there, when it uses one ('running · NVIDIA H100 · 3.1
    GiB')."""
    return "".join(status_parts(view))


def status_parts(view: RankView) -> tuple[str, str]:
    """format_status as (text, tail): a cell too narrow for the whole status cuts the text and
    keeps the tail, which says what moves (a phase's seconds: 'forming the process group …
    (3s)'). A failure has no tail: its start names the error type and is kept by a cut at
    its end."""
    if view.status is RankStatus.FAILED and view.failure:
        return f"failed: {view.failure}", ""
    gpu = f" · {view.gpu}" if view.gpu else ""
    if view.status in (RankStatus.STARTING, RankStatus.RUNNING) and view.note:
        note, lasted = phase_parts(view)
        return note, lasted + gpu
    if view.status is RankStatus.STOPPED and view.stopped_as:
        return view.stopped_as + gpu, ""
    return view.status.value + gpu, ""


PHASE_TIMED_AFTER = 1.0  # seconds: a phase that lasts this long says for how long


def phase(view: RankView, now: float | None = None) -> str:
    """What the rank is busy with ('importing torch'), and for how long once that is a while
    ('importing torch (3s)'): starting ranks and waits say what takes the time."""
    return "".join(phase_parts(view, now))


def phase_parts(view: RankView, now: float | None = None) -> tuple[str, str]:
    """phase() as (what, for how long): ('importing torch', ' (3s)'), or ('starting Python',
    '') for a phase younger than PHASE_TIMED_AFTER."""
    if not view.note or view.note_at is None:
        return view.note, ""
    lasted = (time.time() if now is None else now) - view.note_at
    if lasted < PHASE_TIMED_AFTER:
        return view.note, ""
    return view.note, f" ({lasted:.0f}s)"


def timed_phase(view: RankView) -> bool:
    """The rank shows a phase whose shown duration moves: its row must be redrawn as time
    passes, not only when an event changed it."""
    return bool(view.note) and view.note_at is not None and not view.finished


def has_progress(view: RankView) -> bool:
    return view.total is not None or view.step > 0


def format_rank(view: RankView) -> str:
    """'[rank 1] train 40/100 12.3 it/s loss 0.52' plus the status once it is not 'running'
    ('[rank 1 · fsdp2] ...' for a rank that announced a strategy)."""
    parts = [f"[rank {view.rank} · {view.strategy}]" if view.strategy else f"[rank {view.rank}]"]
    if has_progress(view):
        parts.append(format_steps(view))
    if view.metrics:
        parts.append(format_metrics(view.metrics))
    if view.status is not RankStatus.RUNNING:
        parts.append(format_status(view))
    return " ".join(parts)
