"""Shared-memory names that a killed rank's processes leave in /dev/shm (Linux).

torch moves tensors between processes (DataLoader workers to their rank, for one) through
segments named ``/dev/shm/torch_<pid>_<random>_<n>``, unlinked right after the receiver opens
them. A process killed inside that window leaves the name behind for good, one per kill: the
launcher notes the pids of every rank's process group before it kills the group, and once the
rank is reaped removes the names those pids created. Names of other programs are never touched.
"""

from __future__ import annotations

import contextlib
import glob
import os
import sys

_PROC = "/proc"
_SHM = "/dev/shm"
_LINUX = sys.platform.startswith("linux")


def group_members(pgid: int) -> set[int]:
    """Pids of the live processes in process group ``pgid`` (empty where /proc is missing)."""
    if not _LINUX:
        return set()
    members = set()
    with contextlib.suppress(OSError):
        for entry in os.scandir(_PROC):
            if entry.name.isdigit() and _pgrp(entry.name) == pgid:
                members.add(int(entry.name))
    return members


def segment_makers(pgid: int) -> set[int]:
    """Pids of the live processes in group ``pgid`` that have a torch name in /dev/shm now:
    what ``group_members`` would find of them, reading the stat of only the pids those names
    carry (usually none) instead of every process's (milliseconds on a busy machine)."""
    if not _LINUX:
        return set()
    pids = set()
    for path in glob.glob(os.path.join(_SHM, "torch_*_*")):
        pid = os.path.basename(path).split("_", 2)[1]
        if pid.isdigit() and _pgrp(pid) == pgid:
            pids.add(int(pid))
    return pids


def remove_segments(pids: set[int]) -> list[str]:
    """Unlink the torch segments these (dead) processes created; returns the removed paths."""
    removed = []
    for pid in pids:
        for path in glob.glob(os.path.join(_SHM, f"torch_{pid}_*")):
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed.append(path)
    return removed


def _pgrp(pid: str) -> int | None:
    try:
        with open(os.path.join(_PROC, pid, "stat"), "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so split after it.
    fields = stat.rsplit(b")", 1)[-1].split()
    return int(fields[2]) if len(fields) > 2 else None
