"""Which view a launch shows: the cell's dashboard (widgets in a kernel, else text) for a launch
that holds the cell, the pane's own display for a background run (display/background.py)."""

from __future__ import annotations

import contextlib
import io

from nbtrain.display import View, make_view
from nbtrain.display.background import Pane, PaneDisplay, Recorded
from nbtrain.display.text import TextView
from nbtrain.kernel.options.config import LaunchConfig, ProgressMode
from nbtrain.kernel.run import handle

__all__ = ["open_view", "pane_view"]


def open_view(config: LaunchConfig) -> View:
    """The view a launch with these options shows (widgets in a kernel, else text); the
    launch's handle keeps its final dashboard (shown again by ``nbtrain.runs()[-1]``)."""
    display = None
    run = handle.current()
    if run is not None and config.progress is not ProgressMode.OFF:
        with contextlib.suppress(ImportError):  # (no ipywidgets: a text view, nothing kept)
            display = Recorded(run.keep_view)
    return make_view(config.progress, config.output, config.world_size, display)


def pane_view(config: LaunchConfig, pane: Pane) -> View:
    """A background run's view: the dashboard into the pane's own display (background.py);
    outside Jupyter none (output() and the log folder have the lines)."""
    if not pane.jupyter or config.progress is ProgressMode.OFF:
        quiet = io.StringIO()
        return TextView(
            output=config.output, show_progress=False, live=False, stdout=quiet, stderr=quiet
        )
    from nbtrain.display.widgets import WidgetView

    return WidgetView(output=config.output, world_size=config.world_size, display=PaneDisplay(pane))
