"""Reliability suite: fault matrix, interrupts, soak, bad input, crash-safe checkpoints, channel.

Markers (all of them run in CI; select or deselect with -m):
- ``fault_matrix``: the 144 injected faults (start method x phase x fault x victim rank);
- ``soak``: 100 launches in one real Jupyter kernel.

The fault matrix's figures (faults injected, survived, time to control back, leaks) are printed
in the terminal summary; benchmarks/reliability.py prints the same table without pytest.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
for extra in (HERE, HERE.parent / "kernel"):  # rank-side modules, and kernelutil
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import faultmatrix as matrix  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "fault_matrix: the 144-case injected fault matrix")
    config.addinivalue_line("markers", "soak: 100 launches in one real Jupyter kernel")


@pytest.fixture(scope="session")
def fault_results() -> list[matrix.CaseResult]:
    return matrix.RESULTS


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if matrix.RESULTS:
        terminalreporter.write_sep("-", "fault matrix")
        terminalreporter.write_line(matrix.summary(matrix.RESULTS))
