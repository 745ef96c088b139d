"""Which line of the notebook initialised CUDA in this kernel (Accelerate #3925 asks for it).

A kernel that created a CUDA context cannot fork ranks that use the GPU; the fix is to find the
cell that touched CUDA. torch initialises CUDA through ``torch.cuda._lazy_init`` (its C++ side
looks the function up on the module at every first use), so once the kernel side of nbtrain is
imported, a wrapper there notes the first call's caller: the innermost frame of a notebook cell,
else the innermost frame outside torch. Before that import nothing can be known, and the message
says so. The wrapper costs one check per call and does its work once.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from nbtrain.kernel.host.cellnames import cell_name

_lock = threading.Lock()
_origin: str | None = None
_watching = False


def watch() -> None:
    """Start noting where CUDA gets initialised (idempotent; a no-op without a CUDA torch, or
    once CUDA is initialised, when it is too late to know)."""
    global _watching
    torch = sys.modules.get("torch")
    with _lock:
        if _watching or torch is None or torch.version.cuda is None:
            return
        if torch.cuda.is_initialized():
            return
        original = torch.cuda._lazy_init
        torch.cuda._lazy_init = _wrap(original, torch)
        _watching = True


def _wrap(original: Callable[[], None], torch: Any) -> Callable[[], None]:
    def lazy_init() -> None:
        global _origin
        if _origin is None and not torch.cuda.is_initialized():
            _origin = _caller(traceback.extract_stack()[:-1])
        original()

    lazy_init.__wrapped__ = original  # type: ignore[attr-defined]
    return lazy_init


def origin() -> str | None:
    """'Cell In[3], line 2: x = torch.zeros(1, device="cuda")' (or a file and line), if known."""
    return _origin


def explain() -> str:
    """One sentence for an error or a reason: where CUDA was initialised, or why it is unknown."""
    if _origin is not None:
        return f"CUDA was initialised by {_origin}."
    return (
        "CUDA was initialised before nbtrain was imported (import nbtrain first to have the line "
        "named)."
    )


def _caller(stack: list[traceback.FrameSummary]) -> str:
    frames = [frame for frame in stack if not _inside_torch(frame.filename)]
    cells = [frame for frame in frames if cell_name(frame.filename) is not None]
    frame = (cells or frames or list(stack))[-1]
    cell = cell_name(frame.filename)
    where = f"{cell}, line {frame.lineno}" if cell else f"{frame.filename}, line {frame.lineno}"
    code = (frame.line or "").strip()
    return f"{where}: {code}" if code else where


def _inside_torch(filename: str) -> bool:
    return f"{os.sep}torch{os.sep}" in filename or filename == __file__

