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

import sys
from importlib import import_module
from typing import TYPE_CHECKING, Any

from nbtrain._version import __version__

_LAZY = {
    "notebook_launcher": "nbtrain.kernel.entry",
    "debug_launcher": "nbtrain.kernel.entry",
    "start_ranks": "nbtrain.kernel.warm.magics",
    "Run": "nbtrain.kernel.run.handle",
    "runs": "nbtrain.kernel.run.registry",
    "WorkerError": "nbtrain.shared.errors",
    "RayCluster": "nbtrain.kernel.launch.cluster.spec",
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
    from nbtrain.kernel.entry import debug_launcher, notebook_launcher
    from nbtrain.kernel.launch.cluster.spec import RayCluster
    from nbtrain.kernel.run.handle import Run
    from nbtrain.kernel.run.registry import runs
    from nbtrain.kernel.warm.magics import start_ranks
    from nbtrain.rank.reporting import log, progress
    from nbtrain.shared.errors import ResultError, SessionError, WorkerError


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nbtrain' has no attribute {name!r}")
    return getattr(import_module(module), name)


def warm_up() -> None:
    """Make what the first launch needs ready while the kernel is idle, once the current cell
    has ended (nbtrain/kernel/procs/warmup.py): the forkserver with torch imported (where
    launches use it: CUDA visible, or torch_xla; on a CPU machine warm ranks start it when
    asked for), and the kernel's own imports for a fork launch. ``import nbtrain`` in a Jupyter
    kernel does it already, unless ``NBTRAIN_WARM_UP=0`` is set (then this call does it).
    Elsewhere (a script, terminal IPython) it does nothing: a launch imports what it needs
    itself."""
    if _in_a_kernel():
        import_module("nbtrain.kernel.procs.warmup").start()


def _in_a_kernel() -> bool:
    from nbtrain.shared.frontend import Frontend, frontend

    return frontend() is Frontend.JUPYTER


def _warm_up_on_import() -> None:
    # (ranks never get here: a forked rank finds nbtrain imported, a fresh one has no kernel)
    if _in_a_kernel() and import_module("nbtrain.kernel.host.environment").warm_up_on_import():
        import_module("nbtrain.kernel.procs.warmup").start()


def _register_magics() -> None:
    """In IPython, ``%%ranks`` and ``%ranks_debug`` are known from ``import nbtrain`` on: used
    before ``start_ranks``, they say to call it first (not IPython's bare "Cell magic not
    found"). The magics' module is imported on their first use."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or getattr(shell, "_nbtrain_magics", False):
        return

    def ranks(line: str, cell: str) -> Any:
        __tracebackhide__ = True
        return import_module("nbtrain.kernel.warm.magics").ranks_magic(line, cell)

    def ranks_debug(line: str) -> Any:
        __tracebackhide__ = True
        return import_module("nbtrain.kernel.warm.magics").ranks_debug_magic(line)

    shell.register_magic_function(ranks, magic_kind="cell", magic_name="ranks")
    shell.register_magic_function(ranks_debug, magic_kind="line", magic_name="ranks_debug")
    shell._nbtrain_magics = True


def load_ipython_extension(shell: Any) -> None:
    """``%load_ext nbtrain``: registers the ``%%ranks`` cell magic (warm ranks)."""
    import_module("nbtrain.kernel.warm.magics").load_ipython_extension(shell)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "Accelerator",
    "DistributedType",
    "FullyShardedDataParallelPlugin",
    "NbtrainCallback",
    "RayCluster",
    "ResultError",
    "Run",
    "SessionError",
    "WorkerError",
    "__version__",
    "debug_launcher",
    "log",
    "notebook_launcher",
    "progress",
    "runs",
    "set_seed",
    "start_ranks",
    "warm_up",
]

_warm_up_on_import()
_register_magics()
