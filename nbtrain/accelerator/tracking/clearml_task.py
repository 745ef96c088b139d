"""``ClearMLTracker``: a ClearML task, built as Accelerate builds it (``ClearMLTracker(run_name,
**Task.init keywords)``; ``CLEARML_PROJECT`` / ``CLEARML_TASK`` name the project and the task
unless the keywords do). A task the user's code already started (``Task.init`` before
``init_trackers``) is recorded to and left open for the user to close. Offline with
``Task.set_offline(True)`` or ``CLEARML_OFFLINE_MODE=1`` (the session folder under
``CLEARML_CACHE_DIR``). A resumed launch starts a new task."""

from __future__ import annotations

from typing import Any

from nbtrain.accelerator.tracking.library import Ending, LibraryTracker, scalars
from nbtrain.rank import rankenv


class ClearMLTracker(LibraryTracker):
    """Values logged with a step are scalars of the series "train" (or "eval" / "test" for a
    name starting ``eval_`` / ``test_`` / ``train_``, that prefix taken off); values logged
    without one are ClearML's single values (its run summary), as in Accelerate.

    :param run_name: the ClearML project and task name (``CLEARML_PROJECT`` / ``CLEARML_TASK``
        win, as in Accelerate); ``kwargs`` go to ``Task.init``.
    """

    name = "clearml"
    module = "clearml"
    pip = "clearml"
    takes_logging_dir = False
    # Not a counter of its own: without a step a value is a single value (Accelerate's way),
    # which an optimizer step would turn into a one-point series.
    counts_own_steps = True

    def __init__(self, run_name: str | None = None, **kwargs: Any) -> None:
        super().__init__(run_name or "", None, **kwargs)
        self.project_name = run_name
        self.task: Any = None
        self.external = False  # the user's own task: not ours to close


    def start(self) -> None:
        from clearml import Task

        current: Any = Task.current_task()
        if current is not None:
            self.task, self.external = current, True
            return
        _report_from_threads()
        kwargs = dict(self.init_kwargs)
        kwargs.setdefault("project_name", rankenv.variable("CLEARML_PROJECT") or self.project_name)
        kwargs.setdefault("task_name", rankenv.variable("CLEARML_TASK") or self.project_name)
        self.task = Task.init(**kwargs)

    @property
    def tracker(self) -> Any:
        return self.task

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.task.connect_configuration(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        logger = self.task.get_logger()
        for key, value in scalars(values).items():
            if step is None:
                logger.report_single_value(name=key, value=value, **kwargs)
                continue
            title, series = title_and_series(key)
            logger.report_scalar(title=title, series=series, value=value, iteration=step, **kwargs)

    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Each value an image (a NumPy array or a PIL image), titled as ``log`` titles."""
        logger = self.task.get_logger()
        for key, image in values.items():
            title, series = title_and_series(key)
            logger.report_image(title=title, series=series, iteration=step, image=image, **kwargs)

    def log_table(
        self,
        table_name: str,
        columns: list[str] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        """A table from ``dataframe`` (pandas), or from ``data`` rows under ``columns`` (the
        first row of ``data`` when ``columns`` is not given)."""
        table = dataframe
        if table is None:
            if data is None:
                raise ValueError(
                    f"ClearMLTracker.log_table({table_name!r}) needs the table: pass "
                    "dataframe=<a pandas DataFrame> or data=[[...], ...] (and columns=[...])."
                )
            table = [columns, *data] if columns else data
        title, series = title_and_series(table_name)
        self.task.get_logger().report_table(
            title=title, series=series, table_plot=table, iteration=step, **kwargs
        )

    def finish(self, ending: Ending = "finished") -> None:
        if self.task is not None and not self.external:
            self.task.close()

    def where(self) -> str:
        return f"ClearML task {self.task.id}"


def _report_from_threads() -> None:
    """On Linux ClearML's Task.init forks its reporter (os.fork, no exec) while a thread of its
    own runs git to detect the repository: the forked reporter can inherit that git call's pipe,
    which then never closes, and Task.close() waits for the detection forever (seen in 2-rank
    launches, a rank being a process with threads). Unless the user's ClearML configuration says
    otherwise (sdk.development.report_use_subprocess), report from threads, as ClearML does on
    the other systems."""
    from clearml.backend_interface.task.task import Task as TaskBase
    from clearml.config import ConfigSDKWrapper

    if ConfigSDKWrapper.get("development.report_use_subprocess", None) is None:
        TaskBase._report_subprocess_enabled = False  # type: ignore[assignment]


def title_and_series(name: str) -> tuple[str, str]:
    """ClearML's plot title and series of a value's name."""
    for series in ("eval", "test", "train"):
        if name.startswith(series + "_"):
            return name[len(series) + 1 :], series
    return name, "train"
