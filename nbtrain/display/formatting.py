"""Short human-readable pieces shared by the text and widget views."""

from __future__ import annotations

from nbtrain.kernel.monitor import RankStatus, RankView
from nbtrain.shared.units import MAX_METRICS, format_duration, format_metrics, format_value

__all__ = [
    "MAX_METRICS",
    "format_duration",
    "format_metrics",
    "format_status",
    "format_steps",
    "format_value",
    "has_progress",
]

def format_steps(view: RankView) -> str:
    """'train 40/100 12.3 it/s ETA 0:05' (the parts that are known)."""
    parts = [view.desc] if view.desc else []
    parts.append(f"{view.step}/{view.total}" if view.total is not None else str(view.step))
    if view.rate:
        parts.append(f"{view.rate:.1f} it/s")
    eta = view.eta
    if eta is not None and not view.finished and view.step < (view.total or 0):
        parts.append(f"ETA {format_duration(eta)}")
    return " ".join(parts)


def format_status(view: RankView) -> str:
    """'running', 'done', 'failed: ValueError: boom', or a phase note while running."""
    if view.status is RankStatus.FAILED and view.failure:
        return f"failed: {view.failure}"
    if view.status in (RankStatus.STARTING, RankStatus.RUNNING) and view.note:
        return view.note
    return view.status.value


def has_progress(view: RankView) -> bool:
    return view.total is not None or view.step > 0
