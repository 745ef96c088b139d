"""Ranks on this machine: the plain launch kind (``num_processes >= 2``, or ``gpu_ids=``; one
node, no restarts).

``LocalRanks`` (the ``Launch`` of launch.py) opens the local rendezvous, describes each rank
(``rank_specs``, also used by the elastic agent and the warm ranks) and gives a ``run.Run`` a
``RankGroup`` of local processes to start and watch.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from nbtrain.kernel import environment
from nbtrain.kernel.config import LaunchConfig
from nbtrain.kernel.group import LocalProcesses, RankGroup
from nbtrain.kernel.payload import PreparedCall, prepare_call, released
from nbtrain.kernel.rankspec import rank_spec
from nbtrain.kernel.rendezvous import LocalRendezvous, open_local
from nbtrain.kernel.run import Run
from nbtrain.rank import rank_entry
from nbtrain.shared.options import StartMethod
from nbtrain.shared.specs import RankInfo, RankSpec

if TYPE_CHECKING:
    from nbtrain.kernel.launch import UserCall
    from nbtrain.kernel.options import LaunchOptions


class LocalRanks:
    """The launch kind (launch.py) of ranks in processes of this machine."""

    no_stop_resume = ""

    def check(self, options: LaunchOptions) -> None:
        pass  # config.py checked all it needs

    def run(self, options: LaunchOptions, call: UserCall) -> Any:
        __tracebackhide__ = True
        method = options.config.start.method
        return run_ranks(options.config, prepare_call(*call, method))


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
