"""notebook_launcher and debug_launcher: the public entry points of the kernel side.

Their parameters go into one ``options.Requested``, checked once (``check_options``: every
option, before anything starts), which also picks the launch kind (``launch.choose``): the
kernel's own process (inprocess.py), local ranks (local.py), torch_xla's host (xla.py), torch's
elastic agent (elastic/) or a Ray cluster (cluster/). The kind runs it; each feeds one
``run.Run``, which owns the lifecycle: view, interrupt, timeout, root cause, results.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from typing import Any

from nbtrain.kernel.host import cuda_origin, environment
from nbtrain.kernel.launch.choose import check_options
from nbtrain.kernel.launch.cluster.spec import RayCluster
from nbtrain.kernel.options.config import OutputMode, ProgressMode, check_function
from nbtrain.kernel.options.interface import UserCall
from nbtrain.kernel.options.requested import Requested
from nbtrain.kernel.options.stopping import StopOptions
from nbtrain.kernel.run import handle
from nbtrain.kernel.run.handle import check_background


def notebook_launcher(
    function: Callable[..., Any],
    args: tuple = (),
    kwargs: dict[str, Any] | None = None,
    num_processes: int | None = None,
    *,
    start_method: str = "auto",
    mixed_precision: str | None = None,
    gpu_ids: list[int] | None = None,
    num_nodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    max_restarts: int = 0,
    timeout: float | None = None,
    hang_after: float | None = 300.0,
    output: str = "all",
    progress: str = "auto",
    return_all: bool = False,
    rdzv_timeout: float = 900.0,
    on_interrupt: str = "stop",
    checkpoint_every: int | str | datetime.timedelta | None = None,
    resume: bool | str = False,
    resume_from: str | os.PathLike[str] | None = None,
    project_dir: str | os.PathLike[str] | None = None,
    total_limit: int | None = 3,
    cluster: str | RayCluster | None = None,
    debug: bool = False,
    use_port: str | int | None = None,
    master_addr: str | None = None,
    rdzv_backend: str = "static",
    rdzv_conf: dict[str, Any] | None = None,
    rdzv_id: str = "none",
    monitor_interval: float = 0.1,
    log_line_prefix_template: str | None = None,
    block: bool = True,
) -> Any:
    """Run ``function(*args, **kwargs)`` on ``num_processes`` ranks and return rank 0's value
    (on a node of a multi-node launch: its first rank's; ``return_all``: its ranks' values).

    ``hang_after``: when no rank has made progress for that many seconds (paused-in-pdb time
    not counted), the cell shows where each rank is, once, and the run goes on
    (notebooks/guides/debugging.md); None turns it off.

    Stop and resume (notebooks/guides/stop-and-resume.md): ``on_interrupt="checkpoint"`` makes
    the first interrupt save a checkpoint at the next optimizer step and stop;
    ``checkpoint_every`` saves periodically (optimizer steps, or a duration like ``"10min"``);
    ``resume=True`` has ``prepare()`` load the newest one. Checkpoints go to
    ``<project_dir>/checkpoints/checkpoint_<n>`` (default project_dir:
    ``nbtrain-runs/<function name>``), the newest ``total_limit`` kept.

    ``cluster="ray"`` (or ``nbtrain.RayCluster(...)``): the ranks are placed on the Ray cluster
    this kernel is connected to (``ray.init(...)`` first); see notebooks/guides/cluster.md.

    ``debug=True``: a failed rank stays alive (the others are stopped) and opens a
    ``(Pdb) rank N>`` prompt at its failing frame before the error is raised (post-mortem, see
    notebooks/guides/debugging.md); it needs an input box or a terminal.

    Accelerate's other parameters (notebooks/guides/launching.md): ``use_port`` and
    ``master_addr`` name node 0 when ``num_nodes > 1`` and no ``rdzv_endpoint`` is given (one
    node needs no port: its ranks meet on one the OS picks); ``rdzv_backend`` 'static' or
    'c10d'; ``rdzv_conf`` its join timeout and rank; ``rdzv_id`` and ``monitor_interval`` are
    checked and need nothing more (a rendezvous per launch; failures noticed at once);
    ``log_line_prefix_template`` is refused (nbtrain labels each rank's lines itself).

    ``block=False``: return an ``nbtrain.Run`` at once while the ranks train in the
    background; the cell shows the live view, other cells run meanwhile, and
    ``run.wait()`` gives the value or raises what a blocking launch raises
    (notebooks/guides/long-runs.md).

    The full contract: notebooks/guides/launching.md. Every argument is checked before anything
    starts.
    """
    # IPython (and pytest) hide frames that set this: a failure shows the cell and the
    # rank's own traceback, not the launcher's internals.
    __tracebackhide__ = True
    args, kwargs = check_function(function, args, kwargs)
    stop = StopOptions(
        on_interrupt=on_interrupt,
        checkpoint_every=checkpoint_every,
        resume=resume,
        resume_from=resume_from,
        project_dir=project_dir,
        total_limit=total_limit,
    )
    requested = Requested(
        num_processes=num_processes,
        start_method=start_method,
        mixed_precision=mixed_precision,
        gpu_ids=gpu_ids,
        num_nodes=num_nodes,
        node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint,
        max_restarts=max_restarts,
        timeout=timeout,
        hang_after=hang_after,
        output=output,
        progress=progress,
        return_all=return_all,
        rdzv_timeout=rdzv_timeout,
        stop=stop,
        cluster=cluster,
        debug=debug,
        use_port=use_port,
        master_addr=master_addr,
        rdzv_backend=rdzv_backend,
        rdzv_conf=rdzv_conf,
        rdzv_id=rdzv_id,
        monitor_interval=monitor_interval,
        log_line_prefix_template=log_line_prefix_template,
    )
    options = check_options(requested, getattr(function, "__name__", "run"))
    check_background(options, block)
    return handle.launch(options, UserCall(function, args, kwargs), block=block)


def debug_launcher(function: Callable[..., Any], args: tuple = (), num_processes: int = 2) -> Any:
    """CPU-only launch for debugging distributed code on a laptop (as in Accelerate)."""
    __tracebackhide__ = True
    args, kwargs = check_function(function, args, None)
    requested = Requested(num_processes=num_processes)
    # CPU only, even on a TPU host: in process, or local ranks
    options = check_options(requested, getattr(function, "__name__", "run"), allow_xla=False)
    with environment.gpus_hidden():  # the ranks see no GPU (they inherit the environment)
        return options.launch.run(options, UserCall(function, args, kwargs))


# From here on, the line of the notebook that first initialises CUDA is noted (cuda_origin).
cuda_origin.watch()


__all__ = ["OutputMode", "ProgressMode", "debug_launcher", "notebook_launcher"]
