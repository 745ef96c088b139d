"""Record Accelerate's own pass/fail on these ranks (the baseline the conformance test compares
with): ``PYTHONPATH=. python -m tests.accelerate_conformance.record`` (a few minutes: some
cases hang in Accelerate on CPU until the case timeout)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from .runner import BASELINE, record_baseline

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as directory:
        results = record_baseline(Path(directory))
    passed = sum(r["passed"] for r in results.values())
    print(f"Accelerate passes {passed} of {len(results)} cases; written to {BASELINE}")
    sys.exit(0)
