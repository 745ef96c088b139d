"""The compact view of a wide run (more than groups.WIDE ranks): rows of groups, as HTML and text.

What a person sees in place of a row per rank (groups.py decides the rows):

- a row per group: 'ranks 0-7', a bar whose solid part reaches the least advanced rank, a lighter
  band up to the most advanced and a tick at the median; the median rank's loop and step with
  the group's median speed; the median of each metric; how many ranks are in which state and
  the slowest rank by name;
- below, a row of its own for each rank that stands out (failed, stopped, lagging, no progress),
  drawn like a rank's row in a narrow run, red when it failed;
- a selector in the header ("see one rank") adds that rank's own row under them.

The live dashboard shows this markup in one HTML widget, redrawn at most every EVERY seconds:
one message to the frontend per redraw whatever the number of ranks. The static form a saved
notebook keeps is the same markup; the text view prints ``text_lines``.
"""

from __future__ import annotations

import time
from html import escape
from typing import Any

from nbtrain.display.formatting import (
    format_metrics,
    format_rank,
    format_steps,
    has_progress,
)
from nbtrain.display.groups import Apart, Group, Wide, summarize
from nbtrain.display.rows import (
    BAR_COLORS,
    BAR_MIN,
    CELL_PADDING,
    COLUMNS,
    STATUS_COLORS,
    STATUS_SPANS,
    one_line_html,
    row_cells,
    static_row,
)
from nbtrain.display.runstate import RankStatus, RunState
from nbtrain.shared.rankset import ranks_label

EVERY = 0.5  # seconds between redraws of the rows (one message each)
NOT_SELECTED = -1
LIGHT = "#90caf9"  # the band between the least and the most advanced rank
_ORDER = (RankStatus.FAILED, RankStatus.STOPPED, RankStatus.RUNNING, RankStatus.STARTING,
          RankStatus.DONE)


def wide_html(state: RunState, selected: int | None = None, now: float | None = None) -> str:
    """The rows of groups, the ranks apart and the selected rank, as one block of markup."""
    summary = summarize(state, now)
    parts = [group_row(group) for group in summary.groups]
    parts += [apart_row(apart) for apart in summary.apart]
    if summary.hidden_apart:
        parts.append(
            f'<div class="nbtrain-more" style="padding-left:{CELL_PADDING}">… and '
            f"{summary.hidden_apart} more ranks that stand out (see one with the selector, "
            "or in the text view)</div>"
        )
    view = state.ranks.get(selected) if selected is not None else None
    if view is not None:
        parts.append(
            '<div class="nbtrain-selected" style="border-top:1px dashed #ccc">'
            f"{static_row(view)}</div>"
        )
    return f'<div class="nbtrain-wide" data-ranks="{len(state.ranks)}">{"".join(parts)}</div>'


def group_row(group: Group) -> str:
    failed = group.statuses.get(RankStatus.FAILED, 0)
    label = one_line_html(f"{group.name} ", title=f"{group.name} ({len(group.ranks)} ranks)")
    steps = " · ".join(part for part in (group.steps, group.rate) if part)
    # The slowest rank leads the metrics column: the status column is too narrow for it.
    slowest = f"slowest: rank {group.slowest}" if group.slowest is not None else ""
    metrics = " · ".join(part for part in (slowest, format_metrics(group.metrics)) if part)
    status = _counts(group)
    color = STATUS_COLORS[RankStatus.FAILED] if failed else None
    status_cell = one_line_html(status, f";color:{color};font-weight:bold" if color else "")
    return _row(
        "nbtrain-group",
        f'data-ranks="{escape(ranks_label(group.ranks))}"',
        label,
        _band_bar(group),
        one_line_html(steps, title=f"{steps} (median rank); least {group.low:.0%}, "
                      f"median {group.median:.0%}, most {group.high:.0%} of the loop"),
        one_line_html(metrics, title=f"{metrics} (metrics: the group's median)")
        if metrics else "",
        status_cell,
    )


def apart_row(apart: Apart) -> str:
    """A rank that stands out, drawn as a narrow run draws a rank, its reason in the status."""
    view = apart.view
    if apart.reason in ("failed", "stopped"):
        return static_row(view)
    cells = row_cells(view)
    status = f"{apart.reason}: " + (format_steps(view) if has_progress(view) else "no step yet")
    color = STATUS_COLORS[RankStatus.STOPPED]
    percent = 100 * cells.value / cells.maximum if cells.maximum else 0
    bar = (
        f'<div style="width:{percent:.1f}%;height:100%;background:{BAR_COLORS["warning"]}">'
        "</div>"
    )
    return _row(
        "nbtrain-apart",
        f'data-rank="{view.rank}" data-reason="{apart.reason}"',
        cells.label,
        bar,
        one_line_html(cells.steps),
        one_line_html(cells.metrics),
        one_line_html(status, f";color:{color};font-weight:bold"),
    )


def _row(kind: str, data: str, label: str, bar: str, steps: str, metrics: str,
         status: str) -> str:
    def column(name: str, flex: str, content: str) -> str:
        return (
            f'<div class="nbtrain-{name}" style="min-width:0;overflow:hidden;'
            f'box-sizing:border-box;padding-left:{CELL_PADDING};flex:{flex}">{content}</div>'
        )

    return (
        f'<div class="nbtrain-row {kind}" {data} style="display:flex;align-items:center;'
        'height:24px">'
        f'<div class="nbtrain-label" style="min-width:0;overflow:hidden;'
        f'flex:{COLUMNS["label"]}">{label}</div>'
        f'<div class="nbtrain-bar" style="flex:{COLUMNS["bar"]};min-width:{BAR_MIN};'
        f'height:14px;margin:0 4px;background:#eee;position:relative">{bar}</div>'
        + column("steps", COLUMNS["steps"], steps)
        + column("metrics", COLUMNS["metrics"], metrics)
        + column("status", STATUS_SPANS[1], status)
        + "</div>"
    )


def _band_bar(group: Group) -> str:
    low, median, high = (100 * share for share in (group.low, group.median, group.high))
    solid = BAR_COLORS["success"] if low >= 100 else BAR_COLORS[""]
    return (
        f'<div style="position:absolute;left:0;top:0;height:100%;width:{low:.1f}%;'
        f'background:{solid}"></div>'
        f'<div style="position:absolute;left:{low:.1f}%;top:0;height:100%;'
        f'width:{high - low:.1f}%;background:{LIGHT}"></div>'
        f'<div title="median" style="position:absolute;left:{median:.1f}%;top:-2px;'
        'height:18px;width:2px;background:#0d47a1"></div>'
    )


def _counts(group: Group) -> str:
    """'1 failed, 7 stopped': how many ranks of the group are in which state."""
    return ", ".join(
        f"{group.statuses[status]} {status.value}"
        for status in _ORDER
        if group.statuses.get(status)
    )


def _statuses(group: Group) -> str:
    slowest = f"slowest: rank {group.slowest}" if group.slowest is not None else ""
    return " · ".join(part for part in (_counts(group), slowest) if part)


def text_lines(state: RunState, now: float | None = None) -> list[str]:
    """The same view as lines: '[ranks 0-7] train 40/100 12.3 it/s (least 38%, most 45%) loss
    0.52 · 8 running · slowest: rank 7', then a line per rank that stands out."""
    summary = summarize(state, now)
    lines = []
    for group in summary.groups:
        parts = [f"[{ranks_label(group.ranks)}]"]
        if group.steps:
            parts.append(group.steps)
        if group.rate:
            parts.append(group.rate)
        parts.append(f"(least {group.low:.0%}, median {group.median:.0%}, most {group.high:.0%})")
        if group.metrics:
            parts.append(format_metrics(group.metrics))
        parts.append("· " + _statuses(group))
        lines.append(" ".join(parts))
    lines += [f"{format_rank(a.view)} ({a.reason})" for a in summary.apart]
    if summary.hidden_apart:
        lines.append(f"… and {summary.hidden_apart} more ranks that stand out")
    return lines


def summary_key(state: RunState) -> tuple[Any, ...]:
    """What the text view compares to print the groups again only when they changed."""
    summary: Wide = summarize(state)
    return (
        tuple((g.steps, g.statuses.get(RankStatus.RUNNING), g.slowest) for g in summary.groups),
        tuple((a.view.rank, a.reason) for a in summary.apart),
    )


class Throttle:
    """True at most every ``every`` seconds (and always when forced)."""

    def __init__(self, every: float = EVERY) -> None:
        self.every = every
        self._at = -float("inf")

    def due(self, *, force: bool = False) -> bool:
        now = time.monotonic()
        if force or now - self._at >= self.every:
            self._at = now
            return True
        return False


class GroupLines:
    """The text view's part for a wide run: the groups' lines when they changed, at most every
    ``every`` seconds (every change when final), in place of a line per rank."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._at = -float("inf")
        self._key: tuple[Any, ...] | None = None

    def lines(self, state: RunState, *, final: bool) -> list[str]:
        key = summary_key(state)
        now = time.monotonic()
        if key == self._key or not (final or now - self._at >= self.every):
            return []
        self._key, self._at = key, now
        return text_lines(state)
