"""``DVCLiveTracker``: a ``dvclive.Live``, built as Accelerate builds it (``DVCLiveTracker(
run_name, live=None, **Live keywords)``: the name is not used; ``dir=`` says where its files go,
``dvclive/`` in the working directory by default). DVCLive counts its steps itself: ``log``
without a step records the next one. A resumed launch reopens the same directory with DVCLive's
``resume=True``, which goes on from its last step."""

from __future__ import annotations

from typing import Any

from nbtrain.accelerator.tracking.library import Ending, LibraryTracker, scalars


class DVCLiveTracker(LibraryTracker):
    """A ``dvclive.Live`` run (see the module docstring).

    :param run_name: not used, as in Accelerate (``dir=`` in ``kwargs`` says where the files go).
    :param live: a ``dvclive.Live`` of the user's own, used as it is; ``kwargs`` go to ``Live``.
    """

    name = "dvclive"
    module = "dvclive"
    pip = "dvclive"
    takes_logging_dir = False
    counts_own_steps = True

    def __init__(self, run_name: str | None = None, live: Any = None, **kwargs: Any) -> None:
        super().__init__(run_name or "", None, **kwargs)
        self.live = live  # the user's own Live, if given


    def start(self) -> None:
        from dvclive import Live

        if self.live is not None:
            return
        kwargs = dict(self.init_kwargs)
        if self.previous is not None:
            kwargs["dir"], kwargs["resume"] = self.previous["dir"], True
        self.live = Live(**kwargs)

    @property
    def tracker(self) -> Any:
        return self.live

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.live.log_params(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers (tensors too) and text, as DVCLive's metrics; then DVCLive's next step."""
        from dvclive.plots import Metric

        if step is not None:
            self.live.step = step
        numbers = scalars(values)
        for key, value in values.items():
            value = numbers.get(key, value)
            if Metric.could_log(value):
                self.live.log_metric(key, value, **kwargs)
        self.live.next_step()

    def finish(self, ending: Ending = "finished") -> None:
        self.live.end()

    def identity(self) -> dict[str, Any]:
        return {"dir": self.live.dir}

    def where(self) -> str:
        return f"DVCLive {self.live.dir}"
