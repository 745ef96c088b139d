"""The terminal's one live line: what a person needs at a glance, in the terminal's width.

Each running rank gets a part such as ``r0 epoch 3 16/32 12.5 it/s ETA 0:02 loss 0.58``: its
loop's description (in a nested loop the description says which epoch, where the step count only
says how far into it), step/total, it/s, ETA and its first metric. When the parts of every rank
do not fit the width, detail goes in this order: the metric, the it/s, the description, the ETA;
step/total always stays, and only a line that still does not fit is cut.
"""

from __future__ import annotations

from nbtrain.display.formatting import format_duration, format_metrics, phase
from nbtrain.display.runstate import RankView

# What each level of detail shows, richest first.
_LEVELS = (
    ("desc", "rate", "eta", "metric"),
    ("desc", "rate", "eta"),
    ("desc", "eta"),
    ("eta",),
    (),
)


def status_line(views: list[RankView], width: int) -> str:
    """The running ranks' parts joined by " | ", at the richest detail that fits ``width``."""
    for level in _LEVELS:
        text = " | ".join(rank_part(view, level) for view in views)
        if len(text) <= width:
            return text
    return text[:width]


def rank_part(view: RankView, shown: tuple[str, ...] = _LEVELS[0]) -> str:
    parts = [f"r{view.rank}"]
    if view.note:  # what the rank waits for says more than a step count that does not move
        return f"r{view.rank} {phase(view)}"
    if "desc" in shown and view.desc:
        parts.append(view.desc)
    if view.total is not None:
        parts.append(f"{view.step}/{view.total}")
    else:
        parts.append(str(view.step) if view.step else view.status.value)
    if "rate" in shown and view.rate:
        parts.append(f"{view.rate:.1f} it/s")
    eta = view.eta
    if "eta" in shown and eta is not None and view.step < (view.total or 0):
        parts.append(f"ETA {format_duration(eta)}")
    if "metric" in shown and view.metrics:
        parts.append(format_metrics(view.metrics, limit=1))
    return " ".join(parts)
