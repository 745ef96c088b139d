"""``nbtrain env``: what this machine and Python offer, and what nbtrain would choose here.

Detection only, without side effects: CUDA is counted through NVML (no CUDA context, so a later
fork stays safe), torch_xla is looked up in the package metadata, never imported.
"""

from __future__ import annotations

import socket
import sys
from importlib import metadata

from nbtrain._version import __version__
from nbtrain.kernel.host import environment
from nbtrain.kernel.options.config import choose_start_method, default_num_processes

PACKAGES = ("cloudpickle", "ipywidgets", "torch_xla")
_WIDTH = 24  # label column


def report() -> str:
    sections = [
        ("Versions", _versions()),
        ("Devices", _devices()),
        ("Launching here", _launching()),
        ("Multi-node (num_nodes > 1)", _multi_node()),
    ]
    return "\n\n".join(
        f"{title}\n" + "\n".join(f"  {label:<{_WIDTH}}{value}" for label, value in rows)
        for title, rows in sections
    )


def _versions() -> list[tuple[str, str]]:
    import torch

    cuda = torch.version.cuda or torch.version.hip
    rows = [
        ("nbtrain", __version__),
        ("python", f"{sys.version.split()[0]} ({sys.executable})"),
        ("platform", environment.platform_summary()),
        ("torch", f"{torch.__version__} ({'CUDA ' + cuda if cuda else 'CPU-only build'})"),
    ]
    rows += [(name, _package_version(name)) for name in PACKAGES]
    return rows


def _package_version(name: str) -> str:
    try:
        return metadata.version(name.replace("_", "-"))
    except metadata.PackageNotFoundError:
        return "not installed"


def _devices() -> list[tuple[str, str]]:
    visible = environment.visible_devices()
    mask = "unset" if visible is None else repr(visible)
    gpus = environment.cuda_device_count()
    rows = [
        ("CUDA GPUs", f"{gpus} visible (CUDA_VISIBLE_DEVICES {mask}; counted without "
                      "initialising CUDA)"),
        *((f"GPU {index}", text) for index, text in environment.gpu_descriptions()),
        ("TPU", _tpu()),
        ("CPU cores", f"{environment.cpu_count()} usable by this process"),
    ]
    return rows


def _tpu() -> str:
    if not environment.tpu_host():
        return "none detected (no PJRT_DEVICE=TPU, TPU_* variables or /dev/accel0)"
    installed = _package_version("torch_xla")
    if installed == "not installed":
        return "TPU host detected, but torch_xla is not installed"
    return f"TPU host detected (torch_xla {installed})"


def _launching() -> list[tuple[str, str]]:
    uses_cuda = environment.cuda_device_count() > 0
    choice = choose_start_method("auto", uses_cuda)
    processes = default_num_processes(None)
    return [
        ("start methods", ", ".join(environment.available_start_methods())),
        ("start_method='auto'", choice.reason),
        ("num_processes=None", f"{processes} ({_why_processes(processes, uses_cuda)})"),
        ("frontend", _frontend()),
    ]


def _why_processes(count: int, uses_cuda: bool) -> str:
    if uses_cuda:
        return "one rank per visible GPU"
    if environment.tpu_host():
        return "a TPU host: 8 ranks"
    return "no GPU or TPU: one rank, in the calling process; pass num_processes=N for more"


def _frontend() -> str:
    kind = environment.frontend()
    where = []
    if environment.in_colab():
        where.append("Colab")
    if environment.in_kaggle():
        where.append("Kaggle")
    suffix = f" on {', '.join(where)}" if where else ""
    described = {
        environment.Frontend.JUPYTER: "a Jupyter kernel: live widgets",
        environment.Frontend.IPYTHON: "terminal IPython: text progress",
        environment.Frontend.PLAIN: "a plain Python process (script or command): text progress",
    }
    return described[kind] + suffix


def _multi_node() -> list[tuple[str, str]]:
    return [
        ("rendezvous", "torch elastic, c10d backend (DynamicRendezvousHandler, as torchrun "
                       "--rdzv-backend=c10d); node 0 hosts its store at rdzv_endpoint"),
        ("this node", _addresses()),
        ("ports", "rdzv_endpoint's port on node 0 is yours to choose (e.g. 29400, open to "
                  "the other nodes); the ranks' store port is picked by the OS on node 0 for "
                  "each attempt and shared through the rendezvous; MASTER_ADDR is the "
                  "endpoint's host"),
        ("node ranks", "node k gets global ranks k*P .. k*P+P-1 (P = num_processes)"),
    ]


def _addresses() -> str:
    hostname = socket.gethostname()
    resolved: list[str] = []
    try:
        for *_, sockaddr in socket.getaddrinfo(hostname, None, type=socket.SOCK_STREAM):
            if str(sockaddr[0]) not in resolved:
                resolved.append(str(sockaddr[0]))
    except OSError:
        pass
    text = f"hostname {hostname} resolves to {', '.join(resolved) or 'nothing'}"
    if resolved and all(address.startswith("127.") or address == "::1" for address in resolved):
        text += " (loopback only: other nodes cannot reach it by this name)"
    outward = _outward_address()
    if outward:
        host = f"[{outward}]" if ":" in outward else outward
        text += f"; outward address {outward} (as node 0: rdzv_endpoint='{host}:29400')"
    return text


def _outward_address() -> str | None:
    """The address this machine would use toward the outside world (no packet is sent)."""
    targets = ((socket.AF_INET, ("192.0.2.1", 9)), (socket.AF_INET6, ("2001:db8::1", 9)))
    for family, target in targets:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect(target)
                return str(probe.getsockname()[0])
        except OSError:
            continue
    return None
