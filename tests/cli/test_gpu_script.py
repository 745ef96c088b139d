"""benchmarks/gpu, the GPU acceptance check, as far as a machine without a GPU can run it: the
one command refuses clearly, the report is written as the README shows it, the wheel list is
closed and pinned, and the checks that need no GPU (gradient accumulation) pass on the CPU."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "benchmarks" / "gpu"


@pytest.fixture
def gpu_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    for folder in (GPU, ROOT / "tests" / "kernel"):
        monkeypatch.syspath_prepend(str(folder))


def test_the_one_command_refuses_a_machine_without_a_gpu(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(["bash", str(GPU / "run.sh"), str(tmp_path)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert "No CUDA GPU visible" in done.stdout
    assert not list(tmp_path.iterdir())  # no half-written results


def test_the_report_says_which_machine_produced_it(tmp_path: Path, gpu_modules: None) -> None:
    import gpu_report

    results = gpu_report.Results()
    results.add("1. nbtrain env", True, "GPU 0 | NVIDIA H100")
    results.add("3. fp16", False, "weights within 5e-01", "why it failed")
    with results.guard("5. FSDP2"):
        raise RuntimeError("boom")
    facts = {"date": "2026-11-26", "gpus": "NVIDIA H100 80GB HBM3", "gpu_count": "1",
             "torch": "2.11.0+cu130", "cuda": "13.0", "nccl": "2.28.9", "python": "3.12.3"}
    gpu_report.write(results, facts, 12.3, tmp_path)
    table = (tmp_path / "gpu-results.md").read_text()
    assert table.startswith("Measured on NVIDIA H100 80GB HBM3 (1 GPU), torch 2.11.0+cu130, "
                            "CUDA 13.0")
    assert "| 1. nbtrain env | PASS | GPU 0 \\| NVIDIA H100 |" in table
    assert "| 5. FSDP2 | **FAIL** | RuntimeError: boom |" in table
    saved = json.loads((tmp_path / "gpu-results.json").read_text())
    assert (saved["passed"], saved["failed"]) == (1, 2)
    assert "boom" in saved["results"][2]["detail"]


def test_the_carried_wheels_are_pinned_and_cover_what_run_sh_imports() -> None:
    pins = [line for line in (GPU / "requirements.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    assert all(re.fullmatch(r"[\w.-]+==[\w.]+", pin) for pin in pins), pins
    names = {pin.split("==")[0].lower().replace("_", "-") for pin in pins}
    probe = re.search(r'-c "import ([^"]+)"', (GPU / "run.sh").read_text())
    assert probe is not None
    imported = {name.strip().replace("_", "-") for name in probe.group(1).split(",")}
    assert imported <= names, imported - names


def test_gradient_accumulation_check_passes_on_cpu(gpu_modules: None) -> None:
    import checks_training
    import gpu_report

    results = gpu_report.Results()
    checks_training.check_accumulation(results, gpus=1)
    assert [item.passed for item in results.items] == [True], results.items
