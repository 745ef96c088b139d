"""nbtrain: notebook-first interactive distributed training for PyTorch.

The launcher is imported eagerly; the worker-side names (Accelerator, progress, log, ...) load on
first use, so `import nbtrain` stays light and each lives in its own module.
"""

from importlib import import_module
from typing import Any

from .errors import ResultError, WorkerError
from .launcher import debug_launcher, notebook_launcher

__version__ = "0.1.0"

_LAZY = {
    "Accelerator": "accelerator",
    "DistributedType": "accelerator",
    "FullyShardedDataParallelPlugin": "fsdp_plugin",
    "set_seed": "seed",
    "progress": "reporting",
    "log": "reporting",
    "NbtrainCallback": "integrations.transformers",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nbtrain' has no attribute {name!r}")
    return getattr(import_module(f".{module}", __name__), name)


__all__ = [
    "Accelerator",
    "DistributedType",
    "FullyShardedDataParallelPlugin",
    "NbtrainCallback",
    "ResultError",
    "WorkerError",
    "__version__",
    "debug_launcher",
    "log",
    "notebook_launcher",
    "progress",
    "set_seed",
]
