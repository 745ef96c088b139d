"""Accelerate's own launcher tests (test_notebook.py, and the debug_launcher bodies of
test_cpu.py / test_grad_sync.py), run in this process against nbtrain with only the launcher
import changed, in the order that exposed issue 28 (see launcher_tests.py). The same run in a
real Jupyter kernel: tests/kernel/test_accelerate_launcher_tests_kernel.py."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest

from .launcher_tests import (
    EXPECTED_FAILURES,
    forget_this_process_state,
    readme_count,
    run_all,
    unexpected,
)

pytestmark = pytest.mark.timeout(600)

README = Path(__file__).parents[2] / "README.md"


def test_accelerates_launcher_tests_pass_with_the_import_changed():
    try:
        results = run_all()
    finally:
        forget_this_process_state()
        # test_fault_tolerant's mp.Queue (refused by nbtrain) is held by the failed launch's
        # error, which nbtrain.runs() keeps until it is cleared (as documented): clear it and
        # collect, so the queue's feeder thread ends (the leak guard).
        import nbtrain

        nbtrain.runs().clear()
        gc.collect()
    assert not unexpected(results), json.dumps(unexpected(results), indent=1)
    passed = sum(result["passed"] for result in results.values())
    assert readme_count(README.read_text()) == (passed, len(results))
    assert passed == len(results) - len(EXPECTED_FAILURES)
