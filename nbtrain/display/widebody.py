"""The live widgets of a wide run's dashboard: the rows of groups and the rank selector.

The rows are one HTML widget (wide.py's markup, redrawn at most every wide.EVERY seconds: one
message per redraw whatever the number of ranks); the selector ("see one rank") sits in the
dashboard's header and its choice reaches the kernel while the cell is busy through the launch's
comm pump, as the "where?" button's click does. Charts are bands (bandchart.py).
"""

from __future__ import annotations

import ipywidgets as widgets

from nbtrain.display import bandchart
from nbtrain.display.runstate import RunState
from nbtrain.display.wide import NOT_SELECTED, Throttle, wide_html

MAX_CHARTS = 3
CHART_EVERY = 1.0  # seconds between the band charts' redraws (a message of a few KB each)


class WideBody:
    def __init__(self, state: RunState) -> None:
        self.rows = widgets.HTML(
            layout=widgets.Layout(width="100%"), _dom_classes=("nbtrain-wide-rows",)
        )
        options = [("see one rank…", NOT_SELECTED)] + [
            (f"rank {rank}", rank) for rank in sorted(state.ranks)
        ]
        self.selector = widgets.Dropdown(
            options=options,
            value=NOT_SELECTED,
            tooltip="Show one rank's own row under the groups",
            layout=widgets.Layout(width="auto", flex="0 0 auto"),
            _dom_classes=("nbtrain-rank-selector",),
        )
        self.bands = bandchart.Bands(state)
        self._throttle = Throttle()
        self._charts = Throttle(CHART_EVERY)
        self._chart_markup = ""
        self._shown_selection = NOT_SELECTED

    @property
    def selected(self) -> int | None:
        value = self.selector.value
        return None if value == NOT_SELECTED else int(value)

    def draw(self, state: RunState, *, final: bool = False) -> None:
        changed = self.selector.value != self._shown_selection
        if not self._throttle.due(force=final or changed):
            return
        self._shown_selection = self.selector.value
        markup = self.html(state)
        if markup != self.rows.value:
            self.rows.value = markup

    def html(self, state: RunState) -> str:
        return wide_html(state, self.selected)

    def charts_html(self, state: RunState, *, final: bool = False) -> str:
        """Band charts of the first metrics logged, with their legend ('' before any); the
        last markup again until CHART_EVERY passed (``final``: drawn now)."""
        if self._charts.due(force=final):
            self._chart_markup = self._draw_charts(state)
        return self._chart_markup

    def _draw_charts(self, state: RunState) -> str:
        names = self.bands.drawable()[:MAX_CHARTS]
        if not names:
            return ""
        count = len(state.ranks)
        charts = "".join(
            bandchart.band_image(name, self.bands.series[name], count) for name in names
        )
        return (
            f'<div style="font-size:11px">{bandchart.legend(count)}</div>'
            f'<div style="display:flex;flex-wrap:wrap;gap:8px">{charts}</div>'
        )

    def comm_ids(self) -> set[str]:
        comm = getattr(self.selector, "comm", None)
        return set() if comm is None else {comm.comm_id}

    def widgets(self) -> list[widgets.Widget]:
        return [self.rows, self.selector]
