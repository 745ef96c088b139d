"""Results of the GPU acceptance check: one record per check, the machine that produced them,
and the JSON + markdown table written at the end (the README's "Measured on a GPU" table)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
import subprocess
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@dataclasses.dataclass
class Result:
    check: str  # '2. kernel: fork refused'
    passed: bool
    figure: str  # what was measured, shown in the table
    detail: str = ""  # why it failed, or more context

    def line(self) -> str:
        tail = f" ({self.detail})" if self.detail and not self.passed else ""
        return f"{'PASS' if self.passed else 'FAIL'}  {self.check}: {self.figure}{tail}"


class Results:
    """Collects results and prints each PASS/FAIL line as it comes."""

    def __init__(self) -> None:
        self.items: list[Result] = []

    def add(self, check: str, passed: bool, figure: str, detail: str = "") -> None:
        result = Result(check, bool(passed), " ".join(figure.split()), detail)
        self.items.append(result)
        print(result.line(), flush=True)

    @contextmanager
    def guard(self, check: str) -> Iterator[None]:
        """A check that raises is one FAIL with the error's last lines; the next check runs."""
        try:
            yield
        except Exception as exc:  # a failed check must not hide the others
            lines = traceback.format_exception(exc)
            self.add(check, False, f"{type(exc).__name__}: {exc}"[:300], "".join(lines)[-1500:])


def machine() -> dict[str, str]:
    """Card, driver, torch and CUDA: what produced the table."""
    import torch

    smi = _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                "--format=csv,noheader"])
    cards = [line.strip() for line in smi.splitlines() if line.strip()]
    return {
        "date": datetime.date.today().isoformat(),
        "gpus": "; ".join(cards) or "none",
        "gpu_count": str(len(cards)),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "",
        "python": platform.python_version(),
    }


def write(results: Results, facts: dict[str, str], seconds: float, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    records = [dataclasses.asdict(item) for item in results.items]
    passed = sum(item.passed for item in results.items)
    summary = {"machine": facts, "seconds": round(seconds, 1), "passed": passed,
               "failed": len(records) - passed, "results": records}
    (out / "gpu-results.json").write_text(json.dumps(summary, indent=2))
    (out / "gpu-results.md").write_text(markdown(results, facts, seconds))
    print(f"\n{passed} passed, {len(records) - passed} failed in {seconds:.0f} s; "
          f"written to {out}/gpu-results.json and gpu-results.md", flush=True)


def markdown(results: Results, facts: dict[str, str], seconds: float) -> str:
    head = (f"Measured on {facts['gpus']} ({facts['gpu_count']} GPU), torch {facts['torch']}, "
            f"CUDA {facts['cuda']}, NCCL {facts['nccl']}, Python {facts['python']}, "
            f"{facts['date']}; the whole check took {seconds:.0f} s.\n\n")
    rows = ["| check | result | figure |", "|---|---|---|"]
    for item in results.items:
        figure = item.figure.replace("|", "\\|")
        rows.append(f"| {item.check} | {'PASS' if item.passed else '**FAIL**'} | {figure} |")
    return head + "\n".join(rows) + "\n"


def _run(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def timed(function: Callable[[], object]) -> tuple[object, float]:
    import time

    start = time.perf_counter()
    value = function()
    return value, time.perf_counter() - start
