"""``nbtrain launch --debug``: a failed rank's post-mortem prompt is the terminal's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nbtrain.kernel.cli.commands import main

pytestmark = pytest.mark.timeout(180)

SCRIPT = str(Path(__file__).parent / "scripts" / "fails.py")
NBTRAIN = [sys.executable, "-m", "nbtrain", "launch", "--debug", "--num-processes", "2", SCRIPT]


def test_the_failing_rank_opens_pdb_on_the_terminal_then_the_failure_is_reported():
    main, side = os.openpty()  # a terminal for the launcher's stdin
    try:
        os.write(main, b"p batch, scale\nup\np secret\nc\n")
        done = subprocess.run(NBTRAIN, stdin=side, capture_output=True, text=True, timeout=120)
    finally:
        os.close(main)
        os.close(side)
    # Rank 0 is stopped while rank 1 is at its prompt: its line lands wherever the loop read it,
    # on a terminal below the echoed answer, in this pipe (no echo) right after a prompt.
    assert done.stdout.count("[rank 0] stopped\n") == 1, done.stdout
    out = done.stdout.replace("[rank 0] stopped\n", "")
    assert "[nbtrain] post-mortem of rank 1: ValueError: bad batch 21" in out, out
    assert "(Pdb) rank 1> (7, 3)" in out, out  # the failing frame's locals
    assert "-> step(7)" in out and "'secret of rank 1'" in out  # up: the script's frame
    # Then as without --debug: the root cause and the rank's exit code.
    assert done.returncode == 1, done.stderr
    assert "nbtrain: rank 1 failed with ValueError: bad batch 21" in done.stderr


def test_debug_without_a_terminal_is_refused_before_any_rank_starts(capsys):
    # (in this process: pytest's stdin is not a terminal)
    assert not sys.stdin.isatty()
    assert main(NBTRAIN[3:]) == 2
    err = capsys.readouterr().err
    assert "nbtrain launch: error: --debug: this run has no input to type pdb commands in" in err
    assert "Run nbtrain launch from a terminal, or leave --debug out." in err
