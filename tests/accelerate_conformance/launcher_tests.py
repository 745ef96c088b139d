"""Accelerate's own tests of its launchers, run against nbtrain with only the launcher import
changed (``from accelerate import notebook_launcher, debug_launcher`` -> ``from nbtrain ...``):

- ``accelerate/test_utils/scripts/test_notebook.py`` from the installed Accelerate (its test
  functions, as Accelerate's CLI test runs them, with ACCELERATE_NUM_PROCESSES=1 then 2);
- the ``debug_launcher`` test bodies of Accelerate's repository tests ``tests/test_cpu.py`` and
  ``tests/test_grad_sync.py`` (their calls, over the installed Accelerate's test scripts
  ``test_script`` and ``test_sync``; ``tests/test_metrics.py`` needs ``datasets`` and
  ``evaluate``, and Accelerate's own decorator skips it without them, as here).

In the order that exposed issue 28: runs that form Accelerate's state in this process (a
1-process launch, ``test_sync.main()`` itself) come before the fork launches. Each 2-process
``debug_launcher`` body also reports the world its ranks formed afterwards (the bug passed them
vacuously, as "process 0 of 1"). ``run_all()`` runs in a script or in a Jupyter kernel alike.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import nbtrain

NOTEBOOK = "accelerate.test_utils.scripts.test_notebook"

# The one test nbtrain fails on purpose, with the error it gets.
EXPECTED_FAILURES = {
    "test_notebook::test_fault_tolerant[2]": (
        "PayloadError: Cannot send the function and its arguments to the ranks: "
        "args[0]._rlock._semlock"
    ),
}
_SUITE = "needs datasets and evaluate (Accelerate's require_huggingface_suite skips it)"
NOT_RUN = {
    "test_notebook::test_problematic_imports": "needs bitsandbytes (Accelerate's require_bnb)",
    "test_metrics::test_metric_cpu_noop": _SUITE,
    "test_metrics::test_metric_cpu_multi": _SUITE,
}


@dataclass(frozen=True)
class WorldAfter:
    """A ``debug_launcher`` body, then the number of processes Accelerate's ``PartialState``
    counted in the rank (1 under the bug: the kernel's "process 0 of 1"). Read from its shared
    dict: both scripts destroy the process group at their end, and test_script resets
    ``AcceleratorState``, but the ``PartialState`` they formed stays."""

    main: Callable[[], Any]

    def __call__(self) -> int:
        from accelerate.state import PartialState

        self.main()
        return int(PartialState._shared_state.get("num_processes", 0))


def notebook_tests(processes: int) -> Any:
    """The installed test_notebook.py, its launcher import changed; ACCELERATE_NUM_PROCESSES is
    read when it is imported (by its skip marks too), so it is imported afresh."""
    previous = os.environ.get("ACCELERATE_NUM_PROCESSES")
    os.environ["ACCELERATE_NUM_PROCESSES"] = str(processes)
    try:
        sys.modules.pop(NOTEBOOK, None)
        module = importlib.import_module(NOTEBOOK)
    finally:
        if previous is None:
            os.environ.pop("ACCELERATE_NUM_PROCESSES")
        else:
            os.environ["ACCELERATE_NUM_PROCESSES"] = previous
    module.notebook_launcher = nbtrain.notebook_launcher  # the one line a user changes
    return module


def script(name: str) -> Any:
    return importlib.import_module(f"accelerate.test_utils.scripts.{name}")


def _two_ranks_formed(world: int) -> None:
    if world != 2:
        raise AssertionError(f"the ranks formed a world of {world}, not of 2")


def test_cpu() -> None:  # tests/test_cpu.py::MultiCPUTester::test_cpu
    _two_ranks_formed(nbtrain.debug_launcher(WorldAfter(script("test_script").main)))


def test_gradient_sync_multi_cpu() -> None:  # tests/test_grad_sync.py (runs in this process)
    script("test_sync").main()


def test_gradient_sync_single_cpu_noop() -> None:  # tests/test_grad_sync.py
    _two_ranks_formed(nbtrain.debug_launcher(WorldAfter(script("test_sync").main)))
    nbtrain.debug_launcher(script("test_sync").main, num_processes=1)


def cases() -> list[tuple[str, Callable[[], Any]]]:
    """(id, call), in the order that exposed issue 28."""
    one = notebook_tests(1)
    listed: list[tuple[str, Callable[[], Any]]] = [
        ("test_notebook::test_can_initialize[1]", one.test_can_initialize),  # in this process
        ("test_grad_sync::test_gradient_sync_multi_cpu", test_gradient_sync_multi_cpu),
        ("test_cpu::test_cpu", test_cpu),
        ("test_grad_sync::test_gradient_sync_single_cpu_noop", test_gradient_sync_single_cpu_noop),
    ]
    two = notebook_tests(2)
    for name in (
        "test_can_initialize",
        "test_clean_cuda_fork",
        "test_static_rdzv_backend",
        "test_c10d_rdzv_backend",
        "test_fault_tolerant",
        "test_monitoring",
    ):
        listed.append((f"test_notebook::{name}[2]", getattr(two, name)))
    return listed


def run_all() -> dict[str, dict[str, Any]]:
    """Each test's outcome: passed, or its error (type and message, cut)."""
    results: dict[str, dict[str, Any]] = {}
    for case_id, call in cases():
        started = time.monotonic()
        try:
            call()
            error = None
        except BaseException as failure:  # (a test's failure is its result)
            if isinstance(failure, KeyboardInterrupt):
                raise
            error = f"{type(failure).__name__}: {failure}".strip()[:400]
        results[case_id] = {
            "passed": error is None,
            "error": error,
            "seconds": round(time.monotonic() - started, 2),
        }
    return results


def forget_this_process_state() -> None:
    """The runs formed Accelerate's state in this process (as they do in a user's kernel)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def unexpected(results: dict[str, dict[str, Any]]) -> dict[str, str | None]:
    """Cases whose outcome differs from the expected one: every case passes except those in
    EXPECTED_FAILURES, which fail with their error."""
    wrong: dict[str, str | None] = {}
    for case_id, result in results.items():
        expected = EXPECTED_FAILURES.get(case_id)
        if expected is None and not result["passed"]:
            wrong[case_id] = result["error"]
        elif expected is not None and not (result["error"] or "").startswith(expected):
            wrong[case_id] = f"expected {expected!r}, got {result['error']!r}"
    return wrong


def readme_count(readme: str) -> tuple[int, int] | None:
    """The README's "Accelerate's launcher tests: X of Y"."""
    import re

    found = re.search(r"Accelerate's launcher tests: (\d+) of (\d+)", readme)
    return (int(found[1]), int(found[2])) if found else None
