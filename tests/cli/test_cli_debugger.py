"""breakpoint() in a rank under ``nbtrain launch``: the prompt is the terminal's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

SCRIPT = str(Path(__file__).parent / "scripts" / "pause.py")
NBTRAIN = [sys.executable, "-m", "nbtrain", "launch", "--num-processes", "2", SCRIPT]


def test_the_prompt_reads_the_terminal():
    main, side = os.openpty()  # a terminal for the launcher's stdin
    try:
        os.write(main, b"p secret\nc\n")
        done = subprocess.run(
            NBTRAIN, stdin=side, capture_output=True, text=True, timeout=120
        )
    finally:
        os.close(main)
        os.close(side)
    assert done.returncode == 0, done.stderr
    assert "(Pdb) rank 1> " in done.stdout
    assert "'secret of rank 1'" in done.stdout
    assert "rank 1 went on" in done.stdout and "rank 0 went on" in done.stdout


def test_without_a_terminal_the_rank_continues_with_a_message():
    done = subprocess.run(
        NBTRAIN, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "(Pdb)" not in done.stdout
    assert "rank 1 stopped at breakpoint()" in done.stdout + done.stderr
    assert "the rank continues" in done.stdout + done.stderr
    assert "rank 1 went on" in done.stdout
