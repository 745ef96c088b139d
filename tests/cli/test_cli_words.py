"""What a launch from a terminal says while it starts: words for where the user is (issue 43,
point 12). A script that launches fork ranks imports torch in its own process first: the status
line said "importing torch in the kernel (first launch only)" though there was no kernel."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

SCRIPTS = Path(__file__).parent / "scripts"


def in_a_terminal(command: list[str]) -> tuple[int, str]:
    """Run ``command`` with stdout and stderr on a pseudo-terminal (the live status line draws
    each phase at once, however short it is); its exit code and everything it wrote."""
    main, side = os.openpty()
    env = {**os.environ, "COLUMNS": "240"}  # a wide terminal: the status line is not cut
    try:
        process = subprocess.Popen(command, stdout=side, stderr=side, env=env)
        os.close(side)
        chunks: list[bytes] = []
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not chunk:
                break
            chunks.append(chunk)
        code = process.wait(timeout=120)
    finally:
        os.close(main)
    return code, b"".join(chunks).decode(errors="replace")


def test_a_script_that_launches_says_nothing_of_a_kernel():
    code, said = in_a_terminal([sys.executable, str(SCRIPTS / "launches.py")])
    assert code == 0, said
    assert "results [0, 1]" in said
    assert "importing torch before forking the ranks" in said, said
    assert "kernel" not in said, said


def test_nbtrain_launch_says_nothing_of_a_kernel():
    command = [sys.executable, "-m", "nbtrain", "launch", "--num-processes", "2"]
    code, said = in_a_terminal([*command, str(SCRIPTS / "hello.py")])
    assert code == 0, said
    assert "hello from rank 1 of 2" in said
    assert "kernel" not in said, said
