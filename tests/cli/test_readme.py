"""What the README tells a newcomer to run works as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def test_the_in_a_notebook_snippet_runs_as_it_stands(tmp_path: Path):
    section = README.split("## In a notebook", 1)[1]
    snippet = re.search(r"```python\n(.*?)```", section, re.S)
    assert snippet is not None, "the section lost its code block"
    script = tmp_path / "snippet.py"
    script.write_text(
        snippet.group(1)
        + "\nassert set(weights) == {'0.weight', '0.bias', '2.weight', '2.bias'}, weights.keys()"
        + "\nprint('snippet ok')\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=150, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "snippet ok" in done.stdout


def test_the_torch_pin_is_met_by_pypi_and_by_the_cpu_build_on_disk():
    # The README's first command must work on a laptop (PyPI: 2.13.0) and here (a local
    # 2.13.0+cpu wheel, which pip prefers: a local version sorts after its public one).
    pins = [
        Requirement(line)
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    torch = next(pin for pin in pins if pin.name == "torch")
    assert torch.specifier.contains("2.13.0"), torch
    assert torch.specifier.contains("2.13.0+cpu"), torch
