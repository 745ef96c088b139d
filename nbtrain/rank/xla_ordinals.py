"""What this process knows of its own XLA ordinals (threads on XLA:CPU, device threads of one
TPU process): whether each one's function has ended (torch_xla's host, xla_host.py, reports
it) and how far it got in the handshake gathers (the XLA collectives transport,
accelerator/devices/xla_collectives.py, records them). Rank-side records, below both."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol


class Pending(Protocol):
    """A gather running in its own thread: ``done`` once XLA completed it."""

    @property
    def done(self) -> bool: ...


# What this process knows of its own ordinals (threads on XLA:CPU, device threads of one TPU
# process): whether each one's function has ended (reported by the XLA host, xla_host.py) and how
# far it got in the handshake gathers, which every ordinal makes in the same order (the n-th of
# one meets the n-th of the others). A peer that ended after completing gather n took part in
# it: a rank still finishing its own side of gather n (its sync and .cpu() after the meeting
# point, slow on a loaded host) only has to wait. A peer that ended before completing it never
# will: the rank waits in vain.


@dataclass
class _OrdinalRecord:
    ended: bool = False
    begun: int = 0  # handshake gathers this ordinal has started
    completed: int = 0  # the number of the last one XLA completed for it
    latest: Pending | None = None  # its last handshake gather (collectives' _GatherInThread)


_ordinals: dict[int, _OrdinalRecord] = {}
ordinals_lock = threading.Lock()


def record_of(ordinal: int) -> _OrdinalRecord:
    # (The caller holds ordinals_lock.) Also for ordinals not started by nbtrain's XLA host.
    return _ordinals.setdefault(ordinal, _OrdinalRecord())


def ordinal_started(ordinal: int) -> None:
    with ordinals_lock:
        _ordinals[ordinal] = _OrdinalRecord()


def ordinal_ended(ordinal: int) -> None:
    with ordinals_lock:
        record_of(ordinal).ended = True


def peers_lost_for(rank: int, number: int) -> list[int]:
    """The peers of ``rank`` that ended without completing its gather number ``number``."""
    with ordinals_lock:
        return sorted(
            ordinal
            for ordinal, record in _ordinals.items()
            if ordinal != rank and record.ended and record.completed < number
        )


class XlaCollectiveAbandoned(BaseException):
    """This ordinal went on after giving up on an XLA collective (collectives.py's timeout or
    lost peers, an error its code caught). That all-gather is still pending inside XLA, which
    cannot cancel it, so any further XLA work of this ordinal could hang, or meet a peer's next
    collective. A BaseException, like SystemExit, so that ``except Exception`` does not swallow
    it as well: the ordinal fails (also when its function returns: xla_host.py), and on a
    multi-ordinal host its process ends with it."""


def abandoned(rank: int, after: str) -> XlaCollectiveAbandoned | None:
    """The error to fail ``rank`` with, if its last gather was given up on and is still in XLA."""
    with ordinals_lock:
        record = _ordinals.get(rank)
        latest = record.latest if record is not None else None
    if latest is None or latest.done:
        return None
    return XlaCollectiveAbandoned(
        f"ordinal {rank} {after} after giving up on a collective (it timed out, or its peers "
        "were gone, and the error was caught). That XLA all-gather is still pending and cannot "
        "be cancelled, so this ordinal cannot go on on its XLA device. Let a collective's error "
        "end the function instead of catching it, and relaunch."
    )


def check_usable(rank: int) -> None:
    """Before more XLA work of ``rank``: refuse it once a collective of its was abandoned."""
    error = abandoned(rank, "went on to more XLA work")
    if error is not None:
        raise error


__all__ = [
    "XlaCollectiveAbandoned",
    "abandoned",
    "check_usable",
    "ordinal_ended",
    "ordinal_started",
    "ordinals_lock",
    "peers_lost_for",
    "record_of",
]
