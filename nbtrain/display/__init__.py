"""The run's state and its views: widgets in a Jupyter kernel, text everywhere else. Kernel side.

``runstate`` holds the model (RunState: events folded into a per-rank picture, each rank's row a
``rankview.RankView``) that the kernel's launch loop feeds and every view reads; ``commpump``
lets the dashboard's "where?" button work while its cell is busy (the launch loop pumps it).
The dependency runs one way: the kernel side imports this package, never the reverse.

A view has ``draw(state)`` (called by the launcher about 10 times a second while ranks run),
``close(state)`` (once, after ``state.finish``) and ``note(text)``: a node-level message from the
launcher ("waiting for nodes (1 of 2 joined)", "restarting every rank ..."), shown at once: in the
dashboard's header (until ranks start again or the run ends), as one line in the text view, not
at all with progress="off". Only the kernel process draws; views read the RunState and nothing
else: this package imports ``shared`` only (nothing of ``kernel``), and never torch.
"""

from __future__ import annotations

import warnings
from typing import Any, Protocol

from nbtrain.display.runstate import RunState
from nbtrain.shared.frontend import Frontend, frontend
from nbtrain.shared.options import OutputMode, ProgressMode


class View(Protocol):
    def draw(self, state: RunState, *, now: bool = False) -> None:
        """Show ``state``; a view may hold back part of it to send fewer messages, unless
        ``now`` (the kernel is about to block: a rank's pdb prompt)."""

    def close(self, state: RunState) -> None: ...

    def note(self, text: str) -> None: ...


def make_view(
    progress: ProgressMode, output: OutputMode, world_size: int, display: Any = None
) -> View:
    """'auto': widgets inside a Jupyter kernel with ipywidgets, text otherwise. ``display``:
    where the widget view's bundles go (widgets.Display; default: IPython's display)."""
    from nbtrain.display.text import TextView

    in_kernel = frontend() is Frontend.JUPYTER
    if progress is ProgressMode.WIDGETS or (progress is ProgressMode.AUTO and in_kernel):
        reason = None if in_kernel else "this is not a Jupyter kernel"
        if reason is None:
            try:
                from nbtrain.display.widgets import WidgetView
            except ImportError as exc:
                reason = f"ipywidgets cannot be imported ({exc})"
            else:
                return WidgetView(output=output, world_size=world_size, display=display)
        if progress is ProgressMode.WIDGETS:
            warnings.warn(
                f"progress='widgets' needs a Jupyter kernel with ipywidgets, but {reason}; "
                "showing text progress instead (pass progress='text' to silence this).",
                stacklevel=3,
            )
    return TextView(output=output, show_progress=progress is not ProgressMode.OFF)
