"""Which frontend this Python process serves: a Jupyter kernel, terminal IPython or a plain
process. Asked in the kernel (which view to draw) and in a process outside a launch (whether a
text bar can redraw in place)."""

from __future__ import annotations

import sys
from enum import Enum


class Frontend(Enum):
    JUPYTER = "jupyter"  # an ipykernel kernel: JupyterLab, Notebook, VS Code, Colab, Kaggle
    IPYTHON = "ipython"  # a terminal IPython shell
    PLAIN = "plain"  # a script or a plain Python REPL


def frontend() -> Frontend:
    ipython_module = sys.modules.get("IPython")
    if ipython_module is None:
        return Frontend.PLAIN
    shell = ipython_module.get_ipython()
    if shell is None:
        return Frontend.PLAIN
    # A kernel shell has a `kernel` attribute; checking it beats matching str(get_ipython()).
    return Frontend.JUPYTER if getattr(shell, "kernel", None) is not None else Frontend.IPYTHON
