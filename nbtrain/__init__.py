"""nbtrain: notebook-first interactive distributed training for PyTorch.

The package is laid out by where code runs (see the README's Layout section):

- ``nbtrain.kernel``: the launching process (the Jupyter kernel or ``nbtrain launch``): launch
  paths, the one run lifecycle, processes, supervision, elastic agent, XLA host launch.
- ``nbtrain.display``: also in the kernel: the run's state (RunState, fed by ``kernel``) and its
  widgets, text and static HTML; it imports nothing of ``kernel``.
- ``nbtrain.rank``: each rank: the worker entry, runtime, reporting, teardown, rank environment.
- ``nbtrain.accelerator``: each rank: Accelerate's ``Accelerator`` API and its parts.
- ``nbtrain.integrations``: each rank: adapters (Transformers' Trainer) reporting through ``rank``.
- ``nbtrain.shared``: both sides: events, errors, options, records, serialization; no logic
  beyond transport.

Every public name loads on first use, so a rank that imports ``nbtrain`` for ``Accelerator`` never
loads the kernel side, and ``import nbtrain`` in the kernel stays light.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "notebook_launcher": "nbtrain.kernel.launcher",
    "debug_launcher": "nbtrain.kernel.launcher",
    "start_ranks": "nbtrain.kernel.magics",
    "WorkerError": "nbtrain.shared.errors",
    "RayCluster": "nbtrain.kernel.cluster.spec",
    "ResultError": "nbtrain.shared.errors",
    "SessionError": "nbtrain.shared.errors",
    "Accelerator": "nbtrain.accelerator.front.core",
    "DistributedType": "nbtrain.accelerator.front.core",
    "set_seed": "nbtrain.accelerator.checkpoint.seed",
    "progress": "nbtrain.rank.reporting",
    "log": "nbtrain.rank.reporting",
    "NbtrainCallback": "nbtrain.integrations.transformers",
    "FullyShardedDataParallelPlugin": "nbtrain.accelerator.fsdp.plugin",
}

if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names load lazily
    from nbtrain.accelerator.checkpoint.seed import set_seed
    from nbtrain.accelerator.front.core import Accelerator, DistributedType
    from nbtrain.accelerator.fsdp.plugin import FullyShardedDataParallelPlugin
    from nbtrain.integrations.transformers import NbtrainCallback
    from nbtrain.kernel.cluster.spec import RayCluster
    from nbtrain.kernel.launcher import debug_launcher, notebook_launcher
    from nbtrain.kernel.magics import start_ranks
    from nbtrain.rank.reporting import log, progress
    from nbtrain.shared.errors import ResultError, SessionError, WorkerError


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nbtrain' has no attribute {name!r}")
    return getattr(import_module(module), name)


def warm_up() -> None:
    """Make what the first launch needs ready in the background, once the current cell has
    finished (nbtrain/kernel/warmup.py): the forkserver with torch imported, and the kernel's
    own imports for a fork launch. In a kernel (or IPython) only; elsewhere it does nothing.

    Opt-in, not done by ``import nbtrain``: while the warm-up imports torch's modules in a
    thread, code of yours that forks the kernel (a DataLoader with workers in the kernel,
    ``os.fork``) or imports the same modules in the next cell would race with it. Call it in
    the cell that imports nbtrain when the next cells only launch (notebooks/guides/launching.md).
    """
    from nbtrain.shared.frontend import Frontend, frontend

    if frontend() is Frontend.PLAIN:
        return
    # Begun once the current cell has finished: a thread importing torch's modules while that
    # same cell goes on importing and launching deadlocked the kernel.
    shell = import_module("IPython").get_ipython()

    def begin(*_: Any) -> None:
        shell.events.unregister("post_run_cell", begin)
        import_module("nbtrain.kernel.warmup").start()

    shell.events.register("post_run_cell", begin)


def load_ipython_extension(shell: Any) -> None:
    """``%load_ext nbtrain``: registers the ``%%ranks`` cell magic (warm ranks)."""
    import_module("nbtrain.kernel.magics").load_ipython_extension(shell)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "Accelerator",
    "DistributedType",
    "FullyShardedDataParallelPlugin",
    "NbtrainCallback",
    "RayCluster",
    "ResultError",
    "SessionError",
    "WorkerError",
    "__version__",
    "debug_launcher",
    "log",
    "notebook_launcher",
    "progress",
    "set_seed",
    "start_ranks",
    "warm_up",
]
