"""tests/xla runs only where torch_xla is installed (.venv-xla: see .ci/xla-env.sh):

    PJRT_DEVICE=CPU .venv-xla/bin/python -m pytest tests/xla

Elsewhere (the main venv) every test here is skipped with the reason. Test modules never import
torch_xla at module level: the functions they launch import it inside the XLA host.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "kernel"))  # kernelutil: drive a real Jupyter kernel
sys.path.insert(0, str(HERE))  # support: the XLA:CPU multi-replica workaround

MISSING = importlib.util.find_spec("torch_xla") is None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not MISSING:
        return
    skip = pytest.mark.skip(
        reason="torch_xla is not installed in this interpreter: run tests/xla with "
        ".venv-xla/bin/python (created by .ci/xla-env.sh)"
    )
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def xla_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every XLA test runs the XLA path on the CPU, whatever the caller's environment says."""
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    for name in ("CPU_NUM_DEVICES", "TPU_NUM_DEVICES"):
        if name in os.environ:
            monkeypatch.delenv(name)
