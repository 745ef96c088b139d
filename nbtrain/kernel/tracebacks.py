"""Tracebacks in the cell show the user's code, not nbtrain's.

IPython hides frames that set ``__tracebackhide__``, but always shows the frame that raised, and
an interrupt's traceback runs through the watch loop. So, in an IPython shell, nbtrain registers
a handler for the exceptions a launch raises (WorkerError, ResultError, TimeoutError,
KeyboardInterrupt): when the traceback passes through nbtrain's kernel side, the frames of the
``nbtrain`` package are left out and the rest is shown as IPython would (the rank's own
traceback stays, as the direct cause). Exceptions that never went through nbtrain are shown as
usual. A shell that already has custom exception handlers keeps them (nbtrain adds none).
"""

from __future__ import annotations

import os
import sys
from types import TracebackType
from typing import Any

from nbtrain.shared.errors import ResultError, SessionError, WorkerError

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_KERNEL_SIDE = os.path.dirname(os.path.abspath(__file__)) + os.sep
HANDLED = (WorkerError, ResultError, SessionError, TimeoutError, KeyboardInterrupt)


def install() -> None:
    """Register the handler in the current IPython shell, once (no shell: nothing to do)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or getattr(shell, "_nbtrain_tracebacks", False):
        return
    if shell.custom_exceptions:
        return  # the user's own handlers win
    shell.set_custom_exc(HANDLED, _show)
    shell._nbtrain_tracebacks = True


def _show(shell: Any, etype: type[BaseException], value: BaseException,
          tb: TracebackType | None, tb_offset: int | None = None) -> Any:
    if _passes_through_kernel_side(tb):
        tb = users_frames(tb)
        value.__context__ = None if value.__suppress_context__ else value.__context__
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    return None


def _passes_through_kernel_side(tb: TracebackType | None) -> bool:
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(_KERNEL_SIDE):
            return True
        tb = tb.tb_next
    return False


def users_frames(tb: TracebackType | None) -> TracebackType | None:
    """The same traceback without the frames of the nbtrain package."""
    kept: list[TracebackType] = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_PACKAGE):
            kept.append(tb)
        tb = tb.tb_next
    chain: TracebackType | None = None
    for entry in reversed(kept):
        chain = TracebackType(chain, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return chain
