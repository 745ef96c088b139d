"""``nbtrain launch`` of a script that asks Accelerate's own ``PartialState()`` who it is: each
rank gets the launch's answer, as under torchrun (issue 43, point 7; before, every rank said
"0 of 1, DistributedType.NO" and was the main process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

SCRIPT = Path(__file__).parent / "scripts" / "accelerate_state.py"


def test_a_launched_scripts_partial_state_sees_two_ranks():
    pytest.importorskip("accelerate")
    done = subprocess.run(
        [sys.executable, "-m", "nbtrain", "launch", "--num-processes", "2", str(SCRIPT)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = sorted(line for line in done.stdout.splitlines() if " state " in line)
    assert lines == [
        "[rank 0] state 0 of 2 DistributedType.MULTI_CPU main=True",
        "[rank 1] state 1 of 2 DistributedType.MULTI_CPU main=False",
    ], done.stdout
