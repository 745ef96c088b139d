"""The terminal's one live line: what a person needs at a glance, in the terminal's width.

Each running rank gets a part such as ``r0 epoch 3 16/32 12.5 it/s ETA 0:02 loss 0.58``: its
loop's description (in a nested loop the description says which epoch, where the step count only
says how far into it), step/total, rate (opt steps/s or it/s: rates.py), ETA and its first
metric. When the parts of every rank do not fit the width, detail goes in this order: the
metric, the rate, the description, the ETA;
step/total always stays. A rank busy with a phase shows it instead (``r1 forming the process
group (gloo): waiting for every rank (3s)``); a phase too long for its share of the line is cut
in its text, never in its seconds. Only a line that still does not fit is cut.
"""

from __future__ import annotations

from nbtrain.display.formatting import format_duration, format_metrics, phase_parts
from nbtrain.display.rates import format_rate
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
    text = " | ".join(_short_phases(views, width))
    return text[:width]


def _short_phases(views: list[RankView], width: int) -> list[str]:
    """Each rank's shortest part, a phase's text cut to the share of ``width`` that the other
    parts leave it, its seconds kept: 'r0 forming the proc… (3s)'."""
    parts = [rank_part(view, ()) for view in views]
    phases = [i for i, view in enumerate(views) if view.note]
    if not phases:
        return parts
    others = sum(len(part) for i, part in enumerate(parts) if i not in phases)
    share = (width - others - 3 * (len(parts) - 1)) // len(phases)
    for i in phases:
        view = views[i]
        note, lasted = phase_parts(view)
        room = share - len(f"r{view.rank} ") - len(lasted)
        if len(note) > room > 1:  # (no room at all: the line's cut is all that is left)
            parts[i] = f"r{view.rank} {note[: room - 1]}…{lasted}"
    return parts


def rank_part(view: RankView, shown: tuple[str, ...] = _LEVELS[0]) -> str:
    parts = [f"r{view.rank}"]
    if view.note:  # what the rank waits for says more than a step count that does not move
        return f"r{view.rank} {''.join(phase_parts(view))}"
    if "desc" in shown and view.desc:
        parts.append(view.desc)
    if view.total is not None:
        parts.append(f"{view.step}/{view.total}")
    else:
        parts.append(str(view.step) if view.step else view.status.value)
    if "rate" in shown and (rate := format_rate(view)):
        parts.append(rate)
    eta = view.eta
    if "eta" in shown and eta is not None and view.step < (view.total or 0):
        parts.append(f"ETA {format_duration(eta)}")
    if "metric" in shown and view.metrics:
        parts.append(format_metrics(view.metrics, limit=1))
    return " ".join(parts)
