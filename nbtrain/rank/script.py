"""``nbtrain launch script.py``: what each rank runs (a rank-side function the command names)."""

from __future__ import annotations

import os
import runpy
import sys


def run_script(path: str, argv: list[str]) -> None:
    """Run ``path`` as ``__main__`` with ``sys.argv = [path, *argv]``."""
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(path))  # as `python script.py` does: sibling imports work
    runpy.run_path(path, run_name="__main__")
    # Nothing is returned: the script's globals must not travel back as a result.
