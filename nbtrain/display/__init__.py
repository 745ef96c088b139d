"""Views of a RunState: widgets in a Jupyter kernel, text everywhere else."""

from __future__ import annotations

from typing import Protocol

from ..config import OutputMode, ProgressMode
from ..environment import Frontend, frontend
from ..monitor import RunState


class View(Protocol):
    def draw(self, state: RunState) -> None: ...

    def close(self, state: RunState) -> None: ...


def make_view(progress: ProgressMode, output: OutputMode, world_size: int) -> View:
    """'auto': widgets inside a Jupyter kernel with ipywidgets, text otherwise."""
    from .text import TextView

    wants_widgets = progress is ProgressMode.WIDGETS or (
        progress is ProgressMode.AUTO and frontend() is Frontend.JUPYTER
    )
    if wants_widgets:
        try:
            from .widgets import WidgetView
        except ImportError:
            pass
        else:
            return WidgetView(output=output, world_size=world_size)
    return TextView(output=output, show_progress=progress is not ProgressMode.OFF)
