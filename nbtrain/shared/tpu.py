"""Is this a TPU host (or an explicit XLA:CPU run), and how many XLA ordinals does it offer?

Facts only: environment variables (passed in: the kernel's environment module reads them) and
device files, never an import of torch_xla (importing it is harmless, but *using* it initialises the
XLA runtime in the kernel, after which torch_xla refuses to launch). Everything takes its inputs as
parameters, so each hosting environment is testable on any machine.

What the environments set (as documented by Google / observed in their images):
- Cloud TPU VMs (also Colab's and Kaggle's current TPU runtimes): TPU chips as /dev/accel* (v2-v4)
  or VFIO devices /dev/vfio/<n> (v5e and later); libtpu installed; often TPU_ACCELERATOR_TYPE
  (e.g. "v3-8"), TPU_WORKER_ID, TPU_CHIPS_PER_HOST_BOUNDS, TPU_SKIP_MDS_QUERY.
- Colab's legacy TPU-node runtime: COLAB_TPU_ADDR (the TPU is remote, no device file).
- Kaggle TPU VMs: KAGGLE_URL_BASE / KAGGLE_KERNEL_RUN_TYPE plus the TPU VM markers above (no
  TPU_NAME: acc #2893).
- PJRT_DEVICE: torch_xla's own switch; "TPU" declares a TPU, "CPU" runs the XLA path on the CPU
  (CPU_NUM_DEVICES ordinals), which is how nbtrain's XLA path is tested without a TPU.

How many ordinals torch_xla 2.9 starts on a TPU host (torch_xla/_internal/tpu.py and pjrt.py): one
process per TPU chip found on the PCI bus (Google's vendor id and a TPU device id), at most
TPU_PROCESS_BOUNDS' product of processes, each driving its chip's devices: 2 TensorCores per chip
on v2/v3, 1 (a megacore) from v4 on. ``count_ordinals`` follows that, reading the TPU generation
from TPU_ACCELERATOR_TYPE or the chips' PCI device ids. torch_xla's count is checked again in the
host process once its runtime has started (xla_host.py), so a wrong guess fails fast, by name.
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
    environ: Mapping[str, str], root: str | os.PathLike[str] = "/"
) -> XlaTarget:
    env = environ
    explicit = env.get("PJRT_DEVICE", "").strip().upper()
    if explicit == "CPU":
        return XlaTarget(Host.XLA_CPU, "CPU", "PJRT_DEVICE=CPU: the XLA path on the CPU")
    markers = [name for name in TPU_VARIABLES if env.get(name)]
    files = tpu_device_files(root)
    pci = tpu_pci_chips(root)
    if explicit != "TPU" and not markers and not files and not pci:
        return XlaTarget(Host.NONE, "", "no TPU chips, device files or TPU runtime variables")
    evidence = (
        ["PJRT_DEVICE=TPU"] * (explicit == "TPU")
        + markers
        + [f"device {f}" for f in files[:2]]
        + [f"{len(pci)} TPU chip(s) on the PCI bus"] * bool(pci)
    )
    if "COLAB_RELEASE_TAG" in env or "COLAB_TPU_ADDR" in env or "COLAB_GPU" in env:
        host = Host.COLAB
    elif "KAGGLE_KERNEL_RUN_TYPE" in env or "KAGGLE_URL_BASE" in env:
        host = Host.KAGGLE
    else:
        host = Host.TPU_VM
    return XlaTarget(host, "TPU", f"TPU on {host.value}: " + ", ".join(evidence))


def libtpu_installed(environ: Mapping[str, str]) -> bool:
    """Can torch_xla load libtpu here? Its own order: $TPU_LIBRARY_PATH, the libtpu.so bundled in
    torch_xla/lib, the ``libtpu`` package (what ``pip install 'torch_xla[tpu]'`` brings).

    Not evidence of a TPU (pip installs libtpu on any machine): a launch precondition. Without
    it, torch_xla cannot open the TPU and every ordinal would fail at start-up."""
    env = environ
    if env.get("TPU_LIBRARY_PATH"):
        return True
    torch_xla_dir = _package_dir("torch_xla")
    if torch_xla_dir is not None and (torch_xla_dir / "lib" / "libtpu.so").is_file():
        return True
    return _package_dir("libtpu") is not None


def _package_dir(name: str) -> Path | None:
    """Where an installed package lives, without importing it (a module already imported, even
    a stand-in without a spec, answers from its __file__)."""
    module = sys.modules.get(name)
    if module is not None:
        origin = getattr(module, "__file__", None)
        return Path(origin).parent if origin else None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def torch_xla_installed() -> bool:
    return "torch_xla" in sys.modules or importlib.util.find_spec("torch_xla") is not None


@dataclass(frozen=True)
class OrdinalCount:
    """How many ordinals torch_xla would start on this host, and what the count rests on."""

    count: int
    source: str


def default_ordinals(
    target: XlaTarget, environ: Mapping[str, str], root: str | os.PathLike[str] = "/"
) -> int:
    """All the devices torch_xla would use on this host (what xmp.spawn's nprocs=None means)."""
    return count_ordinals(target, environ, root).count


def count_ordinals(
    target: XlaTarget, environ: Mapping[str, str], root: str | os.PathLike[str] = "/"
) -> OrdinalCount:
    env = environ
    if target.device == "CPU":
        devices = _positive(env.get("CPU_NUM_DEVICES"))
        return OrdinalCount(devices or 1, f"CPU_NUM_DEVICES={devices}" if devices else "default")
    accelerator = env.get("TPU_ACCELERATOR_TYPE", "").strip()
    chips, found, generation = _local_chips(accelerator, root)
    if chips:
        bounds = _bounds_size(env.get("TPU_PROCESS_BOUNDS"))
        if bounds is not None and bounds < chips:  # torch_xla starts no more processes
            chips, found = bounds, f"TPU_PROCESS_BOUNDS={env['TPU_PROCESS_BOUNDS']}"
        # No generation known (no TPU_ACCELERATOR_TYPE, no PCI ids, /dev/accel* files): most
        # likely the v2-8/v3-8 of Colab and Kaggle, with 2 cores per chip.
        cores = 2 if generation is None or generation <= 3 else 1
        what = f"v{generation}" if generation else "generation unknown, taken for v2/v3"
        return OrdinalCount(chips * cores, f"{chips} {found} x {cores} core(s) ({what})")
    from_type = _ordinals_of_type(accelerator)
    if from_type:
        return OrdinalCount(from_type, f"TPU_ACCELERATOR_TYPE={accelerator}")
    return OrdinalCount(
        DEFAULT_TPU_ORDINALS, "no chips or TPU type visible: assumed a v2-8/v3-8 (8 cores)"
    )


def _local_chips(accelerator: str, root: str | os.PathLike[str]) -> tuple[int, str, int | None]:
    """(chips, where they were found, TPU generation if known): the PCI bus first, as torch_xla
    counts, else the device files."""
    pci = tpu_pci_chips(root)
    generation = generation_of_type(accelerator) or _generation_of_pci(pci)
    if pci:
        return len(pci), "TPU chips on the PCI bus", generation
    accel = len(list((Path(root) / "dev").glob("accel[0-9]*")))
    if accel:
        return accel, "/dev/accel* chips", generation
    vfio = len(tpu_device_files(root))
    # VFIO chips are v5e and later, one device each, whatever the exact generation.
    return vfio, "/dev/vfio chips", generation or (5 if vfio else None)


# torch_xla 2.9's list (torch_xla/_internal/tpu.py): Google's PCI vendor id, and the device ids
# of TPU chips with the generation each one is.
GOOGLE_PCI_VENDOR = "0x1ae0"
TPU_PCI_DEVICES = {
    "0x0027": 3,  # v2 and v3: both have 2 TensorCores per chip, so v3 stands for either
    "0x005e": 4,
    "0x0063": 5,  # v5e
    "0x006f": 6,  # v6e
    "0x0076": 7,
    "0x0056": None,  # testing chips in torch_xla's list: a TPU, generation unknown
    "0x0062": None,
}


def tpu_pci_chips(root: str | os.PathLike[str] = "/") -> list[str]:
    """PCI device ids of the TPU chips under ``root``/sys/bus/pci/devices (torch_xla's count)."""
    found = []
    for vendor in sorted((Path(root) / "sys" / "bus" / "pci" / "devices").glob("*/vendor")):
        try:
            if vendor.read_text().strip() != GOOGLE_PCI_VENDOR:
                continue
            device = (vendor.parent / "device").read_text().strip()
        except OSError:
            continue
        if device in TPU_PCI_DEVICES:
            found.append(device)
    return found


def _generation_of_pci(devices: list[str]) -> int | None:
    generations = {TPU_PCI_DEVICES[device] for device in devices} - {None}
    return generations.pop() if len(generations) == 1 else None


def generation_of_type(accelerator: str) -> int | None:
    """'v3-8' -> 3, 'v5litepod-16' -> 5, 'tpu7x-8' -> 7 (torch_xla parses it the same way)."""
    match = _TYPE.fullmatch(accelerator.strip().lower())
    return int(match.group(1)) if match else None


_TYPE = re.compile(r"(?:v|tpu)(\d+)([a-z]*)-(\d+)")


def _ordinals_of_type(accelerator: str) -> int | None:
    """The devices of one host of this TPU type, when no chip is visible (e.g. a remote TPU).

    The number in the type counts TensorCores up to v4 and on v5p ('v3-8': 4 chips x 2 cores,
    8 devices; 'v4-8' and 'v5p-8': 4 megacore chips, 4 devices), and chips on v5e/v6e
    ('v5litepod-8': 8 devices). A host holds 4 chips (8 on single-host v5e/v6e slices); more
    means a pod slice of several hosts, of which this is one. Unknown families: None."""
    match = _TYPE.fullmatch(accelerator.strip().lower())
    if not match:
        return None
    generation, variant, count = int(match.group(1)), match.group(2), int(match.group(3))
    if generation <= 3:
        return max(1, min(count, 8))  # 2 cores per chip, 4 chips per host
    if generation == 4 or (generation == 5 and variant == "p"):
        return max(1, min(count // 2, 4))  # one device per 2-core megacore chip
    if generation in (5, 6) and variant in ("e", "lite", "litepod"):
        return count if count <= 8 else 4
    return None


def _bounds_size(value: str | None) -> int | None:
    """'2,2,1' -> 4 (torch_xla's MeshShape); None when unset or not a mesh."""
    if not value:
        return None
    try:
        dims = [int(part) for part in value.split(",")]
    except ValueError:
        return None
    size = 1
    for dim in dims:
        size *= dim
    return size if size > 0 else None


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
    target: XlaTarget,
    ordinals: int,
    num_nodes: int,
    max_restarts: int,
    precision: str | None,
    environ: Mapping[str, str],
) -> str:
    """What an XLA launch supports, checked in the kernel before anything starts. Returns how
    the kernel arrived at ``ordinals``, in words (the XLA host says them if torch_xla starts
    another number), so the launch does not detect and count the TPU chips again."""
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
    if target.tpu and not libtpu_installed(environ):
        raise ValueError(
            "This TPU host has no libtpu for torch_xla (no TPU_LIBRARY_PATH, no libtpu.so in "
            "torch_xla/lib, no libtpu package), so torch_xla cannot open the TPU. Install it "
            "with pip install 'torch_xla[tpu]' (matching torch_xla's version), or set "
            "PJRT_DEVICE=CPU to run the XLA path on the CPU."
        )
    if ordinals == 1:
        return "num_processes=1"
    if not target.tpu:
        return f"CPU_NUM_DEVICES={ordinals}, from num_processes"
    every = count_ordinals(target, environ)
    if ordinals != every.count:
        raise ValueError(
            f"num_processes={ordinals} {where}: torch_xla runs either one ordinal or every "
            f"TPU core ({every.count} here). Pass num_processes=None (all {every.count}) or 1."
        )
    return every.source
