"""A wide run's output lines: the same line from several ranks written once, with its ranks.

Beside cellout.py, which uses it past groups.WIDE ranks: 64 ranks printing "epoch 1 done" give
one line ``[ranks 0-63] epoch 1 done``, not 64. Lines are held HOLD seconds from the first rank's
copy so the others' can join it; a line only joins a group that comes after the group of the
same rank's previous line (each rank's own order is kept), else it starts a new one. A group is
written once HOLD seconds passed without a rank joining it, or MAX_HOLD after it began. Groups are
written in the order they began. Only the cell's copy is grouped: every rank's every line is in
its log file and the run's output as it came.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nbtrain.shared.rankset import ranks_label

HOLD = 0.5  # seconds a line waits for the same line from one more rank
MAX_HOLD = 3.0  # seconds at most from its first copy (ranks that print out of step)


@dataclass
class _Group:
    seq: int
    stream: str
    text: str
    at: float  # the first copy
    last: float  # the latest rank that joined
    ranks: list[int] = field(default_factory=list)


class LineGroups:
    def __init__(self, hold: float = HOLD, max_hold: float = MAX_HOLD) -> None:
        self.hold, self.max_hold = hold, max_hold
        self._pending: list[_Group] = []  # in the order they began
        self._open: dict[tuple[str, str], _Group] = {}  # the newest group of each line
        self._last: dict[int, int] = {}  # the seq of each rank's latest group
        self._seq = 0

    def add(self, rank: int, stream: str, text: str, now: float) -> None:
        key = (stream, text)
        group = self._open.get(key)
        if group is None or rank in group.ranks or group.seq <= self._last.get(rank, -1):
            self._seq += 1
            group = _Group(self._seq, stream, text, now, now)
            self._pending.append(group)
            self._open[key] = group
        group.ranks.append(rank)
        group.last = now
        self._last[rank] = group.seq

    def take(self, now: float, *, final: bool = False) -> list[tuple[str, str]]:
        """(stream, line) of the groups whose wait is over, in order (all of them if final)."""
        out: list[tuple[str, str]] = []
        while self._pending and (final or self._ready(self._pending[0], now)):
            group = self._pending.pop(0)
            if self._open.get((group.stream, group.text)) is group:
                del self._open[(group.stream, group.text)]
            out.append((group.stream, f"[{ranks_label(group.ranks)}] {group.text}\n"))
        return out

    def _ready(self, group: _Group, now: float) -> bool:
        return now - group.last >= self.hold or now - group.at >= self.max_hold
