"""Tracebacks in the cell show the user's code, not nbtrain's.

IPython hides frames that set ``__tracebackhide__``, but always shows the frame that raised, and
an interrupt's traceback runs through the watch loop. So, in an IPython shell, nbtrain registers
a handler for the exceptions a launch raises (WorkerError, ResultError, TimeoutError,
KeyboardInterrupt): when the traceback passes through nbtrain's kernel side, the frames of the
``nbtrain`` package are left out, and so is the cell's ``get_ipython().run_cell_magic(...)`` line
of a ``%%ranks`` cell (the cell's code is in the rank's traceback); the rest is shown as IPython
would. The rank's own traceback comes first, as the direct cause, under a header naming the rank
(IPython would head it with a second, empty "RemoteTraceback"), its cells named as the notebook
names them ("Cell In[3], line 4", see cellnames.py). Exceptions that never went through nbtrain
are shown as usual. A shell that already has custom exception handlers keeps them (nbtrain adds
none).
"""

from __future__ import annotations

import linecache
import os
import re
import sys
from types import TracebackType
from typing import Any

from nbtrain.kernel.host import cellnames
from nbtrain.shared.errors import RemoteTraceback, ResultError, SessionError, WorkerError

# This module is nbtrain/kernel/run/tracebacks.py: the kernel side is two folders up, the
# package three.
_KERNEL_SIDE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_PACKAGE = os.path.dirname(_KERNEL_SIDE.rstrip(os.sep)) + os.sep
# The checks of a launch's arguments are the options layer (kernel/options/).
_CHECKS = os.path.join(_KERNEL_SIDE, "options") + os.sep
HANDLED = (WorkerError, ResultError, SessionError, TimeoutError, KeyboardInterrupt)
# What nbtrain's checks of a launch's arguments raise, with a message that names the argument,
# the value and the fix: shown under the user's cell alone, when one of the checks' modules
# raised it itself. (Any other such error keeps its whole traceback: a bug stays findable.)
ARGUMENT_ERRORS = (TypeError, ValueError, OSError)
_TRACEBACK_HEADER = "Traceback (most recent call last):"
_DIRECT_CAUSE = "\nThe above exception was the direct cause of the following exception:\n"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def rank_cause(error: WorkerError) -> RemoteTraceback | None:
    """The rank's own traceback as the direct cause of ``error`` (None if it has none), with
    the notebook's cells named as the notebook names them, in ``error.remote_traceback`` too."""
    if not error.remote_traceback:
        return None
    error.remote_traceback = cellnames.in_text(error.remote_traceback)
    return RemoteTraceback(error.remote_traceback)


def install() -> None:
    """Register the handler in the current IPython shell, once (no shell: nothing to do)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or getattr(shell, "_nbtrain_tracebacks", False):
        return
    if shell.custom_exceptions:
        return  # the user's own handlers win
    shell.set_custom_exc(HANDLED + ARGUMENT_ERRORS, _show)
    shell._nbtrain_tracebacks = True


def _show(shell: Any, etype: type[BaseException], value: BaseException,
          tb: TracebackType | None, tb_offset: int | None = None) -> Any:
    ours = isinstance(value, HANDLED) or _raised_by_a_check(tb)
    if ours and _passes_through_kernel_side(tb):
        tb = users_frames(tb)
        value.__context__ = None if value.__suppress_context__ else value.__context__
    if isinstance(value, WorkerError) and isinstance(value.__cause__, RemoteTraceback):
        try:
            stb = _with_rank_traceback(shell, etype, value, tb, tb_offset)
        except Exception:  # an IPython that formats otherwise: its own way, cause and all
            stb = None
        if stb is not None:
            shell._showtraceback(etype, value, stb)  # (what showtraceback ends with)
            return None
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    return None


def _with_rank_traceback(
    shell: Any, etype: type[BaseException], value: WorkerError, tb: TracebackType | None,
    tb_offset: int | None,
) -> list[str]:
    """IPython's traceback of ``value`` preceded by the rank's, headed by the rank's number."""
    cause = value.__cause__
    assert isinstance(cause, RemoteTraceback)
    formatter = shell.InteractiveTB
    value.__cause__ = None  # formatted here, not by IPython
    try:
        stb = list(formatter.structured_traceback(etype, value, tb, tb_offset=tb_offset))
    finally:
        value.__cause__ = cause
    text = cause.text.rstrip()
    title = f"{value.type_name} in rank {value.rank}" if value.type_name else f"rank {value.rank}"
    if text.startswith(_TRACEBACK_HEADER):
        header = formatter.prepare_header(title)
        text = text[len(_TRACEBACK_HEADER):].lstrip("\n")
    else:
        header = title
    rule = stb[:1] if stb and _is_rule(stb[0]) else []  # IPython's line above it all
    return [*rule, header, text, _DIRECT_CAUSE, *stb[len(rule):]]


def _is_rule(line: str) -> bool:
    plain = _ANSI.sub("", line).strip()
    return len(set(plain)) == 1 and plain[0] in "-─━"


def _raised_by_a_check(tb: TracebackType | None) -> bool:
    """The innermost frame is one of the kernel side's checks of a launch's arguments, at a
    ``raise`` of its own (not a failure inside it)."""
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    path = tb.tb_frame.f_code.co_filename
    if not path.startswith(_CHECKS):
        return False
    return linecache.getline(path, tb.tb_lineno).lstrip().startswith("raise ")


def _passes_through_kernel_side(tb: TracebackType | None) -> bool:
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(_KERNEL_SIDE):
            return True
        tb = tb.tb_next
    return False


def users_frames(tb: TracebackType | None) -> TracebackType | None:
    """The same traceback without the frames of the nbtrain package, nor a %%ranks cell's
    ``get_ipython().run_cell_magic('ranks', ...)`` line: the ranks ran the cell's code."""
    kept: list[TracebackType] = []
    while tb is not None:
        code = tb.tb_frame.f_code
        if not code.co_filename.startswith(_PACKAGE) and not _runs_ranks_magic(tb):
            kept.append(tb)
        tb = tb.tb_next
    chain: TracebackType | None = None
    for entry in reversed(kept):
        chain = TracebackType(chain, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return chain


def _runs_ranks_magic(tb: TracebackType) -> bool:
    """The cell's frame of a %%ranks cell: it calls IPython's run_cell_magic for 'ranks'."""
    called = tb.tb_next
    if called is None or called.tb_frame.f_code.co_name != "run_cell_magic":
        return False
    return called.tb_frame.f_locals.get("magic_name") == "ranks"
