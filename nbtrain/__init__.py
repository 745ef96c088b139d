"""nbtrain: notebook-first interactive distributed training for PyTorch."""

from .errors import WorkerError
from .launcher import debug_launcher, notebook_launcher

__version__ = "0.1.0"

__all__ = ["WorkerError", "__version__", "debug_launcher", "notebook_launcher"]
