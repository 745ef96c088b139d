"""One rank's ``RankSpec`` from where it runs: the one builder every backend uses (ranks on this
machine, the elastic agent's, warm ranks, ranks placed by Ray), so the environment a rank sees
(torchrun's variables, precision, Accelerate's CPU switch, its share of the cores) is decided
in one place. ``rank_specs``: every rank of one node (local ranks, the elastic agent's, warm
ranks)."""

from __future__ import annotations

from collections.abc import Mapping

from nbtrain.kernel.host import environment
from nbtrain.kernel.options.config import LaunchConfig
from nbtrain.kernel.specs.rendezvous import LocalRendezvous
from nbtrain.shared.options import StartMethod
from nbtrain.shared.specs import RankInfo, RankSpec


def rank_spec(
    config: LaunchConfig,
    info: RankInfo,
    *,
    rendezvous: Mapping[str, str],
    device: str,
    threads: int | None,
    finalizes: bool,
    kernel_env: dict[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> RankSpec:
    """``device``: the rank's torch device ("cpu" or "cuda:N"); ``threads``: its torch and
    OpenMP threads (None: left as the environment says); ``rendezvous``: MASTER_ADDR/PORT;
    ``extra_env``: what only this backend sets (CUDA_VISIBLE_DEVICES, a node's id)."""
    precision = config.mixed_precision.value if config.mixed_precision else None
    env = {
        "RANK": str(info.rank),
        "LOCAL_RANK": str(info.local_rank),
        "WORLD_SIZE": str(info.world_size),
        "LOCAL_WORLD_SIZE": str(info.local_world_size),
        "GROUP_RANK": str(info.node_rank),
        **rendezvous,
        **(extra_env or {}),
    }
    if precision:
        env["ACCELERATE_MIXED_PRECISION"] = precision  # honoured by HF Accelerate too
    if device == "cpu":
        # Accelerate (and Transformers' Trainer, through it) forms a CPU world only when
        # told to, as its own debug_launcher does; else every rank is "process 0 of 1".
        env["ACCELERATE_USE_CPU"] = "true"
    if threads is not None:
        # Said in the environment too, as torchrun does: libraries that read it (HF
        # Accelerate would otherwise set 1 and warn) keep the rank's share of the cores.
        env["OMP_NUM_THREADS"] = str(threads)
    return RankSpec(
        info=info,
        env=env,
        mixed_precision=precision,
        send_result=config.return_all or info.rank == 0,
        torch_threads=threads,
        device=device,
        kernel_env=kernel_env,
        finalizes=finalizes,
        stopping=config.stopping,
        debug=config.debug,
    )


def rank_specs(config: LaunchConfig, rendezvous: LocalRendezvous) -> dict[int, RankSpec]:
    local = config.num_processes
    threads = None
    if not environment.omp_threads_set():
        # Without this, N ranks each start one thread per core and fight over the cores.
        threads = max(1, environment.cpu_count() // local)
    gpus = environment.cuda_device_count() if config.gpu_ids is None else len(config.gpu_ids)
    extra = {}
    if config.gpu_ids is not None:
        extra["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in config.gpu_ids)
    kernel_env = current_environment(config)
    specs = {}
    for local_rank in range(local):
        rank = config.node_rank * local + local_rank
        info = RankInfo(
            rank, local_rank, config.world_size, local, config.node_rank, config.num_nodes
        )
        specs[rank] = rank_spec(
            config,
            info,
            rendezvous=rendezvous.env(),
            device=f"cuda:{local_rank}" if gpus else "cpu",
            threads=threads,
            # fork and forkserver children end in os._exit: no interpreter finalization.
            finalizes=config.start.method is StartMethod.SPAWN,
            kernel_env=kernel_env,
            extra_env=extra,
        )
    return specs


def current_environment(config: LaunchConfig) -> dict[str, str] | None:
    """What a rank must adopt as its environment (see worker.adopt_environment): only the
    forkserver's children would otherwise miss what changed since the server started."""
    if config.start.method is not StartMethod.FORKSERVER:
        return None
    return environment.snapshot()


__all__ = ["current_environment", "rank_spec", "rank_specs"]
