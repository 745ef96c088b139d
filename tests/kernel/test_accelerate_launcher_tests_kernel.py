"""Accelerate's own launcher tests against nbtrain, with only the launcher import changed, in a
real Jupyter kernel, in the order that exposed issue 28: a 1-process launch and
``test_sync.main()`` form Accelerate's state in the kernel first; the fork launches after them
must still form worlds of 2 (tests/accelerate_conformance/launcher_tests.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from kernelutil import running_kernel

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT))  # (the harness module, here and in the kernel)

from tests.accelerate_conformance.launcher_tests import unexpected  # noqa: E402

pytestmark = pytest.mark.timeout(600)

SETUP = f"""
import json, sys
sys.path.insert(0, {str(ROOT)!r})
from tests.accelerate_conformance.launcher_tests import run_all
"""


def test_accelerates_launcher_tests_in_a_kernel(tmp_path):
    with running_kernel(tmp_path, SETUP) as kernel:
        out = kernel.run("results = run_all()", timeout=500)
        assert out.error is None, out.traceback_text
        results = json.loads(kernel.value("json.dumps(results)"))  # type: ignore[arg-type]
    assert list(results)[:2] == [  # the runs that form Accelerate's state in the kernel
        "test_notebook::test_can_initialize[1]",
        "test_grad_sync::test_gradient_sync_multi_cpu",
    ]
    assert not unexpected(results), json.dumps(unexpected(results), indent=1)
