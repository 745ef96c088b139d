"""Is this a TPU host (or an explicit XLA:CPU run), and how many XLA ordinals does it offer?

Facts only: environment variables and device files, never an import of torch_xla (importing it is
harmless, but *using* it initialises the XLA runtime in the kernel, after which torch_xla refuses to
launch). Everything takes its inputs as parameters, so each hosting environment is testable on any
machine.

What the environments set (as documented by Google / observed in their images):
- Cloud TPU VMs (also Colab's and Kaggle's current TPU runtimes): TPU chips as /dev/accel* (v2-v4)
  or VFIO devices /dev/vfio/<n> (v5e and later); libtpu installed; often TPU_ACCELERATOR_TYPE
  (e.g. "v3-8"), TPU_WORKER_ID, TPU_CHIPS_PER_HOST_BOUNDS, TPU_SKIP_MDS_QUERY.
- Colab's legacy TPU-node runtime: COLAB_TPU_ADDR (the TPU is remote, no device file).
- Kaggle TPU VMs: KAGGLE_URL_BASE / KAGGLE_KERNEL_RUN_TYPE plus the TPU VM markers above (no
  TPU_NAME: acc #2893).
- PJRT_DEVICE: torch_xla's own switch; "TPU" declares a TPU, "CPU" runs the XLA path on the CPU
  (CPU_NUM_DEVICES ordinals), which is how nbtrain's XLA path is tested without a TPU.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

# Environment variables only a TPU runtime sets.
TPU_VARIABLES = (
    "TPU_ACCELERATOR_TYPE",
    "TPU_WORKER_ID",
    "TPU_CHIPS_PER_HOST_BOUNDS",
    "TPU_SKIP_MDS_QUERY",
    "TPU_NAME",
    "COLAB_TPU_ADDR",
)
DEFAULT_TPU_ORDINALS = 8  # v2-8 / v3-8: 4 chips x 2 TensorCores, the Colab and Kaggle TPU


class Host(Enum):
    COLAB = "colab"
    KAGGLE = "kaggle"
    TPU_VM = "tpu-vm"  # a Cloud TPU VM, or a TPU machine we cannot name
    XLA_CPU = "xla-cpu"  # PJRT_DEVICE=CPU: the XLA path on the CPU
    NONE = "none"


@dataclass(frozen=True)
class XlaTarget:
    """Where an XLA launch would run, and why we think so."""

    host: Host
    device: str  # the PJRT device: "TPU" or "CPU"; "" when there is no XLA target
    reason: str

    @property
    def xla(self) -> bool:
        return self.host is not Host.NONE

    @property
    def tpu(self) -> bool:
        return self.device == "TPU"


def tpu_device_files(root: str | os.PathLike[str] = "/") -> list[str]:
    """TPU chips visible as device files under ``root`` (a fake root in tests)."""
    base = Path(root) / "dev"
    found = sorted(str(path) for path in base.glob("accel[0-9]*"))
    vfio = base / "vfio"
    if vfio.is_dir():  # v5e+ chips; /dev/vfio/vfio itself is the VFIO control device
        found += sorted(str(p) for p in vfio.iterdir() if p.name.isdigit())
    return found


def detect(
    environ: Mapping[str, str] | None = None, root: str | os.PathLike[str] = "/"
) -> XlaTarget:
    env = os.environ if environ is None else environ
    explicit = env.get("PJRT_DEVICE", "").strip().upper()
    if explicit == "CPU":
        return XlaTarget(Host.XLA_CPU, "CPU", "PJRT_DEVICE=CPU: the XLA path on the CPU")
    markers = [name for name in TPU_VARIABLES if env.get(name)]
    files = tpu_device_files(root)
    if explicit != "TPU" and not markers and not files:
        return XlaTarget(Host.NONE, "", "no TPU device files or TPU runtime variables")
    evidence = (
        ["PJRT_DEVICE=TPU"] * (explicit == "TPU") + markers + [f"device {f}" for f in files[:2]]
    )
    if "COLAB_RELEASE_TAG" in env or "COLAB_TPU_ADDR" in env or "COLAB_GPU" in env:
        host = Host.COLAB
    elif "KAGGLE_KERNEL_RUN_TYPE" in env or "KAGGLE_URL_BASE" in env:
        host = Host.KAGGLE
    else:
        host = Host.TPU_VM
    return XlaTarget(host, "TPU", f"TPU on {host.value}: " + ", ".join(evidence))


def libtpu_installed() -> bool:
    """Supporting evidence only (pip installs libtpu on any machine with torch_xla[tpu])."""
    return any(importlib.util.find_spec(name) is not None for name in ("libtpu", "libtpu_nightly"))


def torch_xla_installed() -> bool:
    return "torch_xla" in sys.modules or importlib.util.find_spec("torch_xla") is not None


def default_ordinals(
    target: XlaTarget, environ: Mapping[str, str] | None = None, root: str | os.PathLike[str] = "/"
) -> int:
    """All the devices torch_xla would use on this host (what xmp.spawn's nprocs=None means)."""
    env = os.environ if environ is None else environ
    if target.device == "CPU":
        return _positive(env.get("CPU_NUM_DEVICES")) or 1
    explicit = _positive(env.get("TPU_NUM_DEVICES"))
    if explicit:
        return explicit
    from_type = _ordinals_of_type(env.get("TPU_ACCELERATOR_TYPE", ""))
    if from_type:
        return from_type
    chips = len(tpu_device_files(root))
    accel = len(list((Path(root) / "dev").glob("accel[0-9]*")))
    if chips and accel == chips:  # v2-v4 device files; v2/v3 (the common case) have 2 cores
        return min(chips * 2, DEFAULT_TPU_ORDINALS)
    return chips or DEFAULT_TPU_ORDINALS


def _ordinals_of_type(accelerator: str) -> int | None:
    """'v3-8' -> 8 (cores), 'v4-8' -> 4 (v4 counts 2 cores per megacore chip), 'v5litepod-8' ->
    8 chips; one host holds at most 8 devices, more means a pod slice of several hosts."""
    match = re.fullmatch(r"v(\d+)[a-z]*-(\d+)", accelerator.strip().lower())
    if not match:
        return None
    generation, count = int(match.group(1)), int(match.group(2))
    devices = count // 2 if generation == 4 else count
    return max(1, min(devices, DEFAULT_TPU_ORDINALS))


def _positive(value: str | None) -> int | None:
    if value is None or not value.strip().isdigit():
        return None
    number = int(value)
    return number if number > 0 else None


def xla_runtime_initialized() -> bool:
    """Has this process already initialised the XLA runtime (used an XLA device)?

    The check torch_xla's own launcher makes before spawning, asked only when torch_xla is
    already imported: importing it here would be slow and could itself start a TPU client."""
    module = sys.modules.get("torch_xla")
    if module is None:
        return False
    check = getattr(getattr(module, "_XLAC", None), "_xla_runtime_is_initialized", None)
    return bool(check()) if callable(check) else False


def check_launch(
    target: XlaTarget, ordinals: int, num_nodes: int, max_restarts: int, precision: str | None
) -> None:
    """What an XLA launch supports, checked in the kernel before anything starts."""
    where = "on this TPU host" if target.tpu else "with PJRT_DEVICE=CPU"
    if num_nodes > 1:
        raise ValueError(
            f"num_nodes={num_nodes} {where}: nbtrain runs XLA on one host. For a multi-host TPU "
            "pod slice, run the script on every host with torch_xla's own launcher."
        )
    if max_restarts:
        raise ValueError(
            f"max_restarts={max_restarts} {where}: automatic restarts are not supported for XLA "
            "launches. Drop max_restarts and call notebook_launcher again to relaunch."
        )
    if precision == "fp16":
        raise ValueError(
            f"mixed_precision='fp16' {where}: XLA devices train in bfloat16. Pass "
            "mixed_precision='bf16'."
        )
    if target.tpu:
        every = default_ordinals(target)
        if ordinals not in (1, every):
            raise ValueError(
                f"num_processes={ordinals} {where}: torch_xla runs either one ordinal or every "
                f"TPU core ({every} here). Pass num_processes=None (all {every}) or 1."
            )
