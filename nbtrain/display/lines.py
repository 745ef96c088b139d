"""Rank lines as static output: a background pane, a reloaded page's copy, a run shown again."""

from __future__ import annotations

import html
from typing import Any

SHOWN = 200  # rank lines a view shows (the newest); run.output() and the log folder keep more


def static_lines(lines: list[str]) -> dict[str, Any]:
    """Rank lines as static output (text and a scrolling block)."""
    text = "\n".join(lines)
    return {
        "text/plain": text,
        "text/html": (
            '<pre class="nbtrain-run-output" style="max-height:20em;overflow:auto">'
            f"{html.escape(text)}</pre>"
        ),
    }
