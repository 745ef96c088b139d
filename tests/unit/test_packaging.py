"""The package's metadata builds cleanly: an editable install prints no deprecation warnings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_license_is_an_spdx_expression_with_a_backend_that_reads_it() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"  # PEP 639's form, not {text = ...}
    # setuptools reads a license string from 77 on; an older backend would reject it.
    assert "setuptools>=77" in project["build-system"]["requires"]


def test_building_the_metadata_warns_about_nothing(tmp_path: Path) -> None:
    setuptools = pytest.importorskip("setuptools")
    major = int(setuptools.__version__.split(".")[0])
    if major < 77:
        pytest.skip(f"setuptools {setuptools.__version__} here; pip's build uses >=77")
    code = (
        "import sys; from setuptools import build_meta; "
        "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))"
    )
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", code, str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Deprecat" not in done.stderr + done.stdout, done.stderr
    metadata = (tmp_path / done.stdout.strip().splitlines()[-1] / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in metadata
