"""What the Accelerator delegates its tracker methods to (core.py stays a thin front end)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nbtrain.accelerator.tracking import runs
from nbtrain.accelerator.tracking.choose import choose

if TYPE_CHECKING:
    from nbtrain.accelerator.checkpoint.stopping import Stops


class Tracking:
    """One Accelerator's view of the process's tracker run."""

    def __init__(self, log_with: Any, logging_dir: str | None) -> None:
        self.chosen = choose(log_with, logging_dir)  # checked now: before training starts
        self.logging_dir = logging_dir
        if self.chosen and runs.active() is not None:  # a warm rank's later cell
            runs.active().announce()  # type: ignore[union-attr]

    def trackers(self, main: bool) -> list[Any]:
        run = runs.active()
        return list(run.trackers) if main and run is not None else []

    def init(
        self,
        project_name: str,
        config: dict[str, Any] | None,
        init_kwargs: dict[str, Any] | None,
        *,
        main: bool,
        stops: Stops,
    ) -> None:
        if not isinstance(project_name, str) or not project_name:
            raise ValueError(
                f"init_trackers(project_name={project_name!r}) must be a non-empty string, "
                "e.g. init_trackers('my_project')."
            )
        if init_kwargs is not None and not isinstance(init_kwargs, dict):
            raise TypeError(
                f"init_trackers(init_kwargs={init_kwargs!r}) must be a dict of tracker name to "
                "its arguments, e.g. {'wandb': {'tags': ['a']}}."
            )
        if not main or not self.chosen:
            return
        resumed = stops.resume.tracker_runs() if stops.resume is not None else None
        runs.start(project_name, self.chosen, self.logging_dir, config, init_kwargs, resumed)

    def log(
        self,
        values: dict[str, Any],
        step: int | None,
        log_kwargs: dict[str, Any] | None,
        *,
        main: bool,
    ) -> None:
        if main:
            runs.log(values, step, log_kwargs)

    def get(self, name: str, unwrap: bool, *, main: bool) -> Any:
        return runs.get(name, unwrap, main)

    def end(self) -> None:
        runs.end()
