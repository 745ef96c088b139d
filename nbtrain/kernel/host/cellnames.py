"""A notebook cell's code by the name the notebook shows: ``Cell In[3], line 4``.

Code run in a kernel has a file name of IPython's making (``/tmp/ipykernel_123/456.py`` in
ipykernel), which ranks keep: a function pickled from the kernel, a ``%%ranks`` cell compiled
under the same name. IPython's compiler knows which execution count each name belongs to, so the
kernel names the cells in what a rank reports (its traceback, where it was stuck) as IPython
names them in its own tracebacks. Outside IPython, and for other files, names stay as they are.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from nbtrain.shared import stacks

# A traceback's frame line ('  File "x.py", line 4, in f') and a faulthandler dump's
# ('  File "x.py", line 4 in f').
_FILE_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')
# pdb's places: 'file(line)function()' (IPython's pdb puts colour codes between the parts),
# 'file:line' (a breakpoint's), or the file alone; a cell's file is a path or '<ipython-input-..>'.
_ANSI = r"(?:\x1b\[[0-9;]*m)*"
_PDB_PLACE = re.compile(
    r"(?P<file>/[^\s()\x1b\"':]+\.py|<[^\s<>\x1b]+>)"
    rf"(?:{_ANSI}\({_ANSI}(?P<frame>\d+){_ANSI}\)|:(?P<line>\d+))?"
)


def cell_name(filename: str) -> str | None:
    """IPython's name for a cell's code ('Cell In[3]'), or None for a file."""
    shell = _shell()
    compiler = getattr(shell, "compile", None)
    if compiler is None:
        return None
    try:
        named = compiler.format_code_name(filename)
    except Exception:  # an IPython whose compiler cannot say: the name stays as it is
        return None
    if not named:
        return None
    label, name = named
    return f"{label} {name}"


def place(filename: str, line: int) -> str:
    """'Cell In[3], line 4' for a cell; else the file's short name and line ('torch/x.py:4')."""
    cell = cell_name(filename)
    return f"{cell}, line {line}" if cell is not None else stacks.short_place(filename, line)


def in_text(text: str) -> str:
    """A rank's traceback or stack dump with each cell's frame named as the notebook names it:
    'File "/tmp/ipykernel_1/2.py", line 4, in f' -> 'Cell In[3], line 4, in f'."""
    if _shell() is None:
        return text

    def rename(match: re.Match[str]) -> str:
        cell = cell_name(match["file"])
        return f"{cell}, line {match['line']}" if cell is not None else match[0]

    return _FILE_LINE.sub(rename, text)


def in_pdb_text(text: str) -> str:
    """A rank's pdb output with each cell's code named as the notebook names it: the frame
    lines of a stop, ``where``, ``up`` ('> /tmp/ipykernel_1/2.py(6)train()' -> '> Cell In[3],
    line 6, in train()'), and a cell's file elsewhere ('.../2.py:6' -> 'Cell In[3], line 6').
    IPython's pdb colours its output: the colour codes around the name may stay."""
    if _shell() is None:
        return text

    def rename(match: re.Match[str]) -> str:
        cell = cell_name(match["file"])
        if cell is None:
            return match[0]
        if match["frame"]:
            return f"{cell}, line {match['frame']}, in "
        return f"{cell}, line {match['line']}" if match["line"] else cell

    return _PDB_PLACE.sub(rename, text)


def register(code: str, raw_cell: str) -> str | None:
    """Name ``code`` (run elsewhere: a %%ranks cell) as a part of the running cell: IPython
    caches its lines and maps its name to this execution count. Returns the name (None
    outside IPython)."""
    shell = _shell()
    if shell is None:
        return None
    try:
        return str(shell.compile.cache(code, _running_count(shell), raw_code=raw_cell))
    except Exception:
        return None


def _running_count(shell: Any) -> int:
    """The running cell's execution count (shell.execution_count is the next cell's by now)."""
    result = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    count = getattr(result, "execution_count", None)
    return count if isinstance(count, int) else int(shell.execution_count) - 1


def _shell() -> Any:
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None
