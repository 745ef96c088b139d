"""``%%ranks``: a notebook cell that runs on the warm ranks (kernel/warm/).

``%load_ext nbtrain`` registers it (``start_ranks`` does too). The line selects ranks and
options; everything is checked before the cell is sent anywhere::

    %%ranks                 every rank
    %%ranks 0               rank 0;  "0,2": ranks 0 and 2;  "1-3": ranks 1, 2 and 3
    %%ranks --timeout 30    the cell's own time limit (seconds)

The value of the cell's last expression is shown for each rank, labelled ``Out[rank N]``.
The cell is plain Python: IPython's own syntax (``%magic``, ``!shell``) runs in the kernel only.

``%ranks_debug [RANK]``, after a failed cell: pdb in the failing rank at its failing frame
(``Ranks.debug``), as ``%debug`` after a failure in the kernel.
"""

from __future__ import annotations

import functools
import shlex
from typing import Any

from nbtrain.kernel.host import cellnames
from nbtrain.kernel.run.cellout import with_label
from nbtrain.kernel.warm import session

_registered: set[int] = set()  # ids of the shells %%ranks is registered with


@functools.wraps(session.start_ranks)
def start_ranks(*args: Any, **kwargs: Any) -> session.Ranks:
    """``nbtrain.start_ranks``: the session, and %%ranks registered in this shell."""
    ranks = session.start_ranks(*args, **kwargs)
    register()  # %%ranks works from now on, without %load_ext
    return ranks


def load_ipython_extension(shell: Any) -> None:
    shell.register_magic_function(ranks_magic, magic_kind="cell", magic_name="ranks")
    shell.register_magic_function(ranks_debug_magic, magic_kind="line", magic_name="ranks_debug")
    _registered.add(id(shell))


def register() -> None:
    """Register %%ranks in the running IPython shell, if any (idempotent)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None and id(shell) not in _registered:
        load_ipython_extension(shell)


def ranks_magic(line: str, cell: str) -> None:
    __tracebackhide__ = True
    handle = session.current()
    selected, timeout = parse_line(line, len(handle.ranks))
    # One line up front stands for the %%ranks line: the rank's traceback numbers the cell's
    # lines as the notebook shows them.
    code = "\n" + cell
    filename = cellnames.register(code, cell)  # the rank's traceback names it 'Cell In[n]'
    values = handle.run_cell(code, selected, filename=filename, timeout=timeout)
    show_values(values)


def ranks_debug_magic(line: str) -> None:
    """``%ranks_debug`` (the rank that failed first in the last failed command) or
    ``%ranks_debug 1``."""
    __tracebackhide__ = True
    handle = session.current()
    word = line.strip()
    if not word:
        handle.debug()
        return
    try:
        rank = int(word)
    except ValueError:
        raise session.SessionError(
            f"%ranks_debug {word}: give one rank number, e.g. %ranks_debug 1 (or nothing: the "
            "rank that failed first)."
        ) from None
    handle.debug(rank)


def parse_line(line: str, world_size: int) -> tuple[list[int], float | None]:
    """The ranks and the timeout a ``%%ranks`` line asks for (SessionError if it is wrong)."""
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise session.SessionError(f"%%ranks {line}: {exc}") from None
    timeout: float | None = None
    selector = ""
    while words:
        word = words.pop(0)
        if word in ("--timeout", "-t"):
            if not words:
                raise session.SessionError("%%ranks --timeout needs seconds, e.g. --timeout 30")
            timeout = _seconds(words.pop(0))
        elif word.startswith("--timeout="):
            timeout = _seconds(word.split("=", 1)[1])
        elif not selector:
            selector = word
        else:
            raise session.SessionError(
                f"%%ranks {line}: unexpected {word!r}; write the ranks as one word "
                "(\"0,2\" or \"1-3\") and options as --timeout SECONDS."
            )
    return select(selector, world_size), timeout


def select(selector: str, world_size: int) -> list[int]:
    """``"0"``, ``"0,2"``, ``"1-3"`` (or ``""`` / ``"all"``: every rank) as sorted ranks."""
    if selector in ("", "all", "*"):
        return list(range(world_size))
    chosen: set[int] = set()
    for part in selector.split(","):
        first, _, last = part.partition("-")
        try:
            low = int(first)
            high = int(last) if last else low
        except ValueError:
            raise session.SessionError(
                f"%%ranks {selector}: {part!r} is not a rank; write ranks as \"0\", \"0,2\" or "
                "\"1-3\"."
            ) from None
        if low > high:
            raise session.SessionError(f"%%ranks {selector}: the range {part!r} is empty.")
        chosen.update(range(low, high + 1))
    outside = sorted(rank for rank in chosen if not 0 <= rank < world_size)
    if outside:
        raise session.SessionError(
            f"%%ranks {selector}: there is no rank {', '.join(map(str, outside))}; the "
            f"{world_size} warm ranks are 0-{world_size - 1}. Nothing was run."
        )
    return sorted(chosen)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise session.SessionError(f"%%ranks --timeout {text}: give seconds above 0.")
    return value


def show_values(values: dict[int, dict[str, Any]]) -> None:
    """Each rank's value, labelled ``Out[rank N]:`` (rich forms keep the label above them)."""
    try:
        from IPython.display import publish_display_data
    except ImportError:
        for rank, bundle in sorted(values.items()):
            print(f"Out[rank {rank}]: {bundle.get('text/plain', '')}")
        return
    for rank, bundle in sorted(values.items()):
        publish_display_data(labelled_value(rank, bundle))


def labelled_value(rank: int, bundle: dict[str, Any]) -> dict[str, Any]:
    label = f"Out[rank {rank}]:"
    text = bundle.get("text/plain", "")
    plain = f"{label} {text}" if "\n" not in text else f"{label}\n{text}"
    return with_label(bundle, label, plain, "nbtrain-rank-value")
