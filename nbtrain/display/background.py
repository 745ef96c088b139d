"""Where a background run draws: its dashboard and its ranks' output, in every cell that shows it.

A background run (``notebook_launcher(..., block=False)``) keeps training while other cells
execute, so nothing of it may be written as "the current cell's" output: ipykernel routes a
stream or a ``display()`` by the parent message of whatever cell runs at that moment. A pane
therefore publishes only through two display ids of its own:

- the dashboard (a WidgetView given ``PaneDisplay``) inside a frame of the pane's own, a
  ``widgets.Output`` whose ``outputs`` the pane sets (widget state, synced over the widget's
  comm, so it lands nowhere else): the live dashboard, then its static final HTML;
- the ranks' output: a ``widgets.Output`` whose ``outputs`` the pane sets, the newest SHOWN
  lines, above it the stop buttons; at the end a static copy of the lines replaces both.

At the end each part is written twice. By ``update_display_data`` (routed by display id,
whatever cell executes): the pages that showed the run get static output, which a saved notebook
keeps without widgets. And into the frame and the box, which stay open: a page reloaded mid-run
renders the launching cell's saved output by its widget model id (the display id is never
saved, so ``update_display`` cannot reach it), and the final state reaches it by comm. Those
widgets are closed when ``nbtrain.runs()`` lets the run go (``release``).

``show()`` (from any cell, in the main thread) displays both with the same display ids, so every
appearance of the run updates together, and one shown after a browser reload picks up the live
widgets with everything so far. Outside Jupyter a pane shows nothing (``run.output()`` and the
log folder have the lines).
"""

from __future__ import annotations

import collections
import html
import threading
import uuid
from collections.abc import Callable
from typing import Any

from nbtrain.display.lines import SHOWN, static_lines
from nbtrain.shared.frontend import Frontend, frontend

WAITING = "nbtrain: starting the ranks in the background…"
CAPTION = (
    "running in the background: the kernel's stop button does not stop it; these buttons "
    "and run.stop() do"
)


class PaneStream:
    """A file-like sink for CellOutput: whole chunks of ``[rank r] line\\n`` text."""

    def __init__(self, pane: Pane, name: str) -> None:
        self._pane, self.name = pane, name

    def write(self, text: str) -> int:
        self._pane.add_text(self.name, text)
        return len(text)

    def flush(self) -> None:
        self._pane.publish()


class PaneDisplay:
    """A WidgetView's ``display=``: its bundles go to the pane's dashboard display id."""

    def __init__(self, pane: Pane) -> None:
        self._pane = pane

    def show(self, bundle: dict[str, Any]) -> None:
        self._pane.set_dashboard(bundle)

    def update(self, bundle: dict[str, Any]) -> None:
        self._pane.set_dashboard(bundle)


class Recorded:
    """A blocking launch's WidgetView display that keeps the last bundle (the final, static
    dashboard), so the run can show it again in another cell (after a browser reload)."""

    def __init__(self, keep: Callable[[dict[str, Any]], None]) -> None:
        from nbtrain.display.widgets import IPythonDisplay

        self._inner, self._keep = IPythonDisplay(), keep

    def show(self, bundle: dict[str, Any]) -> None:
        self._inner.show(bundle)

    def update(self, bundle: dict[str, Any]) -> None:
        self._keep(bundle)
        self._inner.update(bundle)


class Pane:
    """One background run's displays (see the module docstring). Thread-safe: the run's watch
    thread writes, any cell shows."""

    def __init__(
        self, on_stop: Callable[[bool], None] | None = None, can_save: bool = False
    ) -> None:
        """``on_stop(checkpoint)``: what the pane's stop buttons do (run.stop); ``can_save``:
        the run can stop with a checkpoint (on_interrupt='checkpoint')."""
        self.jupyter = frontend() is Frontend.JUPYTER
        self._lock = threading.Lock()
        key = uuid.uuid4().hex
        self._ids = (f"nbtrain-run-{key}", f"nbtrain-out-{key}")
        self._dashboard: dict[str, Any] = {"text/plain": WAITING, "text/html": html.escape(WAITING)}
        self._lines: collections.deque[tuple[str, str]] = collections.deque(maxlen=SHOWN)
        self._dirty = False
        self._ended = False
        self._out: Any = None
        self._box: Any = None
        self._frame: Any = None  # the dashboard's frame (widgets.Output)
        self._kept: tuple[Any, ...] = ()  # the ended pane's widgets, for reloaded pages
        if self.jupyter:
            self._build(on_stop, can_save)

    def _build(self, on_stop: Callable[[bool], None] | None, can_save: bool) -> None:
        import ipywidgets as widgets

        self._out = widgets.Output(layout=widgets.Layout(max_height="20em", overflow="auto"))
        self._out.add_class("nbtrain-run-output")
        # The kernel's stop button interrupts the cell that runs, never this run: say so, and
        # give the run's own stop here (its click arrives while the kernel is idle).
        caption = widgets.HTML(
            f'<span style="font-size:smaller;opacity:0.7">{html.escape(CAPTION)}</span>',
            layout=widgets.Layout(flex="1"),
        )
        buttons = []
        if on_stop is not None:
            for label, save in (("stop", False), ("stop and save", True))[: 2 if can_save else 1]:
                button = widgets.Button(description=label, layout=widgets.Layout(width="auto"))
                button.add_class("nbtrain-run-stop")
                button.on_click(lambda _b, save=save: on_stop(save))
                buttons.append(button)
        self._controls = widgets.HBox([caption, *buttons], layout=widgets.Layout(width="100%"))
        self._box = widgets.VBox([self._controls, self._out], layout=widgets.Layout(width="100%"))
        self._frame = widgets.Output(layout=widgets.Layout(width="100%"))
        self._frame.outputs = (_display_data(self._dashboard),)

    # -- the run's side (its watch thread) ---------------------------------------------------

    def set_dashboard(self, bundle: dict[str, Any]) -> None:
        with self._lock:
            self._dashboard = dict(bundle)
            frame = self._frame
        if frame is not None:  # every page that renders the frame, a reloaded one too
            frame.outputs = (_display_data(bundle),)
        else:
            self._update(self._ids[0], bundle)

    def add_text(self, stream: str, text: str) -> None:
        with self._lock:
            for line in text.splitlines():
                self._lines.append((stream, line))
            self._dirty = True

    def add_display(self, rank: int, text: str) -> None:
        """A rank's rich display in a background run: shown as its text form (its own display
        would land in whatever cell runs then)."""
        self.add_text("stdout", f"[rank {rank}] {text}")

    def publish(self) -> None:
        """Send the lines that arrived since the last call to every appearance of the pane."""
        with self._lock:
            if not self._dirty or self._out is None:
                self._dirty = False
                return
            self._dirty = False
            outputs = self._outputs()
        self._out.outputs = outputs

    def end(self) -> None:
        """The run ended: the final dashboard and the lines become static output (a saved
        notebook keeps them, no widget state needed); the frame and the box keep them too, for
        a page reloaded mid-run (see the module docstring)."""
        self.publish()
        with self._lock:
            self._ended = True
            dashboard, lines = dict(self._dashboard), self._static_output()
        self._update(self._ids[0], dashboard)
        self._update(self._ids[1], lines)
        if self._box is None:
            return
        import ipywidgets as widgets

        from nbtrain.display.closing import close_widget

        final = widgets.HTML(lines["text/html"], layout=widgets.Layout(width="100%"))
        self._box.children = (final,)
        for widget in (*self._controls.children, self._controls, self._out):
            close_widget(widget)
        self._out = None
        self._kept = (self._frame, self._box, final)

    def release(self) -> None:
        """Close the widgets kept for reloaded pages (the run is let go); idempotent."""
        if not self._kept:
            return
        from nbtrain.display.closing import close_widget

        for widget in self._kept:
            close_widget(widget)
        self._kept = ()
        self._frame = self._box = None

    # -- any cell --------------------------------------------------------------------------------

    def show(self) -> None:
        """Display the run here (the current cell): both parts, with the run's display ids."""
        if not self.jupyter:
            return
        from IPython.display import display

        with self._lock:
            dashboard = self._dashboard_bundle()
            lines = self._output_bundle()
        display(dashboard, raw=True, display_id=self._ids[0])
        display(lines, raw=True, display_id=self._ids[1])

    def _dashboard_bundle(self) -> dict[str, Any]:
        if self._ended or self._frame is None:
            return dict(self._dashboard)
        bundle = dict(self._frame._repr_mimebundle_())
        bundle["text/plain"] = self._dashboard.get("text/plain", WAITING)
        return bundle

    def _output_bundle(self) -> dict[str, Any]:
        if self._ended or self._box is None:
            return self._static_output()
        bundle = dict(self._box._repr_mimebundle_())
        bundle["text/plain"] = f"{len(self._lines)} output line(s)"
        return bundle

    def _static_output(self) -> dict[str, Any]:
        return static_lines([line for _, line in self._lines])

    def _outputs(self) -> tuple[dict[str, Any], ...]:
        outputs: list[dict[str, Any]] = []
        for stream, line in self._lines:  # consecutive lines of a stream: one output
            if outputs and outputs[-1]["name"] == stream:
                outputs[-1]["text"] += line + "\n"
            else:
                outputs.append({"output_type": "stream", "name": stream, "text": line + "\n"})
        return tuple(outputs)

    def _update(self, display_id: str, bundle: dict[str, Any]) -> None:
        if not self.jupyter:
            return
        from IPython.display import update_display

        update_display(bundle, raw=True, display_id=display_id)


def _display_data(bundle: dict[str, Any]) -> dict[str, Any]:
    return {"output_type": "display_data", "data": dict(bundle), "metadata": {}}


__all__ = ["SHOWN", "Pane", "PaneDisplay", "PaneStream", "Recorded", "static_lines"]
