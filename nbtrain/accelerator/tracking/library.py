"""nbtrain's trackers: each calls its library (never writes the library's files itself).

Each runs on the main process only and adds to Accelerate's interface:

- ``continue_run(identity, steps)``: before ``start()``, when the launch resumes a checkpoint
  that saved ``identity``: reopen that run (same W&B run id, MLflow run id, TensorBoard
  directory, trackio run, Aim run hash, Comet experiment key) at optimizer step ``steps``;
- ``identity()``: what a checkpoint saves to find the run again;
- ``where()``: where the run is recorded, for the dashboard's summary;
- ``finish(ending)``: how the launch ended, in the library's own terms where it has them
  (MLflow's run status FINISHED / KILLED / FAILED, W&B's exit code 0 / 255 / 1); the others
  (TensorBoard, trackio, Aim, Comet) have no run status to set.

A library that is not installed is reported when the Accelerator is built (``choose.py``),
with the pip command that installs it.
"""

from __future__ import annotations

import numbers
import os
from typing import Any, ClassVar, Literal

from nbtrain.accelerator.tracking.base import GeneralTracker, on_main_process

Ending = Literal["finished", "killed", "failed"]  # returned / stopped by the user / raised


# The methods Accelerate decorates with on_main_process in its trackers.
MAIN_ONLY = (
    "start", "store_init_configuration", "log", "log_images", "log_table", "log_figure",
    "log_artifact", "log_artifacts", "finish",
)


class LibraryTracker(GeneralTracker):
    """A tracker backed by an installed library."""

    name: ClassVar[str]
    requires_logging_directory: ClassVar[bool] = False
    module: ClassVar[str]  # what must import
    pip: ClassVar[str]  # what installs it
    # Built by name with the Accelerator's logging_dir (Accelerate's trackers that write files
    # there); False: with the project's name alone, as Accelerate builds MLflow's, ClearML's,
    # DVCLive's and SwanLab's.
    takes_logging_dir: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # An instance the user builds on every rank (log_with=MLflowTracker(...)) calls its
        # library on the main process only, whoever calls it, as Accelerate's trackers do.
        super().__init_subclass__(**kwargs)
        for method in MAIN_ONLY:
            function = cls.__dict__.get(method)
            if function is not None and not getattr(function, "main_only", False):
                setattr(cls, method, on_main_process(function))

    def __init__(self, run_name: str, logging_dir: str | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.logging_dir = logging_dir
        self.init_kwargs = kwargs
        self.previous: dict[str, Any] | None = None  # the run a resumed launch continues
        self.resumed_steps = 0

    @classmethod
    def by_name(
        cls, project_name: str, logging_dir: str | None, kwargs: dict[str, Any]
    ) -> LibraryTracker:
        """The tracker ``log_with=<name>`` makes: ``init_kwargs[name]`` are its keywords."""
        if not cls.takes_logging_dir:
            return cls(project_name, **kwargs)
        return cls(project_name, logging_dir, **kwargs)

    def continue_run(self, identity: dict[str, Any], steps: int) -> None:
        self.previous, self.resumed_steps = dict(identity), steps

    def identity(self) -> dict[str, Any]:
        return {}

    def where(self) -> str:
        return self.name

    def finish(self, ending: Ending = "finished") -> None:
        """Close the run; ``ending``: how the launch's function ended."""


def scalars(values: dict[str, Any]) -> dict[str, float | int]:
    """The numeric values (one-element tensors and NumPy scalars as Python numbers)."""
    out: dict[str, float | int] = {}
    for key, value in values.items():
        item = getattr(value, "item", None)
        if item is not None and not isinstance(value, numbers.Number):
            value = item()
        if isinstance(value, numbers.Number) and not isinstance(value, bool):
            out[key] = value if isinstance(value, int) else float(value)  # type: ignore[arg-type]
    return out


class TensorBoardTracker(LibraryTracker):
    """torch's ``SummaryWriter`` into ``<logging_dir>/<project_name>``. A resumed run writes into
    the same directory with ``purge_step`` at its first new step, so TensorBoard drops anything
    an earlier launch logged past the checkpoint (e.g. after a crash): no step twice.

    :param run_name: the project name (a subfolder of ``logging_dir``).
    :param logging_dir: where the event files go.
    """

    name = "tensorboard"
    requires_logging_directory = True
    module = "tensorboard"
    pip = "tensorboard"

    def start(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        assert self.logging_dir is not None  # choose.py refuses tensorboard without one
        self.log_dir = os.path.join(self.logging_dir, self.run_name)
        kwargs = dict(self.init_kwargs)
        if self.previous is not None:
            self.log_dir = self.previous.get("log_dir", self.log_dir)
            kwargs.setdefault("purge_step", self.resumed_steps + 1)
        self.writer = SummaryWriter(self.log_dir, **kwargs)

    @property
    def tracker(self) -> Any:
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.writer.add_hparams(values, metric_dict={})
        self.writer.flush()

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        numeric = scalars(values)
        for key, value in values.items():
            if key in numeric:
                self.writer.add_scalar(key, numeric[key], global_step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, dict):
                self.writer.add_scalars(key, scalars(value), global_step=step, **kwargs)
        self.writer.flush()

    def finish(self, ending: Ending = "finished") -> None:
        self.writer.close()

    def identity(self) -> dict[str, Any]:
        return {"log_dir": self.log_dir}

    def where(self) -> str:
        return f"TensorBoard {self.log_dir}"


# W&B's exit codes (255: what wandb records for Ctrl-C itself)
_WANDB_EXIT_CODE = {"finished": 0, "killed": 255, "failed": 1}


class WandBTracker(LibraryTracker):
    """``wandb.init(project=project_name)`` (offline with ``WANDB_MODE=offline`` or
    ``init_kwargs={"wandb": {"mode": "offline"}}``); its files go to ``logging_dir`` when one is
    set. A resumed launch reopens the same run id (``resume="allow"``) and goes on from the
    checkpoint's W&B step: offline, W&B itself would count from 0 again, and ``wandb sync`` would
    then drop those rows as older than the run's last.

    :param run_name: the W&B project.
    """

    name = "wandb"
    module = "wandb"
    pip = "wandb"
    counts_own_steps = True  # W&B's _step: a row per log() call, as in Accelerate

    def start(self) -> None:
        import wandb

        kwargs = dict(self.init_kwargs)
        if self.logging_dir is not None:
            os.makedirs(self.logging_dir, exist_ok=True)
            kwargs.setdefault("dir", self.logging_dir)
        if self.previous is not None:
            kwargs["id"] = self.previous["id"]
            kwargs.setdefault("resume", "allow")
        self.run = wandb.init(project=self.run_name, **kwargs)
        self.next_step: int | None = None  # set while nbtrain counts for W&B (see log)
        saved = (self.previous or {}).get("step", 0)
        if saved > self.run.step:  # offline: W&B does not know where the run got to
            self.next_step = saved

    @property
    def tracker(self) -> Any:
        return self.run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.run.config.update(values, allow_val_change=True)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        if self.next_step is not None:  # counting on from the checkpoint, as W&B would
            step = self.next_step if step is None else step
            self.next_step = step + 1
        self.run.log(values, step=step, **kwargs)

    def finish(self, ending: Ending = "finished") -> None:
        import wandb

        self.run.finish(exit_code=_WANDB_EXIT_CODE[ending])
        if wandb.run is None:  # no other run uses it: end W&B's service process, which would
            wandb.teardown()  # outlive the launch in the kernel (num_processes=1) or a warm rank

    def identity(self) -> dict[str, Any]:
        step = self.run.step if self.next_step is None else self.next_step  # the next row's
        return {"id": self.run.id, "step": step}

    def where(self) -> str:
        url = getattr(self.run, "url", None)  # None offline: the run's own directory
        return f"W&B run {self.run.id} ({url or os.path.dirname(self.run.dir)})"


class TrackioTracker(LibraryTracker):
    """``trackio.init(project=project_name)``, local (``TRACKIO_DIR``) unless a Space or server
    is named. ``embed`` defaults to False: a rank starts no dashboard server of its own.

    :param run_name: the trackio project.
    :param logging_dir: accepted as in Accelerate; ``TRACKIO_DIR`` decides where runs go.
    """

    name = "trackio"
    module = "trackio"
    pip = "trackio"
    counts_own_steps = True  # as W&B

    def start(self) -> None:
        import trackio

        kwargs = dict(self.init_kwargs)
        kwargs.setdefault("embed", False)
        if self.previous is not None:
            kwargs["name"] = self.previous["name"]
            kwargs["resume"] = "must"
        self.run = trackio.init(project=self.run_name, **kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        import trackio

        trackio.config.update(values, allow_val_change=True)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.run.log(values, step=step, **kwargs)

    def finish(self, ending: Ending = "finished") -> None:
        self.run.finish()

    def identity(self) -> dict[str, Any]:
        return {"name": self.run.name}

    def where(self) -> str:
        from trackio.utils import TRACKIO_DIR

        return f"trackio run {self.run.name} of project {self.run_name} ({TRACKIO_DIR})"


class AimTracker(LibraryTracker):
    """An ``aim.Run`` in the Aim repository at ``logging_dir``, experiment ``project_name``.

    :param run_name: the Aim experiment.
    :param logging_dir: the Aim repository's folder.
    """

    name = "aim"
    requires_logging_directory = True
    module = "aim"
    pip = "aim"

    def start(self) -> None:
        from aim import Run

        kwargs = dict(self.init_kwargs)
        kwargs.setdefault("experiment", self.run_name)
        kwargs.setdefault("repo", self.logging_dir)  # Accelerate's AimTracker(name, repo=...)
        if self.previous is not None:
            kwargs["run_hash"] = self.previous["run_hash"]
        self.repo = kwargs["repo"]
        self.writer = Run(**kwargs)

    @property
    def tracker(self) -> Any:
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.writer["hparams"] = values

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        for key, value in scalars(values).items():
            self.writer.track(value, name=key, step=step, **kwargs)

    def finish(self, ending: Ending = "finished") -> None:
        self.writer.close()

    def identity(self) -> dict[str, Any]:
        return {"run_hash": self.writer.hash}

    def where(self) -> str:
        return f"Aim run {self.writer.hash} ({self.repo})"


class CometMLTracker(LibraryTracker):
    """``comet_ml.start(project_name=project_name)`` (offline with ``online=False`` or
    ``COMET_START_ONLINE=false``); a resumed launch passes the same experiment key.

    :param run_name: the Comet project.
    :param logging_dir: accepted as in Accelerate; Comet's own settings decide where runs go.
    """

    name = "comet_ml"
    module = "comet_ml"
    pip = "comet_ml"

    def start(self) -> None:
        import comet_ml

        kwargs = dict(self.init_kwargs)
        if self.previous is not None:
            kwargs["experiment_key"] = self.previous["experiment_key"]
        self.writer = comet_ml.start(project_name=self.run_name, **kwargs)

    @property
    def tracker(self) -> Any:
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.writer.log_parameters(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        numeric = scalars(values)
        if numeric:
            self.writer.log_metrics(numeric, step=step, **kwargs)
        for key, value in values.items():
            if isinstance(value, str):
                self.writer.log_other(key, value)

    def finish(self, ending: Ending = "finished") -> None:
        self.writer.end()

    def identity(self) -> dict[str, Any]:
        return {"experiment_key": self.writer.get_key()}

    def where(self) -> str:
        return f"Comet experiment {self.writer.get_key()}"
