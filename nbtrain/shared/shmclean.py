"""Removing shared-memory segments (sharedmem.py): a launch's own names when it ends, and the
names left by a kernel that was killed mid-launch (its pid no longer runs)."""

from __future__ import annotations

import contextlib
import glob
import os

from nbtrain.shared.sharedmem import _NAME, PREFIX, SHM_DIR


def remove_names(pattern: str) -> list[str]:
    """Unlink the segments named ``pattern`` (a glob within SHM_DIR); returns their paths."""
    removed = []
    for path in glob.glob(os.path.join(SHM_DIR, pattern)):
        if _NAME.fullmatch(os.path.basename(path)):
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed.append(path)
    return removed


def sweep_orphans() -> list[str]:
    """Remove segments whose kernel is no longer running (it was killed mid-launch)."""
    removed = []
    for path in glob.glob(os.path.join(SHM_DIR, PREFIX + "*")):
        match = _NAME.fullmatch(os.path.basename(path))
        if match is None:
            continue
        pid = int(os.path.basename(path)[len(PREFIX) :].split("_", 1)[0])
        if not _alive(pid):
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
