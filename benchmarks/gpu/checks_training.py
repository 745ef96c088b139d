"""The Accelerator on CUDA, launched from a plain process: precision against a CPU fp32
reference, gradient accumulation, fp16's grad scaler against torch's, more ranks than GPUs,
and FSDP2 stop/resume against an uninterrupted run."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from gpu_report import Results
from gpu_workloads import fp16_skips, probe, train_fsdp, train_mlp, train_mlp_torch_fp16
from stopresume import interrupt_when

from nbtrain import WorkerError, notebook_launcher

QUIET: dict[str, Any] = {"progress": "off", "output": "none"}
# Tolerances, relative to the largest weight: fp32 GPU vs CPU differ by summation order only;
# bf16 autocast keeps fp32 master weights but computes with 8 mantissa bits; fp16 is compared
# with torch's own fp16 recipe, which should take the same steps.
TOLERANCE = {"no": 1e-4, "bf16": 5e-2, "fp16": 1e-3}


def relative_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-12)).item() for k in a)


def check_precision(results: Results, gpus: int) -> None:
    reference = notebook_launcher(train_mlp, kwargs={"cpu": True}, num_processes=gpus, **QUIET)
    for precision in ("no", "bf16"):
        with results.guard(f"3. Accelerator {precision} vs CPU fp32"):
            run = notebook_launcher(train_mlp, kwargs={"precision": precision},
                                    num_processes=gpus, **QUIET)
            gap = relative_gap(run["weights"], reference["weights"])
            results.add(f"3. Accelerator {precision} vs CPU fp32",
                        run["device"].startswith("cuda") and gap < TOLERANCE[precision],
                        f"{run['distributed']} on {run['device']} x{run['world']}: weights within "
                        f"{gap:.1e} (tolerance {TOLERANCE[precision]:g}); last loss "
                        f"{run['losses'][-1]:.4f} vs {reference['losses'][-1]:.4f}")


def check_fp16(results: Results) -> None:
    """fp16's dynamic loss scale skips the first steps (inf gradients at 65536x), so the run is
    compared with torch's own fp16 recipe (autocast + GradScaler) on the same data."""
    with results.guard("3. Accelerator fp16 vs torch autocast + GradScaler"):
        ours = notebook_launcher(train_mlp, kwargs={"precision": "fp16"}, num_processes=1,
                                 **QUIET)
        theirs = notebook_launcher(train_mlp_torch_fp16, num_processes=1, **QUIET)
        gap = relative_gap(ours["weights"], theirs["weights"])
        results.add("3. Accelerator fp16 vs torch autocast + GradScaler",
                    gap < TOLERANCE["fp16"],
                    f"weights within {gap:.1e} (tolerance {TOLERANCE['fp16']:g}); last loss "
                    f"{ours['losses'][-1]:.4f} vs {theirs['losses'][-1]:.4f}")


def check_accumulation(results: Results, gpus: int) -> None:
    with results.guard("3. gradient accumulation 4x8 = 1x32"):
        whole = notebook_launcher(train_mlp, kwargs={"batch": 32}, num_processes=gpus, **QUIET)
        parts = notebook_launcher(train_mlp, kwargs={"batch": 8, "accumulate": 4},
                                  num_processes=gpus, **QUIET)
        gap = relative_gap(parts["weights"], whole["weights"])
        results.add("3. gradient accumulation 4x8 = 1x32", gap < 1e-5,
                    f"weights within {gap:.1e} (tolerance 1e-05)")


def check_fp16_scaler(results: Results) -> None:
    with results.guard("3. fp16 grad scaler skips inf steps like torch's"):
        run = notebook_launcher(fp16_skips, num_processes=1, **QUIET)
        skipped = [i for i, (was, _) in enumerate(run["ours"]) if was]
        same = [was for was, _ in run["ours"]] == [was for was, _ in run["torch"]] and [
            scale for _, scale in run["ours"]] == [scale for _, scale in run["torch"]]
        results.add("3. fp16 grad scaler skips inf steps like torch's",
                    skipped == [2] and same and run["same_weights"],
                    f"skipped steps {skipped}, scales {[s for _, s in run['ours']][:4]}...; "
                    f"same as torch.amp.GradScaler: {same}; same weights: {run['same_weights']}")


def check_more_ranks_than_gpus(results: Results, gpus: int) -> None:
    with results.guard("3. more ranks than GPUs"):
        try:
            notebook_launcher(probe, num_processes=gpus + 1, **QUIET)
            message = "no error"
        except WorkerError as error:
            message = str(error)
        results.add("3. more ranks than GPUs", "has no GPU" in message or "one rank per GPU"
                    in message, message.splitlines()[0][:200] if message else "")


def check_fsdp_resume(results: Results, gpus: int) -> None:
    with results.guard("5. FSDP2 stop/resume = uninterrupted"), \
            tempfile.TemporaryDirectory() as tmp:
        reference = notebook_launcher(train_fsdp, num_processes=gpus, **QUIET)
        marker = Path(tmp) / "marker"
        thread = interrupt_when(marker, 0.5)
        message = "not interrupted"
        try:
            notebook_launcher(train_fsdp, kwargs={"marker": str(marker), "slow": 0.02},
                              num_processes=gpus, on_interrupt="checkpoint",
                              project_dir=Path(tmp) / "project", **QUIET)
        except KeyboardInterrupt as stop:
            message = str(stop)
        finally:
            thread.join()
        resumed = notebook_launcher(train_fsdp, num_processes=gpus, resume=True,
                                    project_dir=Path(tmp) / "project", **QUIET)
        equal = all(torch.equal(resumed[k], reference[k]) for k in reference)
        results.add("5. FSDP2 stop/resume = uninterrupted", "saved in" in message and equal,
                    f"{message.splitlines()[0][:90]}; resumed weights bitwise equal: {equal}")
