"""What this machine and this Python process offer, detected without side effects.

The kernel side's one reader (and writer) of ``os.environ``: every other kernel-side module asks
here. Nothing here initialises CUDA or the XLA runtime: detection must never make a later fork
unsafe.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path

from nbtrain.shared.frontend import Frontend, frontend

__all__ = ["Frontend", "frontend"]  # re-exported: the kernel asks here for every fact


def in_colab() -> bool:
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def in_kaggle() -> bool:
    return "KAGGLE_KERNEL_RUN_TYPE" in os.environ or "KAGGLE_URL_BASE" in os.environ


def available_start_methods() -> tuple[str, ...]:
    return tuple(multiprocessing.get_all_start_methods())


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


@cache
def cuda_built() -> bool:
    import torch

    return torch.version.cuda is not None or torch.version.hip is not None


def cuda_device_count() -> int:
    """Visible CUDA devices, without initialising CUDA in this process when avoidable.

    NVML counts devices (honouring CUDA_VISIBLE_DEVICES) without creating a CUDA context, so a
    later fork stays safe. Only if NVML is unavailable do we fall back to torch's own count.
    """
    if not cuda_built():
        return 0
    import torch

    count = torch.cuda._device_count_nvml()
    return count if count >= 0 else torch.cuda.device_count()


def gpu_descriptions() -> list[tuple[str, str]]:
    """('0', 'NVIDIA H100 80GB HBM3, 81559 MiB, driver 580.159.04') per GPU of the machine, as
    nvidia-smi reports them (no CUDA context here; it lists every GPU, whatever
    CUDA_VISIBLE_DEVICES says). Empty without nvidia-smi or when it fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    query = "--query-gpu=index,name,memory.total,driver_version"
    try:
        done = subprocess.run(
            [smi, query, "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    rows = [line.split(", ") for line in done.stdout.splitlines() if line.count(", ") == 3]
    return [(index, f"{name}, {memory}, driver {driver}") for index, name, memory, driver in rows]


def cuda_initialized() -> bool:
    """Has this process created a CUDA context (which a forked child could not use)?"""
    torch = sys.modules.get("torch")
    return bool(torch is not None and cuda_built() and torch.cuda.is_initialized())


def fork_poisons_cuda() -> bool:
    """The precise test: would a forked child be in torch's 'bad fork' state for CUDA?

    `torch.cuda.is_initialized()` alone is too strict (Lightning #21389): it is True after
    harmless passive initialisation. We only pay for a probe fork when it says True.
    """
    if not cuda_initialized() or "fork" not in available_start_methods():
        return False
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the probe child
        import torch

        os.write(write_fd, b"1" if torch.cuda._is_in_bad_fork() else b"0")
        os._exit(0)
    os.close(write_fd)
    answer = os.read(read_fd, 1)
    os.close(read_fd)
    os.waitpid(pid, 0)
    return answer != b"0"


def platform_summary() -> str:
    return f"{platform.system()} {platform.machine()}, Python {platform.python_version()}"


def tpu_host() -> bool:
    """A TPU runtime is (or is declared) present. Only environment facts: no XLA import."""
    from nbtrain.shared import tpu

    return tpu.detect(variables()).tpu


def variables() -> Mapping[str, str]:
    """The kernel's environment as it is now (read-only use)."""
    return os.environ


def snapshot() -> dict[str, str]:
    """A copy of the kernel's environment now: what a forkserver rank adopts."""
    return dict(os.environ)


def log_root() -> Path:
    """Where each launch's complete rank output is kept: $NBTRAIN_LOG_DIR, else
    <temp dir>/nbtrain-logs."""
    chosen = os.environ.get("NBTRAIN_LOG_DIR")
    return Path(chosen) if chosen else Path(tempfile.gettempdir()) / "nbtrain-logs"


def warm_up_on_import() -> bool:
    """``import nbtrain`` in a kernel warms up (kernel/procs/warmup.py) unless NBTRAIN_WARM_UP=0."""
    return os.environ.get("NBTRAIN_WARM_UP", "1").strip() != "0"


def omp_threads_set() -> bool:
    """The user chose OpenMP's thread count: ranks keep it instead of a share of the cores."""
    return "OMP_NUM_THREADS" in os.environ


def visible_devices() -> str | None:
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def gloo_interface_set() -> bool:
    return "GLOO_SOCKET_IFNAME" in os.environ


@contextlib.contextmanager
def overridden(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` set in this process for the duration, then restored exactly (a variable that
    did not exist is removed again): ranks inherit what is set while they start."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def gpus_hidden() -> contextlib.AbstractContextManager[None]:
    """Ranks started meanwhile see no GPU (debug_launcher's CPU-only launch)."""
    return overridden({"CUDA_VISIBLE_DEVICES": ""})
