"""Whether a human can answer a prompt in this process: a pdb prompt (breakpoint relay,
post-mortem) is only offered where someone can type at it."""

from __future__ import annotations

import sys

NO_INPUT = (
    "this run has no input to type pdb commands in (a notebook run by nbclient or papermill, "
    "or a script whose stdin is not a terminal)"
)


def can_ask() -> bool:
    """An IPython kernel asks its frontend, if this execution allows stdin (nbclient's does
    not); elsewhere only a terminal can answer."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None and hasattr(shell, "kernel"):
        return bool(getattr(shell.kernel, "_allow_stdin", True))
    return sys.stdin is not None and sys.stdin.isatty()


__all__ = ["NO_INPUT", "can_ask"]
