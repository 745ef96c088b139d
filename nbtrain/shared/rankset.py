"""Sets of ranks in words: '0-31, 40, 48-63' (views, output and errors of wide runs)."""

from __future__ import annotations

from collections.abc import Iterable


def rank_ranges(ranks: Iterable[int]) -> str:
    """'0-3, 5, 7-9': consecutive ranks as one range, in order."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    start = previous = None
    for rank in ordered:
        if previous is not None and rank == previous + 1:
            previous = rank
            continue
        if start is not None:
            parts.append(_span(start, previous))
        start = previous = rank
    if start is not None:
        parts.append(_span(start, previous))
    return ", ".join(parts)


def ranks_label(ranks: Iterable[int]) -> str:
    """'rank 5' for one rank, 'ranks 0-63' for several."""
    ordered = sorted(set(ranks))
    return f"rank {ordered[0]}" if len(ordered) == 1 else f"ranks {rank_ranges(ordered)}"


def _span(start: int | None, end: int | None) -> str:
    return str(start) if start == end else f"{start}-{end}"
