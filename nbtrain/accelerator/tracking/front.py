"""What the Accelerator delegates its tracker methods to (core.py stays a thin front end)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nbtrain.accelerator.tracking import runs
from nbtrain.accelerator.tracking.choose import choose
from nbtrain.rank import runtime

if TYPE_CHECKING:
    from nbtrain.accelerator.checkpoint.stopping import Stops


class Tracking:
    """One Accelerator's view of the process's tracker run."""

    def __init__(self, log_with: Any, logging_dir: str | None) -> None:
        self.chosen = choose(log_with, logging_dir)  # checked now: before training starts
        self.logging_dir = logging_dir
        self.ended: list[Any] = []  # the trackers of the run end() finished, as Accelerate keeps
        if self.chosen and runs.active() is not None:  # a warm rank's later cell
            runs.active().announce()  # type: ignore[union-attr]

    def trackers(self, main: bool) -> list[Any]:
        if not main:
            return []
        run = runs.active()
        return list(run.trackers) if run is not None else list(self.ended)

    def init(
        self,
        project_name: str | None,
        config: dict[str, Any] | None,
        init_kwargs: dict[str, Any] | None,
        *,
        main: bool,
        stops: Stops,
    ) -> None:
        self._check_project_name(project_name)
        if init_kwargs is not None and not isinstance(init_kwargs, dict):
            raise TypeError(
                f"init_trackers(init_kwargs={init_kwargs!r}) must be a dict of tracker name to "
                "its arguments, e.g. {'wandb': {'tags': ['a']}}."
            )
        if not main or not self.chosen:
            return
        resumed = stops.resume.tracker_runs() if stops.resume is not None else None
        runs.start(project_name, self.chosen, self.logging_dir, config, init_kwargs, resumed)

    def _check_project_name(self, project_name: Any) -> None:
        """A non-empty string, or None when every tracker is an instance the user built (it
        has its names already; Accelerate accepts None there)."""
        if isinstance(project_name, str) and project_name:
            return
        named = [choice for choice in self.chosen if isinstance(choice, str)]
        if project_name is None and not named:
            return
        if project_name is None:
            raise ValueError(
                f"init_trackers(project_name=None): the trackers {', '.join(map(repr, named))} "
                "are built by init_trackers and named after the project: pass a name, e.g. "
                "init_trackers('my_project') (None is for trackers you built yourself)."
            )
        raise ValueError(
            f"init_trackers(project_name={project_name!r}) must be a non-empty string, "
            "e.g. init_trackers('my_project')."
        )

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

    def shown_outside_a_launch(self) -> bool:
        """Whether ``log`` also shows the values: always in a launch (the live view); outside
        one only in a text bar the user's ``progress()`` draws, not as a printed line."""
        from nbtrain.rank.textbar import bar_running

        return runtime.current() is not None or bar_running()

    def get(self, name: str, unwrap: bool, *, main: bool) -> Any:
        return runs.get(name, unwrap, main)

    def end(self) -> None:
        run = runs.end()
        if run is not None:
            self.ended = list(run.trackers)
