"""Ranks on this machine: the plain launch path (``num_processes >= 2``, one node, no restarts).

A strategy for ``run.Run``: it opens the local rendezvous, describes each rank (``rank_specs``,
also used by the elastic agent and the warm ranks) and gives the run a ``RankGroup`` of local
processes to start and watch.
"""

from __future__ import annotations

import functools
from typing import Any

from nbtrain.kernel import environment
from nbtrain.kernel.config import LaunchConfig
from nbtrain.kernel.group import LocalProcesses, RankGroup
from nbtrain.kernel.payload import PreparedCall, released
from nbtrain.kernel.rendezvous import LocalRendezvous, open_local
from nbtrain.kernel.run import Run
from nbtrain.rank import rank_entry
from nbtrain.shared.options import StartMethod
from nbtrain.shared.specs import RankInfo, RankSpec


def run_ranks(config: LaunchConfig, payload: bytes | PreparedCall) -> Any:
    __tracebackhide__ = True  # IPython shows the cell and the rank's traceback, not ours
    return released(payload, functools.partial(_run_ranks, config))


def _run_ranks(config: LaunchConfig, call: PreparedCall) -> Any:
    __tracebackhide__ = True
    rendezvous = open_local(config.world_size)
    specs = rank_specs(config, rendezvous)
    ranks = list(specs)
    title = f"{len(ranks)} ranks, {config.start.method.value}"
    if config.start.note:  # auto avoided fork: say why (and where CUDA was initialised)
        title += f" ({config.start.note})"
    run = Run(config, ranks, title=title)
    backend = LocalProcesses(
        config.start.method,
        rank_entry,
        specs,
        data=lambda rank: call.data,
        # big data into shared memory, said if it takes time
        before=lambda: call.commit(run.say, len(ranks)),
        release=rendezvous.close,
        debuggable=True,  # breakpoint() in a rank: a pdb prompt in the cell
        say=run.starting,
    )
    return run.finish(run.supervise(RankGroup(backend)))


def rank_specs(config: LaunchConfig, rendezvous: LocalRendezvous) -> dict[int, RankSpec]:
    local = config.num_processes
    threads = None
    if not environment.omp_threads_set():
        # Without this, N ranks each start one thread per core and fight over the cores.
        threads = max(1, environment.cpu_count() // local)
    precision = config.mixed_precision.value if config.mixed_precision else None
    gpus = environment.cuda_device_count() if config.gpu_ids is None else len(config.gpu_ids)
    kernel_env = current_environment(config)
    specs = {}
    for local_rank in range(local):
        rank = config.node_rank * local + local_rank
        env = {
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(config.world_size),
            "LOCAL_WORLD_SIZE": str(local),
            "GROUP_RANK": str(config.node_rank),
            **rendezvous.env(),
        }
        if config.gpu_ids is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in config.gpu_ids)
        if precision:
            env["ACCELERATE_MIXED_PRECISION"] = precision  # honoured by HF Accelerate too
        if not gpus:
            # Accelerate (and Transformers' Trainer, through it) forms a CPU world only when
            # told to, as its own debug_launcher does; else every rank is "process 0 of 1".
            env["ACCELERATE_USE_CPU"] = "true"
        if threads is not None:
            # Said in the environment too, as torchrun does: libraries that read it (HF
            # Accelerate would otherwise set 1 and warn) keep the rank's share of the cores.
            env["OMP_NUM_THREADS"] = str(threads)
        info = RankInfo(
            rank, local_rank, config.world_size, local, config.node_rank, config.num_nodes
        )
        specs[rank] = RankSpec(
            info=info,
            env=env,
            mixed_precision=precision,
            send_result=config.return_all or rank == 0,
            torch_threads=threads,
            device=f"cuda:{local_rank}" if gpus else "cpu",
            kernel_env=kernel_env,
            # fork and forkserver children end in os._exit: no interpreter finalization.
            finalizes=config.start.method is StartMethod.SPAWN,
            stopping=config.stopping,
        )
    return specs


def current_environment(config: LaunchConfig) -> dict[str, str] | None:
    """What a rank must adopt as its environment (see worker.adopt_environment): only the
    forkserver's children would otherwise miss what changed since the server started."""
    if config.start.method is not StartMethod.FORKSERVER:
        return None
    return environment.snapshot()
