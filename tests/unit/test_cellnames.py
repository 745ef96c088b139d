"""A rank's traceback and stack dump name the notebook's cells as IPython does ('Cell In[n],
line k'), checked against a real IPython shell's compiler; a %%ranks cell's frame is hidden."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell

from nbtrain.kernel.host import cellnames
from nbtrain.kernel.run import tracebacks
from nbtrain.shared.errors import RemoteTraceback, WorkerError
from nbtrain.shared.stacks import Frame, RankStack, describe


@pytest.fixture
def shell() -> Iterator[InteractiveShell]:
    shell = InteractiveShell.instance()
    try:
        yield shell
    finally:
        InteractiveShell.clear_instance()


def cell_file(shell: InteractiveShell, code: str) -> tuple[str, int]:
    """Run ``code`` (defining ``f``) as a cell; its file name and execution count."""
    result = shell.run_cell(code + "\n__code_file__ = f.__code__.co_filename", store_history=True)
    assert result.error_in_exec is None
    return shell.user_ns["__code_file__"], result.execution_count


def test_a_ranks_traceback_names_the_cells(shell: InteractiveShell) -> None:
    first, n1 = cell_file(shell, "def f():\n    raise ValueError")
    second, n2 = cell_file(shell, "def g():\n    f()\nf = g")
    text = (
        "Traceback (most recent call last):\n"
        f'  File "{second}", line 2, in g\n'
        "    f()\n"
        f'  File "{first}", line 2, in f\n'
        "    raise ValueError\n"
        '  File "/usr/lib/python3.12/json/__init__.py", line 346, in loads\n'
        "ValueError\n"
    )
    assert cellnames.in_text(text) == (
        "Traceback (most recent call last):\n"
        f"  Cell In[{n2}], line 2, in g\n"
        "    f()\n"
        f"  Cell In[{n1}], line 2, in f\n"
        "    raise ValueError\n"
        '  File "/usr/lib/python3.12/json/__init__.py", line 346, in loads\n'  # a file stays
        "ValueError\n"
    )
    # faulthandler's form (no comma before 'in'), and the timeout's one-line account
    dump = f'  File "{first}", line 2 in f'
    assert cellnames.in_text(dump) == f"  Cell In[{n1}], line 2 in f"
    where = describe({0: RankStack((Frame(first, 2, "f"),))}, cellnames.place)
    assert where == f"rank 0 was in Cell In[{n1}], line 2 in f"


def test_outside_ipython_names_stay() -> None:
    text = '  File "/tmp/ipykernel_1/2.py", line 4, in f'
    assert cellnames.in_text(text) == text
    assert cellnames.place("/tmp/ipykernel_1/2.py", 4) == "/tmp/ipykernel_1/2.py:4"


def test_the_cause_carries_the_cell_names_and_the_rank_heads_it(shell: InteractiveShell) -> None:
    name, count = cell_file(shell, "def f(): pass")
    error = WorkerError(
        1, type_name="ValueError", message="boom",
        remote_traceback=f'Traceback (most recent call last):\n  File "{name}", line 1, in f\n'
        "ValueError: boom\n",
    )
    cause = tracebacks.rank_cause(error)
    assert isinstance(cause, RemoteTraceback)
    assert f"Cell In[{count}], line 1, in f" in error.remote_traceback == cause.text
    try:
        raise error from cause
    except WorkerError as raised:
        stb = tracebacks._with_rank_traceback(shell, WorkerError, raised, None, None)
    text = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(stb))
    assert "RemoteTraceback" not in text
    lines = text.splitlines()
    assert lines[1].startswith("ValueError in rank 1")
    assert lines[1].endswith("Traceback (most recent call last)")
    assert lines[2] == f"  Cell In[{count}], line 1, in f"
    assert "direct cause of the following exception" in text
    assert lines[-1] == "WorkerError: rank 1 failed with ValueError: boom"


def test_a_ranks_pdb_output_names_the_cells(shell: InteractiveShell) -> None:
    cell, n = cell_file(shell, "def f():\n    pass")
    other = "/usr/lib/python3.12/json/decoder.py"
    plain = f"> {cell}(2)f()\n-> pass\n  {other}(353)raw_decode()\nBreakpoint 1 at {cell}:2\n"
    assert cellnames.in_pdb_text(plain) == (
        f"> Cell In[{n}], line 2, in f()\n-> pass\n  {other}(353)raw_decode()\n"  # a file stays
        f"Breakpoint 1 at Cell In[{n}], line 2\n"
    )
    # IPython's pdb (a forked rank's, in ipykernel) colours the parts of a frame's line
    coloured = f"> \x1b[32m{cell}\x1b[39m(\x1b[32m2\x1b[39m)\x1b[36mf\x1b[39m()"
    named = f"> \x1b[32mCell In[{n}], line 2, in \x1b[36mf\x1b[39m()"
    assert cellnames.in_pdb_text(coloured) == named


def test_the_traceback_rules_find_nbtrains_folders_wherever_the_module_sits():
    """tracebacks.py hides nbtrain's frames by folder: the package, the kernel side, and the
    options layer whose checks' own raises are shown as a message under the cell (a move of
    the module once left these pointing one folder too deep)."""
    import os

    import nbtrain
    import nbtrain.kernel
    import nbtrain.kernel.options

    def folder(module: object) -> str:
        return os.path.dirname(os.path.abspath(module.__file__)) + os.sep  # type: ignore[attr-defined]

    assert folder(nbtrain) == tracebacks._PACKAGE
    assert folder(nbtrain.kernel) == tracebacks._KERNEL_SIDE
    assert folder(nbtrain.kernel.options) == tracebacks._CHECKS
