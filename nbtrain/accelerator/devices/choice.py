"""Which device a rank computes on, decided from what the hardware offers.

``choose_device`` is pure: it takes an ``Availability`` (what torch reports, or what a test says)
and the rank's place, so the choice is testable on a CPU-only machine without mocking torch.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Availability:
    cuda_devices: int = 0
    mps: bool = False
    xla: str | None = None  # this ordinal's XLA device (e.g. "xla:0") inside an XLA run


def detect() -> Availability:
    """Ask torch. Runs in a rank (after the start method was chosen), so touching CUDA is safe."""
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    mps_backend = getattr(torch.backends, "mps", None)
    mps = bool(mps_backend is not None and mps_backend.is_available())
    from nbtrain.accelerator.devices.xla_runtime import (
        current_device,  # no torch_xla import unless it is already loaded
    )

    return Availability(cuda_devices=cuda, mps=mps, xla=current_device())


def choose_device(
    available: Availability, *, cpu: bool, local_rank: int, world_size: int
) -> torch.device:
    """The XLA device in XLA runs, CUDA ``cuda:LOCAL_RANK`` when GPUs exist, MPS for a single
    process, else CPU."""
    if cpu:
        return torch.device("cpu")
    if available.xla:
        return torch.device(available.xla)
    if available.cuda_devices:
        if local_rank >= available.cuda_devices:
            raise RuntimeError(
                f"This rank has LOCAL_RANK={local_rank} but only {available.cuda_devices} CUDA "
                f"GPU(s) are visible (cuda:0..cuda:{available.cuda_devices - 1}), so it has no GPU "
                "of its own. Launch at most one rank per GPU (num_processes="
                f"{available.cuda_devices}), or pass Accelerator(cpu=True)."
            )
        return torch.device("cuda", local_rank)
    if available.mps:
        if world_size == 1:
            return torch.device("mps")
        warnings.warn(
            f"MPS serves a single process only; with {world_size} ranks every rank trains on the "
            "CPU. Launch with num_processes=1 to use the Apple GPU.",
            RuntimeWarning,
            stacklevel=4,  # <- Accelerator._set_up_device <- __init__ <- the user's line
        )
    return torch.device("cpu")


def process_group_backend(device: torch.device, nccl_available: bool) -> str:
    """gloo on CPU (and MPS), nccl on CUDA when torch was built with it."""
    if device.type == "cuda" and nccl_available:
        return "nccl"
    return "gloo"


def activate(device: torch.device) -> None:
    """Make ``device`` the current CUDA device: stray ``.cuda()`` calls land on this rank's GPU."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
