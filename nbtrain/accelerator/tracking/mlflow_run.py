"""``MLflowTracker``, built as Accelerate builds it: ``MLflowTracker(experiment_name=...,
logging_dir=..., run_id=..., tags=..., nested_run=..., run_name=..., description=...)``, the
``MLFLOW_EXPERIMENT_NAME`` / ``MLFLOW_RUN_ID`` / ``MLFLOW_TAGS`` / ``MLFLOW_NESTED_RUN``
variables winning over those arguments, as in Accelerate. ``log_with="mlflow"`` builds it with the
project name as ``experiment_name`` and ``init_kwargs["mlflow"]`` as its keywords.

What nbtrain adds: a resumed launch continues the checkpoint's run (its run id), the run ends as
the launch did (FINISHED / KILLED / FAILED), tensors and NumPy scalars are logged as numbers, and
other keywords go to ``mlflow.start_run`` (e.g. ``log_system_metrics``).
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

from nbtrain.accelerator.tracking.library import Ending, LibraryTracker, scalars
from nbtrain.rank import rankenv

_STATUS = {"finished": "FINISHED", "killed": "KILLED", "failed": "FAILED"}  # MLflow's RunStatus


class MLflowTracker(LibraryTracker):
    """An MLflow run on MLflow's tracking URI (``MLFLOW_TRACKING_URI``; MLflow's default is
    ``sqlite:///mlflow.db`` in the working directory), in ``experiment_name`` (created with
    ``logging_dir`` as its artifact location and ``tags`` when it does not exist yet; MLflow's
    default experiment when no name is given). Accelerate's ``MLFLOW_*`` variables win over the
    arguments, as in Accelerate.

    :param experiment_name: the MLflow experiment (``MLFLOW_EXPERIMENT_NAME``).
    :param logging_dir: the artifact location of a new experiment.
    :param run_id: an existing run to log into (``MLFLOW_RUN_ID``).
    :param tags: tags of a new experiment, a dict or JSON text (``MLFLOW_TAGS``).
    :param nested_run: start the run nested in the active one (``MLFLOW_NESTED_RUN``).
    :param run_name: the MLflow run's name.
    :param description: the run's description.
    """

    name = "mlflow"
    module = "mlflow"
    pip = "mlflow"
    # By name, as in Accelerate: the project is the experiment; artifacts stay where MLflow
    # puts them.
    takes_logging_dir = False

    def __init__(
        self,
        experiment_name: str | None = None,
        logging_dir: str | os.PathLike[str] | None = None,
        run_id: str | None = None,
        tags: dict[str, Any] | str | None = None,
        nested_run: bool | str = False,
        run_name: str | None = None,
        description: str | None = None,
        **start_run: Any,
    ) -> None:
        experiment_name = _variable("MLFLOW_EXPERIMENT_NAME", experiment_name)
        super().__init__(experiment_name or "", None if logging_dir is None else str(logging_dir))
        self.experiment_name = experiment_name
        self.run_id = _variable("MLFLOW_RUN_ID", run_id)
        tags = _variable("MLFLOW_TAGS", tags)
        self.tags = json.loads(tags) if isinstance(tags, str) else tags
        nested = _variable("MLFLOW_NESTED_RUN", nested_run)
        self.nested_run = _true(nested) if isinstance(nested, str) else bool(nested)
        # Accelerate's attribute: the MLflow run's name (the base class's is the project's)
        self.run_name = run_name  # type: ignore[assignment]
        self.description = description
        self.start_run = start_run
        self.active_run: Any = None


    def start(self) -> None:
        import mlflow

        run_id = self.previous["run_id"] if self.previous is not None else self.run_id
        name = self.experiment_name
        self.active_run = mlflow.start_run(
            run_id=run_id,
            experiment_id=self._experiment_id(name) if name else None,  # None: MLflow's default
            run_name=None if run_id else self.run_name,  # a name is for a new run only
            nested=self.nested_run,
            tags=self.tags,
            description=self.description,
            **self.start_run,
        )
        self.tracking_uri = mlflow.get_tracking_uri()

    def _experiment_id(self, name: str) -> str:
        import mlflow

        found = mlflow.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        return str(
            mlflow.create_experiment(name, artifact_location=self.logging_dir, tags=self.tags)
        )

    @property
    def tracker(self) -> Any:
        return self.active_run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """The values as the run's parameters. One longer than MLflow allows is dropped (with a
        warning), not cut: a cut value would read as a real one."""
        import mlflow
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        params: dict[str, str] = {}
        for key, value in values.items():
            text = str(value)
            if len(text) > MAX_PARAM_VAL_LENGTH:
                warnings.warn(
                    f"MLflowTracker: config value {key!r} ({len(text)} characters) is longer than "
                    f"MLflow's {MAX_PARAM_VAL_LENGTH} for a parameter; it is not recorded.",
                    UserWarning,
                    stacklevel=2,
                )
                continue
            params[key] = text
        items = list(params.items())
        for first in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):  # MLflow's batch limit
            mlflow.log_params(dict(items[first : first + MAX_PARAMS_TAGS_PER_BATCH]))

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        import mlflow

        mlflow.log_metrics(scalars(values), step=step, **kwargs)

    def log_figure(self, figure: Any, artifact_file: str, **save_kwargs: Any) -> None:
        """A matplotlib or plotly figure as the artifact ``artifact_file`` (e.g. "loss.png");
        ``save_kwargs`` go to the figure's save (e.g. ``dpi=200``)."""
        import mlflow

        mlflow.log_figure(figure, artifact_file, save_kwargs=save_kwargs or None)

    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        """A file, into ``artifact_path`` of the run's artifacts (their root by default)."""
        import mlflow

        mlflow.log_artifact(local_path, artifact_path=artifact_path)

    def log_artifacts(self, local_dir: str, artifact_path: str | None = None) -> None:
        """Every file under ``local_dir``, into ``artifact_path`` of the run's artifacts."""
        import mlflow

        mlflow.log_artifacts(local_dir, artifact_path=artifact_path)

    def finish(self, ending: Ending = "finished") -> None:
        import mlflow

        mlflow.end_run(status=_STATUS[ending])

    def identity(self) -> dict[str, Any]:
        return {"run_id": self.active_run.info.run_id, "tracking_uri": self.tracking_uri}

    def where(self) -> str:
        return f"MLflow run {self.active_run.info.run_id} ({self.tracking_uri})"


def _true(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "y", "on")


def _variable(name: str, given: Any) -> Any:
    """Accelerate's MLflow variable ``name`` when set, else the argument."""
    value = rankenv.variable(name)
    return given if value is None else value
