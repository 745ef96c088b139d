"""What a run keeps of its ranks' logged values (``run.metrics``): every point with its rank
and step, unthinned (the view's RunState thins long histories for its charts)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KEPT_METRICS = 100_000  # logged values a run keeps for .metrics (~10 MB), the newest


@dataclass(frozen=True)
class Metric:
    """One logged value."""

    rank: int
    step: int
    name: str
    value: float


class Metrics(list[Metric]):
    """Every value the ranks logged, in arrival order (``rank``, ``step``, ``name``, ``value``);
    the newest KEPT_METRICS."""

    def records(self) -> list[dict[str, Any]]:
        return [
            {"rank": m.rank, "step": m.step, "name": m.name, "value": m.value} for m in self
        ]

    def to_pandas(self) -> Any:
        """A DataFrame with columns rank, step, name, value (pandas must be installed)."""
        try:
            import pandas
        except ImportError:
            raise ImportError(
                "run.metrics.to_pandas() needs pandas: pip install pandas "
                "(run.metrics.records() gives the same rows as dicts)"
            ) from None
        return pandas.DataFrame(self.records(), columns=["rank", "step", "name", "value"])


__all__ = ["KEPT_METRICS", "Metric", "Metrics"]
