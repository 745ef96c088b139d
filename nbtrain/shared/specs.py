"""What the kernel decides for each rank (or XLA host process): plain frozen records, pickled
to the child under spawn/forkserver (the process targets are in ``nbtrain.rank``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from nbtrain.shared.stopping import StopPolicy


@dataclass(frozen=True)
class RankInfo:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int = 0
    num_nodes: int = 1


@dataclass(frozen=True)
class RankSpec:
    """Everything one rank needs to know, decided in the kernel."""

    info: RankInfo
    env: dict[str, str]
    mixed_precision: str | None = None
    send_result: bool = True
    torch_threads: int | None = None
    device: str = "cpu"
    close_fds: tuple[int, ...] = field(default=())
    kernel_env: dict[str, str] | None = None  # forkserver: the kernel's environment at launch
    finalizes: bool = True  # the process runs interpreter finalization at exit (spawn)
    stopping: StopPolicy | None = None  # checkpoint on interrupt, periodic saves, resume
    debug: bool = False  # a failure opens a post-mortem prompt before the rank exits


@dataclass(frozen=True)
class HostSpec:
    """What torch_xla's host process needs (kernel/launch/xla.py), decided in the kernel."""

    ordinals: int
    device: str  # PJRT device: "TPU" or "CPU"
    env: dict[str, str]
    mixed_precision: str | None = None
    return_all: bool = False
    close_fds: tuple[int, ...] = field(default=())
    kernel_env: dict[str, str] | None = None  # forkserver: the kernel's environment at launch
    counted: str = ""  # how the kernel arrived at ``ordinals`` (said if torch_xla disagrees)
