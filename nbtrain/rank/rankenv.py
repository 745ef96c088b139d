"""Where this process sits in the job, and the defaults its launch left for it.

The one place on the worker side that reads environment variables (devices, parallel, precision,
data and checkpoint only receive values). Sources, first match wins:

1. a process group the user's code already initialised (its rank and size are the truth);
2. ``nbtrain.rank.runtime.current()`` inside an nbtrain launch;
3. the variables torchrun / ``accelerate launch`` / ``nbtrain launch`` export (RANK, ...);
4. otherwise a single process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from nbtrain.rank import runtime


@dataclass(frozen=True)
class Placement:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1


def placement() -> Placement:
    import torch.distributed as dist

    current = runtime.current()
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        if current is not None:
            info = current.info
            return Placement(rank, info.local_rank, world, info.local_world_size)
        local_world = _int_env("LOCAL_WORLD_SIZE", world)
        return Placement(rank, _int_env("LOCAL_RANK", rank % local_world), world, local_world)
    if current is not None:
        info = current.info
        return Placement(info.rank, info.local_rank, info.world_size, info.local_world_size)
    world = _int_env("WORLD_SIZE", 1)
    rank = _int_env("RANK", 0)
    local_world = _int_env("LOCAL_WORLD_SIZE", world)
    return Placement(rank, _int_env("LOCAL_RANK", rank % max(local_world, 1)), world, local_world)


def default_mixed_precision() -> tuple[str | None, str]:
    """(value, where it came from): the launcher's ``mixed_precision=`` inside nbtrain launches;
    outside them the variable ``accelerate launch`` exports, as Accelerate reads it."""
    current = runtime.current()
    if current is not None:
        return current.mixed_precision, "notebook_launcher(mixed_precision=...)"
    value = os.environ.get("ACCELERATE_MIXED_PRECISION", "").strip().lower()
    return value or None, "the environment variable ACCELERATE_MIXED_PRECISION"


def default_log_level() -> str | None:
    """`accelerate launch` users set ACCELERATE_LOG_LEVEL for `get_logger` (accelerator.logging)."""
    return os.environ.get("ACCELERATE_LOG_LEVEL") or None


def force_cpu() -> bool:
    """``accelerate launch --cpu`` exports ACCELERATE_USE_CPU; honour it as Accelerate does."""
    return os.environ.get("ACCELERATE_USE_CPU", "").strip().lower() in {"1", "true", "yes", "on"}


def variable(name: str) -> str | None:
    """A variable a launcher exported for this process (``accelerate launch``'s FSDP_*, ...)."""
    return os.environ.get(name)


def xla_device_chosen() -> bool:
    """torch_xla's PJRT device is set for this process (the XLA host sets it)."""
    return bool(os.environ.get("PJRT_DEVICE"))


def _int_env(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"Environment variable {name}={value!r} must be a whole number; it is set by the "
            "launcher (torchrun, accelerate launch, nbtrain). Unset it to run as one process."
        ) from None


def adopt_environment(kernel_env: dict[str, str] | None, rank_env: dict[str, str]) -> None:
    """A forkserver child starts with the environment the server had when it started (maybe
    hours ago): take the kernel's current one, so variables set in a cell since then arrive
    (fork and spawn children inherit it at start anyway, and get None here)."""
    if kernel_env is not None:
        os.environ.clear()
        os.environ.update(kernel_env)
    os.environ.update(rank_env)
