"""A blocking launch's dashboard for a page opened while its cell runs (a browser reload).

A page reloaded mid-launch draws the launching cell's saved output by widget model id and gets
the dashboard's state from the launch's own loop (commpump.py). What the cell writes after that
never reaches it: the ranks' lines are stream output and the final dashboard an
``update_display``, routed by the cell's parent message and a display id, neither of which a
reloaded page knows (a display id is never saved in the ``.ipynb``).

So, once a page has asked for the widgets' state, the dashboard carries the ranks' newest lines
in a widget of its own (``ReloadedPages.lines``, redrawn at most every LINES_EVERY seconds), and
at the end, instead of closing every widget, keeps its box open with the final dashboard and
those lines as one static HTML: what the page that ran the cell gets as static output, a
reloaded page gets through the widget. The box is closed when ``nbtrain.runs()`` lets the run go
(``Run.release``). A page that ran the cell and is still open sees the lines written since then
twice (its stream, and the copy).
"""

from __future__ import annotations

import collections

import ipywidgets as widgets

from nbtrain.display.closing import close_widget
from nbtrain.display.lines import SHOWN, static_lines
from nbtrain.display.wide import Throttle

LINES_EVERY = 0.25  # seconds between redraws of the copied lines (as the rows': four a second)


class ReloadedPages:
    """The copy of the cell's newest lines, and the final view kept for reloaded pages."""

    def __init__(self) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=SHOWN)
        self._dirty = False
        self._due = Throttle(LINES_EVERY)
        self.lines = widgets.HTML(layout=widgets.Layout(width="100%"))
        self.kept: tuple[widgets.Widget, ...] = ()

    def write(self, text: str) -> None:
        """What the cell got (CellOutput's copy): whole lines."""
        self._lines.extend(text.splitlines())
        self._dirty = True

    def draw(self, *, now: bool = False) -> None:
        if self._dirty and self._due.due(force=now):
            self._dirty = False
            self.lines.value = self.lines_html()

    def lines_html(self) -> str:
        return str(static_lines(list(self._lines))["text/html"]) if self._lines else ""

    def keep(self, box: widgets.Box, final_html: str) -> None:
        """The launch ended: ``box`` shows ``final_html`` and the lines, and stays open."""
        final = widgets.HTML(final_html + self.lines_html(), layout=widgets.Layout(width="100%"))
        box.children = (final,)
        close_widget(self.lines)
        self.kept = (box, final)

    def release(self) -> None:
        """Close what was kept (the run is let go); idempotent."""
        for widget in self.kept:
            close_widget(widget)
        self.kept = ()
