"""Numbers as short text (durations, metric values): the same in the kernel's views and in a
rank's text bar outside a launch."""

from __future__ import annotations

import math

MAX_METRICS = 4  # metrics shown per rank; more would not fit a row


def format_duration(seconds: float) -> str:
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_value(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def format_metrics(values: dict[str, float], limit: int = MAX_METRICS) -> str:
    return " ".join(f"{name} {format_value(value)}" for name, value in list(values.items())[:limit])
