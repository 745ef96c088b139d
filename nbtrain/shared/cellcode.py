"""Code objects through cloudpickle with their file name kept: a rank's traceback names the
notebook cell a function was defined in, and the cell's lines travel with it (sharedmem.py's
pickler uses ``named_code`` for every code object)."""

from __future__ import annotations

import linecache
import types
from collections.abc import Callable
from typing import Any

import cloudpickle

_CLOUDPICKLE_CODE = cloudpickle.Pickler.dispatch_table[types.CodeType]


def named_code(code: types.CodeType) -> tuple:
    """cloudpickle's reduction of a code object, keeping the file name it drops (for a
    deterministic pickle, which we do not need): a rank's traceback names the notebook's cell
    of a function defined there ('Cell In[3], line 4', kernel/host/cellnames.py), not
    '<dynamic-code>'. A cell's lines go with it: pdb in the rank lists them."""
    rebuild, args = _CLOUDPICKLE_CODE(code)
    return _code_in_file, (rebuild, args, code.co_filename, _cell_lines(code.co_filename))


def _cell_lines(filename: str) -> list[str] | None:
    """The lines of a notebook cell, which IPython keeps in linecache only (no file on disk, so
    a process started apart from the kernel cannot read them); None for anything else. (One
    list object for all the cell's code objects: the pickle's memo sends it once.)"""
    entry = linecache.cache.get(filename)
    if entry is None or len(entry) != 4 or entry[1] is not None:
        return None  # not a cell (a file linecache read from disk, with its mtime)
    return entry[2]


def _code_in_file(
    rebuild: Callable[..., types.CodeType], args: tuple, filename: str,
    lines: list[str] | None = None,
) -> Any:
    if lines and filename not in linecache.cache:  # (mtime None: linecache never re-reads it)
        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
    return rebuild(*args).replace(co_filename=filename)
