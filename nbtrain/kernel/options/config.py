"""Launch options as typed, validated, frozen values (the kernel side's validator).

Every check runs in the kernel before any process starts; each error names the argument, the
value it got, and what to pass instead.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from nbtrain.kernel.host import cuda_origin, environment
from nbtrain.kernel.options.names import hint, setting
from nbtrain.shared import tpu
from nbtrain.shared.options import (
    MixedPrecision,
    OutputMode,
    ProgressMode,
    StartMethod,
    parse_mixed_precision,
)
from nbtrain.shared.stopping import StopPolicy


@dataclass(frozen=True)
class StartChoice:
    method: StartMethod
    reason: str
    note: str = ""  # what the run's title adds: why auto did not fork, when CUDA forbade it


@dataclass(frozen=True)
class LaunchConfig:
    num_processes: int
    start: StartChoice
    mixed_precision: MixedPrecision | None
    gpu_ids: tuple[int, ...] | None
    num_nodes: int
    node_rank: int
    rdzv_endpoint: str | None
    max_restarts: int
    timeout: float | None
    output: OutputMode
    progress: ProgressMode
    return_all: bool
    rdzv_timeout: float = 900.0  # seconds each node waits for the others at a rendezvous
    xla_device: str = ""  # "TPU" or "CPU": XLA ordinals run by torch_xla (kernel/launch/xla.py)
    xla_counted: str = ""  # how num_processes was counted for XLA (tpu.check_launch), in words
    stopping: StopPolicy | None = None  # on_interrupt / checkpoint_every / resume (stopping.py)
    debug: bool = False  # a failed rank opens a post-mortem prompt first (postmortem.py)
    hang_after: float | None = 300.0  # no progress for this long: show where each rank is

    @property
    def world_size(self) -> int:
        return self.num_processes * self.num_nodes

    @property
    def multi_node(self) -> bool:
        return self.num_nodes > 1


def choice(name: str, value: object, enum: type[Enum]) -> Any:
    allowed = ", ".join(repr(member.value) for member in enum)
    if not isinstance(value, str):
        raise TypeError(f"{name}={value!r} must be a string, one of {allowed}.")
    try:
        return enum(value.lower())
    except ValueError:
        raise ValueError(
            f"{name}={value!r} is not a valid choice: pass one of {allowed}."
        ) from None


def whole(name: str, value: object, minimum: int, fix: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{setting(name, value)} must be a whole number >= {minimum}.{fix}")
    if value < minimum:
        raise ValueError(f"{setting(name, value)} must be >= {minimum}.{fix}")
    return int(value)


def _check_gpu_ids(gpu_ids: object) -> tuple[int, ...] | None:
    if gpu_ids is None:
        return None
    if isinstance(gpu_ids, str):
        gpu_ids = [part for part in gpu_ids.split(",") if part.strip()]
        try:
            gpu_ids = [int(part) for part in gpu_ids]
        except ValueError:
            raise ValueError(
                f"gpu_ids={gpu_ids!r} must list GPU indices, e.g. gpu_ids=[0, 2]."
            ) from None
    if not isinstance(gpu_ids, Sequence) or not gpu_ids:
        raise TypeError(
            f"gpu_ids={gpu_ids!r} must be a non-empty list of GPU indices, e.g. [0, 2]."
        )
    ids = tuple(whole("gpu_ids entry", value, 0) for value in gpu_ids)
    if len(set(ids)) != len(ids):
        raise ValueError(f"gpu_ids={list(ids)!r} names a GPU twice: list each GPU once.")
    visible = environment.cuda_device_count()
    if visible == 0:
        raise ValueError(
            f"gpu_ids={list(ids)!r} but no CUDA GPU is visible to this process. Drop gpu_ids "
            "to train on CPU, or check CUDA_VISIBLE_DEVICES and the driver (nbtrain env)."
        )
    if max(ids) >= visible:
        raise ValueError(
            f"gpu_ids={list(ids)!r} names GPU {max(ids)} but only {visible} GPU(s) are visible "
            f"(indices 0..{visible - 1})."
        )
    return ids


def _check_endpoint(endpoint: object) -> str:
    if not isinstance(endpoint, str) or not re.fullmatch(r"\[?[\w.\-:]+\]?:\d{1,5}", endpoint):
        raise ValueError(
            f"rdzv_endpoint={endpoint!r} must be 'HOST:PORT' of node 0, reachable from every node, "
            "e.g. rdzv_endpoint='10.0.0.1:29400'."
        )
    port = int(endpoint.rsplit(":", 1)[1])
    if not 0 < port < 65536:
        raise ValueError(f"rdzv_endpoint={endpoint!r} has port {port}: use a port in 1..65535.")
    return endpoint


def _check_timeout(timeout: object) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout={timeout!r} must be a number of seconds or None.")
    seconds = float(timeout)
    if not seconds > 0:
        raise ValueError(f"timeout={timeout!r} must be > 0 seconds, or None for no limit.")
    return seconds


def _check_hang_after(hang_after: object) -> float | None:
    if hang_after is None:
        return None
    fix = "give the seconds without progress from any rank after which the run shows where " \
        "each rank is (default 300)" + hint(
            ", or hang_after=None to turn hang detection off", ", or 0 to turn it off")
    if isinstance(hang_after, bool) or not isinstance(hang_after, numbers.Real):
        raise TypeError(f"{setting('hang_after', hang_after)} is not a number of seconds: {fix}.")
    seconds = float(hang_after)
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"{setting('hang_after', hang_after)} must be > 0 and finite: {fix}.")
    return seconds


def _check_rdzv_timeout(rdzv_timeout: object) -> float:
    if isinstance(rdzv_timeout, bool) or not isinstance(rdzv_timeout, numbers.Real):
        raise TypeError(
            f"rdzv_timeout={rdzv_timeout!r} must be a number of seconds, e.g. rdzv_timeout=900."
        )
    seconds = float(rdzv_timeout)
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(
            f"rdzv_timeout={rdzv_timeout!r} must be a finite number of seconds > 0: how long a "
            "node waits for the other nodes to join, e.g. rdzv_timeout=900."
        )
    return seconds


def default_num_processes(
    gpu_ids: tuple[int, ...] | None, xla: tpu.XlaTarget | None = None
) -> int:
    """API.md: all visible GPUs, else every XLA ordinal (8 on a v2-8/v3-8 TPU host), else 1."""
    if gpu_ids is not None:
        return len(gpu_ids)
    if xla is not None and xla.xla:
        return tpu.default_ordinals(xla, environment.variables())
    gpus = environment.cuda_device_count()
    if gpus:
        return gpus
    if environment.tpu_host():
        return 8
    return 1


def choose_start_method(requested: object, uses_cuda: bool) -> StartChoice:
    """Resolve 'auto' and check an explicit choice against this platform and this kernel."""
    cuda_origin.watch()  # torch may have been imported after nbtrain: note CUDA's first use
    method = choice("start_method", requested, _StartMethodOrAuto)
    available = environment.available_start_methods()
    if method is not _StartMethodOrAuto.AUTO:
        chosen = StartMethod(method.value)
        if chosen.value not in available:
            raise ValueError(
                f"start_method={method.value!r} is not available on this platform (available: "
                f"{', '.join(available)}). Use start_method='auto'."
            )
        if chosen is StartMethod.FORK and uses_cuda and environment.fork_poisons_cuda():
            raise ValueError(
                "start_method='fork' cannot be used: this kernel has already initialised CUDA, "
                "and forked ranks could not use the GPU. Pass start_method='forkserver' (clean "
                "ranks, no kernel restart needed), or 'auto'. " + cuda_origin.explain()
            )
        return StartChoice(chosen, f"{chosen.value}: requested")
    if "fork" in available:
        if not (uses_cuda and environment.fork_poisons_cuda()):
            return StartChoice(
                StartMethod.FORK,
                "fork: fastest start, and this process has not initialised CUDA, so forked "
                "ranks are safe",
            )
        if "forkserver" in available:
            return StartChoice(
                StartMethod.FORKSERVER,
                "forkserver: this process already initialised CUDA, so fork is unsafe; the "
                "forkserver gives clean ranks at nearly fork speed once warm. "
                + cuda_origin.explain(),
                note="not fork: " + cuda_origin.explain(),
            )
    return StartChoice(StartMethod.SPAWN, "spawn: the only start method on this platform")


class _StartMethodOrAuto(Enum):
    AUTO = "auto"
    FORK = "fork"
    FORKSERVER = "forkserver"
    SPAWN = "spawn"


def build_config(
    *,
    num_processes: object,
    start_method: object,
    mixed_precision: object,
    gpu_ids: object,
    num_nodes: object,
    node_rank: object,
    rdzv_endpoint: object,
    max_restarts: object,
    timeout: object,
    output: object,
    progress: object,
    return_all: object,
    rdzv_timeout: object = 900.0,
    allow_xla: bool = True,
    hang_after: object = 300.0,
) -> LaunchConfig:
    output_mode = choice("output", output, OutputMode)
    progress_mode = choice("progress", progress, ProgressMode)
    precision = _check_precision(mixed_precision)
    if not isinstance(return_all, bool):
        raise TypeError(f"return_all={return_all!r} must be True or False.")
    nodes, rank_of_node, endpoint = _check_nodes(num_nodes, node_rank, rdzv_endpoint)
    restarts = whole("max_restarts", max_restarts, 0)
    ids = _check_gpu_ids(gpu_ids)
    xla = _xla_target(allow_xla, ids)
    processes = _check_num_processes(num_processes, ids, xla)
    start = _start_for(start_method, ids, xla)
    counted = _xla_counted(xla, processes, nodes, restarts, precision)
    return LaunchConfig(
        num_processes=processes,
        start=start,
        mixed_precision=precision,
        gpu_ids=ids,
        num_nodes=nodes,
        node_rank=rank_of_node,
        rdzv_endpoint=endpoint,
        max_restarts=restarts,
        timeout=_check_timeout(timeout),
        hang_after=_check_hang_after(hang_after),
        output=output_mode,
        progress=progress_mode,
        return_all=return_all,
        rdzv_timeout=_check_rdzv_timeout(rdzv_timeout),
        xla_device=xla.device if xla is not None else "",
        xla_counted=counted,
    )


def _check_precision(mixed_precision: object) -> MixedPrecision | None:
    """The Accelerator's parser: the same message for 'fp8' from either."""
    if mixed_precision is None:
        return None
    return parse_mixed_precision(mixed_precision, setting("mixed_precision", mixed_precision))


def _xla_counted(
    xla: tpu.XlaTarget | None, processes: int, nodes: int, restarts: int,
    precision: MixedPrecision | None,
) -> str:
    """An XLA launch's checks (shared/tpu.py); what they counted, for the view."""
    if xla is None:
        return ""
    mode = precision.value if precision else None
    return tpu.check_launch(xla, processes, nodes, restarts, mode, environment.variables())


def _check_nodes(
    num_nodes: object, node_rank: object, rdzv_endpoint: object
) -> tuple[int, int, str | None]:
    """num_nodes, node_rank and rdzv_endpoint, checked together."""
    nodes = whole("num_nodes", num_nodes, 1)
    rank_of_node = whole("node_rank", node_rank, 0)
    if rank_of_node >= nodes:
        raise ValueError(
            f"node_rank={rank_of_node} must be below num_nodes={nodes}: "
            f"number the nodes 0..{nodes - 1}."
        )
    if nodes == 1 and rdzv_endpoint is None:
        return nodes, rank_of_node, None
    if rdzv_endpoint is None:
        raise ValueError(
            f"num_nodes={nodes} needs rdzv_endpoint='HOST:PORT' (node 0's address, the same "
            "on every node)."
        )
    return nodes, rank_of_node, _check_endpoint(rdzv_endpoint)


def _check_num_processes(
    num_processes: object, ids: tuple[int, ...] | None, xla: tpu.XlaTarget | None
) -> int:
    """num_processes (None: one rank per visible GPU, 8 on a TPU host, else 1), checked
    against gpu_ids."""
    if num_processes is None:
        processes = default_num_processes(ids, xla)
    else:
        processes = whole("num_processes", num_processes, 1, hint(
            " Use None for one rank per visible GPU.",
            " Leave --num-processes out for the default: one rank per visible GPU, 8 on a TPU"
            " host, else 1.",
        ))
    if ids is not None and processes > len(ids):
        raise ValueError(
            f"num_processes={processes} but gpu_ids={list(ids)!r} lists {len(ids)} GPU(s): "
            "give one GPU per rank, or lower num_processes."
        )
    return processes


def _start_for(
    start_method: object, ids: tuple[int, ...] | None, xla: tpu.XlaTarget | None
) -> StartChoice:
    """How the ranks start, checked against what torch_xla needs."""
    uses_cuda = ids is not None or environment.cuda_device_count() > 0
    start = choose_start_method(start_method, uses_cuda)
    clean = "forkserver" in environment.available_start_methods()
    if xla is not None and start_method == "auto" and clean:
        # A kernel that already ran autograd (any backward()) forks children whose autograd
        # engine cannot serve XLA devices (an internal assert in backward): start the XLA host
        # from the forkserver, a clean process that is warm after the first launch.
        start = StartChoice(StartMethod.FORKSERVER, "forkserver: XLA host from a clean process")
    _check_xla_runtime(start, xla)
    return start


def _xla_target(allow: bool, gpu_ids: tuple[int, ...] | None) -> tpu.XlaTarget | None:
    """The XLA target when this launch goes through torch_xla (a TPU host, or PJRT_DEVICE=CPU,
    with torch_xla installed), else None."""
    if not allow or gpu_ids is not None:
        return None
    target = tpu.detect(environment.variables())
    return target if target.xla and tpu.torch_xla_installed() else None


def _check_xla_runtime(start: StartChoice, xla: tpu.XlaTarget | None) -> None:
    """torch_xla's own pre-launch check, made in the kernel with a fix: a runtime initialised
    here breaks forked children always, and holds the TPU against any new process."""
    if not tpu.xla_runtime_initialized():
        return
    on_tpu = xla is not None and xla.tpu
    if start.method is not StartMethod.FORK and not on_tpu:
        return
    fix = (
        "Restart the runtime (kernel) and create models and tensors on the XLA device only "
        "inside the function you launch (Accelerator().device, or torch_xla.device() there)."
    )
    if not on_tpu:
        fix += " Or pass start_method='spawn' to start the ranks from a clean interpreter."
    why = "the kernel holds the TPU" if on_tpu else "forked ranks would inherit a broken runtime"
    raise ValueError(
        "The XLA runtime is already initialised in this kernel (an XLA device was used in a "
        f"cell, e.g. torch_xla.device() or xm.xla_device()), so the launch cannot use it: {why}. "
        + fix
    )
