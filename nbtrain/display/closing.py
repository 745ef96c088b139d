"""Closing a widget with the models it made: its layout and its style are comms of their own."""

from __future__ import annotations

import ipywidgets as widgets


def close_widget(widget: widgets.Widget) -> None:
    # A widget's layout and style are models (comms) of their own; close() leaves them open.
    for part in (getattr(widget, "layout", None), getattr(widget, "style", None)):
        if isinstance(part, widgets.Widget):
            part.close()
    widget.close()
