"""Many ranks at a glance: the RunState folded into groups of ranks, plus the ranks that stand out.

Beyond WIDE ranks a row per rank is no dashboard (64 rows fill two screens; 1,024 are unreadable),
so the views draw groups instead: one per node when the ranks span several nodes, else runs of
consecutive ranks (at most MAX_GROUPS rows). A group says how far its ranks are (the least,
median and most advanced), their median speed and the slowest rank by name. A rank that needs a
person's eye is taken out of its group onto a row of its own: failed, stopped while the run
goes on, lagging (behind the run's median by more than LAG_SECONDS of its steps and a tenth of
them) or silent (no progress for SILENT_AFTER seconds while the others moved).

Pure folding, no drawing: the widget view (wide.py), its static form and the text view share it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass

from nbtrain.display.runstate import RankStatus, RankView, RunState
from nbtrain.shared.rankset import ranks_label

WIDE = 16  # up to this many ranks, one row each; beyond, groups
MAX_GROUPS = 8  # rows of groups when the ranks are on one node (or on more nodes than this)
MIN_GROUP = 8  # ranks per group at least (32 ranks: 4 rows of 8)
MAX_APART = 8  # ranks shown on rows of their own; past that, counted in their group's status
LAG_SECONDS = 5.0  # behind the median by this many seconds of steps (and LAG_SHARE) is lagging
LAG_SHARE = 0.1
LAG_OF_LOOP = 0.25  # or by this share of its loop (a short loop: seconds of steps are all of it)
SILENT_AFTER = 30.0  # seconds without progress while the run's median rank moved


def is_wide(ranks: int) -> bool:
    return ranks > WIDE


@dataclass(frozen=True)
class Group:
    """One row of a wide view: ranks of one node, or a run of consecutive ranks."""

    name: str  # 'node host-a · ranks 0-31', or 'ranks 0-7'
    ranks: tuple[int, ...]  # every rank of the group, those shown apart included
    low: float  # least progress in the group: a share of the loop (0-1)
    median: float
    high: float
    steps: str  # the median rank's loop and step: 'train 40/100'
    rate: str  # the running ranks' median rate: '5.0 opt steps/s' (or it/s, see _median_rate)
    slowest: int | None  # the running rank least advanced, when it is behind the others
    statuses: dict[RankStatus, int]
    metrics: dict[str, float]  # the median of each latest metric across the group


@dataclass(frozen=True)
class Apart:
    """A rank shown on its own row, and why ('failed', 'stopped', 'lagging', 'no progress')."""

    view: RankView
    reason: str


@dataclass(frozen=True)
class Wide:
    groups: list[Group]
    apart: list[Apart]
    hidden_apart: int  # ranks that stand out beyond MAX_APART (counted in their groups)


def summarize(state: RunState, now: float | None = None) -> Wide:
    views = [state.ranks[rank] for rank in sorted(state.ranks)]
    now = time.time() if now is None else now
    apart = _apart(views, state, now)
    shown = apart[:MAX_APART]
    return Wide([_group(name, members) for name, members in _partition(views)], shown,
                len(apart) - len(shown))


def progress_of(view: RankView) -> float:
    """How far the rank is through its loop, 0-1 (a loop without total: 0, or 1 when done)."""
    if view.total:
        return min(1.0, view.step / view.total)
    return 1.0 if view.status is RankStatus.DONE else 0.0


def _partition(views: list[RankView]) -> list[tuple[str, list[RankView]]]:
    hosts: dict[str, list[RankView]] = {}
    for view in views:
        hosts.setdefault(view.host, []).append(view)
    if 1 < len(hosts) <= MAX_GROUPS and "" not in hosts:
        return [(f"node {host} · {ranks_label(v.rank for v in members)}", members)
                for host, members in hosts.items()]
    size = max(MIN_GROUP, math.ceil(len(views) / MAX_GROUPS))
    chunks = [views[i : i + size] for i in range(0, len(views), size)]
    return [(ranks_label(v.rank for v in chunk), chunk) for chunk in chunks]


def _median_rate(running: list[RankView]) -> str:
    """In optimizer steps where every running rank with a rate takes them (as each rank's row
    says: rates.format_rate), else in loop iterations; '' while no rank has a rate."""
    paced = [view for view in running if view.rate]
    if paced and all(view.opt_rate is not None for view in paced):
        return f"{statistics.median(v.opt_rate or 0.0 for v in paced):.1f} opt steps/s"
    return f"{statistics.median(v.rate or 0.0 for v in paced):.1f} it/s" if paced else ""


def _group(name: str, members: list[RankView]) -> Group:
    shares = sorted(progress_of(view) for view in members)
    running = [view for view in members if view.status is RankStatus.RUNNING]
    median_view = sorted(members, key=lambda v: (v.iterations, v.rank))[len(members) // 2]
    statuses: dict[RankStatus, int] = {}
    for view in members:
        statuses[view.status] = statuses.get(view.status, 0) + 1
    return Group(
        name=name,
        ranks=tuple(view.rank for view in members),
        low=shares[0],
        median=shares[len(shares) // 2],
        high=shares[-1],
        steps=_steps(median_view),
        rate=_median_rate(running),
        slowest=_slowest(running),
        statuses=statuses,
        metrics=_median_metrics(members),
    )


def _steps(view: RankView) -> str:
    if view.total is None and not view.step:
        return ""
    count = f"{view.step}" + (f"/{view.total}" if view.total is not None else "")
    return f"{view.desc} {count}" if view.desc else count


def _slowest(running: list[RankView]) -> int | None:
    if len(running) < 2:
        return None
    slowest = min(running, key=lambda v: (v.iterations, v.rank))
    fastest = max(view.iterations for view in running)
    return slowest.rank if slowest.iterations < fastest else None


def _median_metrics(members: Iterable[RankView]) -> dict[str, float]:
    values: dict[str, list[float]] = {}
    for view in members:
        for name, value in view.metrics.items():
            if math.isfinite(value):
                values.setdefault(name, []).append(value)
    return {name: statistics.median(found) for name, found in values.items()}


def _apart(views: list[RankView], state: RunState, now: float) -> list[Apart]:
    running = [view for view in views if view.status is RankStatus.RUNNING]
    median_iterations = statistics.median(v.iterations for v in running) if running else 0
    rates = [view.rate for view in running if view.rate]
    median_rate = statistics.median(rates) if rates else None
    heard = [v.rate_anchor[0] for v in running if v.rate_anchor is not None]
    moving = bool(heard) and now - statistics.median(heard) < SILENT_AFTER / 3
    found = []
    for view in views:
        reason = _reason(view, state, median_iterations, median_rate, moving, now)
        if reason:
            found.append(Apart(view, reason))
    order = {"failed": 0, "no progress": 1, "lagging": 2, "stopped": 3}
    return sorted(found, key=lambda a: (order[a.reason], a.view.rank))


def _reason(
    view: RankView,
    state: RunState,
    median_iterations: float,
    median_rate: float | None,
    moving: bool,
    now: float,
) -> str:
    if view.status is RankStatus.FAILED and not view.collateral:
        return "failed"
    if view.status is RankStatus.STOPPED and state.ended_at is None:
        return "stopped"  # a rank that left while the others go on; a run's end stops them all
    if view.status is not RankStatus.RUNNING:
        return ""
    last = view.rate_anchor
    if moving and last is not None and now - last[0] > SILENT_AFTER:
        return "no progress"
    behind = median_iterations - view.iterations
    if not median_rate or behind <= LAG_SHARE * median_iterations:
        return ""
    loop = LAG_OF_LOOP * view.total if view.total else float("inf")
    return "lagging" if behind > min(LAG_SECONDS * median_rate, loop) else ""
    return ""
