"""One rank's ``RankSpec`` from where it runs: the one builder every backend uses (ranks on this
machine, the elastic agent's, warm ranks, ranks placed by Ray), so the environment a rank sees
(torchrun's variables, precision, Accelerate's CPU switch, its share of the cores) is decided
in one place."""

from __future__ import annotations

from collections.abc import Mapping

from nbtrain.kernel.config import LaunchConfig
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


__all__ = ["rank_spec"]
