"""notebook_launcher and debug_launcher: the public entry points of the kernel side.

Their parameters go into one ``options.Requested``, checked once (``build_launch``: every
option, before anything starts), which also picks the launch kind (``launch.choose``) and builds
it with them: the kernel's own process (inprocess.py), local ranks (local.py), torch_xla's host
(xla.py), torch's elastic agent (elastic/) or a Ray cluster (cluster/). The kind runs the call;
each feeds one ``run.Run``, which owns the lifecycle: view, interrupt, timeout, root cause,
results.
"""

from __future__ import annotations

import datetime
import inspect
import os
from collections.abc import Callable
from typing import Any

from nbtrain.kernel.host import cuda_origin, environment
from nbtrain.kernel.launch.choose import build_launch
from nbtrain.kernel.launch.cluster.spec import RayCluster
from nbtrain.kernel.options.config import OutputMode, ProgressMode
from nbtrain.kernel.options.function import check_function
from nbtrain.kernel.options.interface import UserCall
from nbtrain.kernel.options.requested import Requested
from nbtrain.kernel.run import registry, tracebacks
from nbtrain.kernel.run.registry import check_background


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

    :param function: any callable (a notebook's function, lambda, closure or class too): each
        rank calls ``function(*args, **kwargs)``.
    :param args: positional arguments (big tensors travel by shared memory, not copied).
    :param kwargs: keyword arguments.
    :param num_processes: how many ranks (per node); None: one per visible GPU, else 8 on a
        TPU host, else 1. One rank runs ``function`` in this process.
    :param start_method: ``"auto"`` (fork when it is safe, else forkserver), ``"fork"``,
        ``"forkserver"`` or ``"spawn"``.
    :param mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"``: the default of every
        ``Accelerator`` the ranks make (None: full precision).
    :param gpu_ids: which GPUs the ranks use, e.g. ``[0, 2]`` (their CUDA_VISIBLE_DEVICES).
    :param num_nodes: how many machines run ``num_processes`` ranks each (torch's rendezvous).
    :param node_rank: this machine's number among them (0: the one others meet at).
    :param rdzv_endpoint: ``"host:port"`` of node 0, for ``num_nodes > 1``.
    :param max_restarts: how many times a failed launch starts again (all ranks), through
        torch's elastic agent or on a cluster; a rank can resume from its last checkpoint.
    :param timeout: seconds the run may take; then every rank is stopped and ``TimeoutError``
        says where each one was.
    :param hang_after: see above.
    :param output: whose prints reach the cell: ``"all"`` ranks (each line labelled),
        ``"main"`` (rank 0) or ``"none"``.
    :param progress: the live view: ``"auto"`` (widgets in Jupyter, text elsewhere),
        ``"widgets"``, ``"text"`` or ``"off"``.
    :param return_all: True: a list of every rank's value, by rank.
    :param rdzv_timeout: seconds each node waits for the others at the rendezvous.
    :param on_interrupt: ``"stop"`` or ``"checkpoint"`` (above).
    :param checkpoint_every: see above.
    :param resume: True: continue from the newest checkpoint; a path: from that one.
    :param resume_from: the checkpoint folder to continue from (instead of ``resume=<path>``).
    :param project_dir: where checkpoints go (above).
    :param total_limit: how many automatic checkpoints to keep (None: all).
    :param cluster: see above.
    :param debug: see above.
    :param use_port: see Accelerate's other parameters, above; as are ``master_addr``,
        ``rdzv_backend``, ``rdzv_conf``, ``rdzv_id``, ``monitor_interval`` and
        ``log_line_prefix_template``.
    :returns: rank 0's return value (``return_all``: every rank's); tensors arrive on the CPU.
    :raises ValueError: a bad argument value, named with its value and what to pass instead,
        before any rank starts.
    :raises TypeError: an argument of the wrong type (named the same way).
    :raises WorkerError: a rank failed: it names the rank that failed first (the root cause),
        with its traceback; every other rank was stopped.
    :raises TimeoutError: ``timeout`` passed.
    :raises KeyboardInterrupt: the notebook's stop button (every rank stopped).
    :raises ResultError: a rank's value cannot be loaded here (its class exists only there).
    """
    # IPython (and pytest) hide frames that set this: a failure shows the cell and the
    # rank's own traceback, not the launcher's internals.
    __tracebackhide__ = True
    tracebacks.install()  # a wrong argument's message under the cell, not nbtrain's frames
    args, kwargs = check_function(function, args, kwargs)
    # Every parameter but the call itself is an option, by its name (Requested.of).
    given = {name: value for name, value in locals().items() if name in _OPTION_NAMES}
    requested = Requested.of(given)
    name = getattr(function, "__name__", "run")
    launch = build_launch(requested, name, background=block is False)
    check_background(launch, block)
    return registry.launch(launch, UserCall(function, args, kwargs), block=block)


def debug_launcher(function: Callable[..., Any], args: tuple = (), num_processes: int = 2) -> Any:
    """CPU-only launch for debugging distributed code on a laptop (as in Accelerate): the
    ranks see no GPU.

    :param function: the callable each rank runs, as for ``notebook_launcher``.
    :param args: its positional arguments.
    :param num_processes: how many CPU ranks (default 2).
    :returns: rank 0's return value.
    :raises WorkerError: a rank failed (named, with its traceback); the others were stopped.
    :raises ValueError: a bad argument (named, with the fix), before any rank starts.
    """
    __tracebackhide__ = True
    args, kwargs = check_function(function, args, None)
    requested = Requested(num_processes=num_processes)
    # CPU only, even on a TPU host: in process, or local ranks
    launch = build_launch(requested, getattr(function, "__name__", "run"), allow_xla=False)
    with environment.gpus_hidden():  # the ranks see no GPU (they inherit the environment)
        return launch.run(UserCall(function, args, kwargs))


# notebook_launcher's options: its parameters after the call (function, args, kwargs), but
# block (how the cell waits for the run, not how the ranks run).
_OPTION_NAMES = frozenset(list(inspect.signature(notebook_launcher).parameters)[3:]) - {"block"}

# From here on, the line of the notebook that first initialises CUDA is noted (cuda_origin).
cuda_origin.watch()


__all__ = ["OutputMode", "ProgressMode", "debug_launcher", "notebook_launcher"]
