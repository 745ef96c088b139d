"""A wide run's output lines: the same line from several ranks written once, with its ranks.

Beside cellout.py, which uses it past groups.WIDE ranks: 64 ranks printing "epoch 1 done" give
one line ``[ranks 0-63] epoch 1 done``, not 64. Lines are held HOLD seconds from the first rank's
copy so the others' can join it; a line only joins a group that comes after the group of the
same rank's previous line (each rank's own order is kept), else it starts a new one. Groups are
written in the order they began. Only the cell's copy is grouped: every rank's every line is in
its log file and the run's output as it came.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nbtrain.shared.rankset import ranks_label

HOLD = 1.0  # seconds a line waits for the same line from other ranks


@dataclass
class _Group:
    seq: int
    stream: str
    text: str
    at: float
    ranks: list[int] = field(default_factory=list)


class LineGroups:
    def __init__(self, hold: float = HOLD) -> None:
        self.hold = hold
        self._pending: list[_Group] = []  # in the order they began
        self._open: dict[tuple[str, str], _Group] = {}  # the newest group of each line
        self._last: dict[int, int] = {}  # the seq of each rank's latest group
        self._seq = 0

    def add(self, rank: int, stream: str, text: str, now: float) -> None:
        key = (stream, text)
        group = self._open.get(key)
        if group is None or rank in group.ranks or group.seq <= self._last.get(rank, -1):
            self._seq += 1
            group = _Group(self._seq, stream, text, now)
            self._pending.append(group)
            self._open[key] = group
        group.ranks.append(rank)
        self._last[rank] = group.seq

    def take(self, now: float, *, final: bool = False) -> list[tuple[str, str]]:
        """(stream, line) of the groups whose wait is over, in order (all of them if final)."""
        out: list[tuple[str, str]] = []
        while self._pending and (final or now - self._pending[0].at >= self.hold):
            group = self._pending.pop(0)
            if self._open.get((group.stream, group.text)) is group:
                del self._open[(group.stream, group.text)]
            out.append((group.stream, f"[{ranks_label(group.ranks)}] {group.text}\n"))
        return out
