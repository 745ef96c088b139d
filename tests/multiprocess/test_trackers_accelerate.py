"""The checks Accelerate's own tracker tests make (tests/test_tracking.py), written for nbtrain:
Accelerate's constructors (MLflow's keywords, Comet's offline tracker with init_trackers(None)),
ClearML, DVCLive and SwanLab by name, register_tracker_class, log() without a step (the optimizer
step where the library needs one, the library's own count where it keeps one), "all" taking only
what is installed, the trackers kept after end_training(), no printed line outside a launch; and
a 2-rank launch where only the main process records. The real libraries, offline, each read back
with its own reader (MlflowClient, TensorBoard's EventAccumulator, dvclive's parse_metrics,
Comet's offline archive, ClearML's offline session folder, SwanLab's run file)."""

from __future__ import annotations

import glob
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from nbtrain import Accelerator, notebook_launcher
from nbtrain.accelerator.tracking import registry
from nbtrain.tracking import (
    CometMLTracker,
    GeneralTracker,
    MLflowTracker,
    register_tracker_class,
)

pytest.importorskip("mlflow")
pytest.importorskip("tensorboard")

pytestmark = pytest.mark.timeout(300)

QUIET: dict[str, Any] = {"progress": "off", "output": "none"}
CONFIG = {"num_iterations": 12, "learning_rate": 1e-2, "some_boolean": False, "some_string": "x"}


@pytest.fixture(autouse=True)
def offline(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every library local and offline (the ranks inherit the environment); no registration
    outlives its test. The working directory is a temporary one outside the repository (the
    ranks inherit it too): DVCLive's Live() inside a git checkout runs ``dvc init`` at its root
    (this is how ``.dvc/`` and ``.dvcignore`` once got committed)."""
    root = tmp_path_factory.mktemp("stores")
    monkeypatch.chdir(root)
    uri = f"sqlite:///{root}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("CLEARML_OFFLINE_MODE", "1")
    monkeypatch.setenv("CLEARML_CACHE_DIR", str(root / "clearml"))
    monkeypatch.setenv("SWANLAB_MODE", "offline")
    monkeypatch.setenv("SWANLAB_LOG_DIR", str(root / "swanlab"))
    monkeypatch.setattr(registry, "_registered", {})
    return uri


def mlflow_client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def mlflow_history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    history = mlflow_client(uri).get_metric_history(run_id, key)
    return sorted((metric.step, metric.value) for metric in history)


def tensorboard_scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


def tensorboard_events(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    """Every scalar event of ``tag`` in the run's event files, in order, repeats included (the
    accumulator keeps one value a step), read with TensorBoard's own event file loader."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util.tensor_util import make_ndarray

    found = []
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.tag == tag:  # torch writes a scalar as a tensor or a simple value
                    number = make_ndarray(value.tensor).item() if value.HasField("tensor") else (
                        value.simple_value
                    )
                    found.append((event.step, number))
    return found


def dvclive_steps(live: Any) -> tuple[dict[str, list[int]], dict[str, Any]]:
    """{metric name: its steps} and the latest values, by dvclive's own parser."""
    from dvclive.utils import parse_metrics

    logs, latest = parse_metrics(live)
    steps = {Path(path).stem: [int(row["step"]) for row in rows] for path, rows in logs.items()}
    return steps, latest


# ---------------------------------------------------------------------------------------------
# MLflow, built Accelerate's way


def test_mlflow_tracker_takes_accelerates_arguments_and_records_figures_and_artifacts(
    tmp_path: Path, offline: str
) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    artifacts = tmp_path / "artifacts"
    tracker = MLflowTracker(
        experiment_name="accelerate-way", logging_dir=str(artifacts), tags={"team": "nb"},
        run_name="first", description="built as Accelerate builds it",
    )
    accelerator = Accelerator(log_with=tracker)
    too_long = "x" * 6001  # MLflow's limit for a parameter is 6000 characters
    with pytest.warns(UserWarning, match=r"'prompt' \(6001 characters\).*not recorded"):
        accelerator.init_trackers(None, config={**CONFIG, "prompt": too_long})
    tracker.log({"accuracy": 0.95, "loss": 0.1, "non_numeric": "dropped"}, step=10)
    accelerator.log({"at_optimizer_step": 1.0})  # MLflow needs a step: the optimizer's (0)
    (tmp_path / "notes.txt").write_text("a file")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "inside.txt").write_text("a file in a folder")
    tracker.log_artifact(str(tmp_path / "notes.txt"), artifact_path="files")
    tracker.log_artifacts(str(tmp_path / "folder"), artifact_path="folder")
    tracker.log_figure(pyplot.figure(figsize=(2, 2)), "figure.png", dpi=50)
    run_id = tracker.active_run.info.run_id
    accelerator.end_training()
    assert accelerator.trackers == [tracker], "kept after end_training, as in Accelerate"

    client = mlflow_client(offline)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics == {"accuracy": 0.95, "loss": 0.1, "at_optimizer_step": 1.0}
    assert mlflow_history(offline, run_id, "at_optimizer_step") == [(0, 1.0)]
    assert run.data.params == {k: str(v) for k, v in CONFIG.items()}, "the long one is dropped"
    assert run.data.tags["team"] == "nb"
    assert run.data.tags["mlflow.runName"] == "first"
    assert run.data.tags["mlflow.note.content"] == "built as Accelerate builds it"
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.name == "accelerate-way"
    assert experiment.artifact_location.endswith(str(artifacts)), "logging_dir: artifacts"
    assert {a.path for a in client.list_artifacts(run_id)} == {"files", "folder", "figure.png"}
    assert [a.path for a in client.list_artifacts(run_id, "files")] == ["files/notes.txt"]
    assert [a.path for a in client.list_artifacts(run_id, "folder")] == ["folder/inside.txt"]


def test_mlflow_variables_win_over_the_arguments_as_in_accelerate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-the-environment")
    monkeypatch.setenv("MLFLOW_TAGS", '{"source": "env"}')
    monkeypatch.setenv("MLFLOW_NESTED_RUN", "true")
    tracker = MLflowTracker(experiment_name="from-the-code", tags={"source": "code"})
    assert (tracker.experiment_name, tracker.tags, tracker.nested_run) == (
        "from-the-environment", {"source": "env"}, True
    )


def test_a_resumed_mlflow_run_id_and_a_nested_run(offline: str) -> None:
    """run_id= continues that run; nested_run=True opens a child of the active run."""
    first = MLflowTracker(experiment_name="nesting")
    accelerator = Accelerator(log_with=first)
    accelerator.init_trackers(None)
    child = MLflowTracker(experiment_name="nesting", nested_run=True, run_name="child")
    child.start()
    child.log({"inner": 1.0}, step=1)
    child.finish()
    parent_id = first.active_run.info.run_id
    accelerator.end_training()

    again = MLflowTracker(experiment_name="nesting", run_id=parent_id)
    accelerator = Accelerator(log_with=again)
    accelerator.init_trackers(None)
    accelerator.log({"later": 2.0}, step=5)
    accelerator.end_training()

    runs = mlflow_client(offline).search_runs(
        [mlflow_client(offline).get_experiment_by_name("nesting").experiment_id]
    )
    assert len(runs) == 2
    (nested,) = [run for run in runs if run.info.run_id != parent_id]
    assert nested.data.tags["mlflow.parentRunId"] == parent_id
    assert mlflow_history(offline, parent_id, "later") == [(5, 2.0)]


# ---------------------------------------------------------------------------------------------
# init_trackers(None, ...) with pre-built trackers; a name needed otherwise


def comet_messages(folder: Path) -> list[dict[str, Any]]:
    from comet_ml.offline import unzip_offline_archive

    (archive,) = folder.glob("*.zip")
    unpacked = Path(unzip_offline_archive(str(archive)))
    lines = (unpacked / "messages.json").read_text().splitlines()
    return [json.loads(line)["payload"] for line in lines if line.strip()]


def test_comet_offline_tracker_built_by_the_user_with_no_project_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMET_ERROR_TRACKING_ENABLE", "false")  # (before its import) no Sentry
    pytest.importorskip("comet_ml")
    from comet_ml import ExperimentConfig

    tracker = CometMLTracker(
        "comet-project", online=False,
        experiment_config=ExperimentConfig(offline_directory=str(tmp_path)),
    )
    accelerator = Accelerator(log_with=tracker)
    accelerator.init_trackers(None, CONFIG)
    accelerator.log({"total_loss": 0.1, "iteration": 1, "my_text": "some_value"}, step=0)
    accelerator.end_training()
    payloads = comet_messages(tmp_path)
    params = {p["param"]["paramName"]: p["param"]["paramValue"] for p in payloads if "param" in p}
    assert {key: params[key] for key in CONFIG} == CONFIG
    metrics = {
        p["metric"]["metricName"]: (p["metric"]["step"], p["metric"]["metricValue"])
        for p in payloads
        if "metric" in p
    }
    assert metrics["total_loss"] == (0, 0.1) and metrics["iteration"] == (0, 1)
    others = {p["key"]: p["value"] for p in payloads if "key" in p and "value" in p}
    assert others["my_text"] == "some_value"


def test_init_trackers_none_needs_every_tracker_prebuilt(tmp_path: Path) -> None:
    accelerator = Accelerator(log_with=["tensorboard", MLflowTracker()], project_dir=tmp_path)
    with pytest.raises(ValueError, match=r"project_name=None.*'tensorboard'.*pass a name"):
        accelerator.init_trackers(None)
    with pytest.raises(ValueError, match=r"project_name=''\) must be a non-empty string"):
        accelerator.init_trackers("")


# ---------------------------------------------------------------------------------------------
# The default step: the optimizer's where the library needs one, the library's own count
# where it keeps one (DVCLive, as Accelerate gives it)


# DVCLive leaves a thread of its own in the process (an idle daemon feeding DVC Studio, started
# by its first step, never ended by Live.end()); in a launch it goes with the rank.
@pytest.mark.allow_leaks
def test_dvclive_counts_its_own_steps_while_tensorboard_gets_the_optimizer_step(
    tmp_path: Path,
) -> None:
    pytest.importorskip("dvclive")
    accelerator = Accelerator(log_with=["dvclive", "tensorboard"], project_dir=tmp_path)
    live_dir = tmp_path / "dvclive"
    accelerator.init_trackers(
        "steps", CONFIG,
        init_kwargs={"dvclive": {"dir": str(live_dir), "save_dvc_exp": False, "dvcyaml": None}},
    )
    values = {"total_loss": 0.1, "iteration": 1, "my_text": "some_value"}
    accelerator.log(values)  # DVCLive's step 0
    accelerator.log(values)  # its step 1
    accelerator.log(values, step=3)  # and the one given
    accelerator.end_training()

    live = accelerator.trackers[0].live
    from dvclive.serialize import load_yaml

    assert load_yaml(live.params_file) == CONFIG
    steps, latest = dvclive_steps(live)
    assert steps == {"total_loss": [0, 1, 3], "iteration": [0, 1, 3], "my_text": [0, 1, 3]}
    assert latest == {**values, "step": 3}
    # no optimizer step was taken: TensorBoard has both step-less values at step 0
    events = tensorboard_events(tmp_path / "steps", "total_loss")
    assert [(step, round(value, 6)) for step, value in events] == [(0, 0.1), (0, 0.1), (3, 0.1)]


class CountsItself(GeneralTracker):
    """A user's tracker that says it counts its own steps: log() without one gets None."""

    name = "counts_itself"
    requires_logging_directory = False
    counts_own_steps = True

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[int | None] = []

    @property
    def tracker(self) -> None:
        return None

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        self.steps.append(step)


def test_counting_its_own_steps_is_a_property_of_the_tracker_class() -> None:
    own = CountsItself()
    accelerator = Accelerator(log_with=own)
    accelerator.init_trackers("own")
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.ones(2, 2)).sum())
    optimizer.step()
    accelerator.log({"a": 1.0})
    accelerator.log({"a": 1.0}, step=9)
    accelerator.end_training()
    assert own.steps == [None, 9]


# ---------------------------------------------------------------------------------------------
# register_tracker_class


class CSVTracker(GeneralTracker):
    """A user's tracker class, used by name: one CSV line per call."""

    name = "csv_tracker"
    requires_logging_directory = True

    def __init__(self, project_name: str, logging_dir: str, separator: str = ",") -> None:
        super().__init__()
        self.path = Path(logging_dir) / f"{project_name}.csv"
        self.separator = separator

    @property
    def tracker(self) -> Path:
        return self.path

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")

    def store_init_configuration(self, values: dict) -> None:
        self._line("config", *values)

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        self._line("log", step, *values.values())

    def finish(self) -> None:
        self._line("finish")

    def _line(self, *items: Any) -> None:
        with self.path.open("a") as file:
            file.write(self.separator.join(map(str, items)) + "\n")


def test_a_registered_class_is_built_by_name_with_accelerates_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no tracker 'csv_tracker'.*register_tracker_class"):
        Accelerator(log_with="csv_tracker", project_dir=tmp_path)
    register_tracker_class(CSVTracker)
    with pytest.raises(ValueError, match=r"log_with='csv_tracker'.*pass project_dir="):
        Accelerator(log_with="csv_tracker")
    accelerator = Accelerator(log_with=["csv_tracker"], project_dir=tmp_path)
    accelerator.init_trackers(
        "mine", config={"lr": 0.1}, init_kwargs={"csv_tracker": {"separator": ";"}}
    )
    accelerator.log({"loss": 0.5}, step=2)
    assert accelerator.get_tracker("csv_tracker", unwrap=True) == tmp_path / "mine.csv"
    accelerator.end_training()
    lines = (tmp_path / "mine.csv").read_text().splitlines()
    assert lines == ["config;lr", "log;2;0.5", "finish"]


def test_register_tracker_class_says_what_it_needs() -> None:
    with pytest.raises(ValueError, match=r"takes a class.*not an instance"):
        register_tracker_class(CountsItself())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"takes a class: a subclass of GeneralTracker"):
        register_tracker_class(dict)

    class Nameless(GeneralTracker):
        requires_logging_directory = False

    with pytest.raises(ValueError, match=r"non-empty name.*has None"):
        register_tracker_class(Nameless)

    class NoDirectoryAnswer(GeneralTracker):
        name = "no_answer"

    with pytest.raises(ValueError, match=r"requires_logging_directory = True or False"):
        register_tracker_class(NoDirectoryAnswer)

    class MyBoard(CSVTracker):
        name = "tensorboard"

    with pytest.warns(UserWarning, match=r"log_with='tensorboard' now builds MyBoard"):
        register_tracker_class(MyBoard)
    assert registry.known()["tensorboard"] is MyBoard


def test_a_class_on_accelerates_own_base_registers_too(tmp_path: Path) -> None:
    from accelerate.tracking import GeneralTracker as AccelerateTracker

    class Theirs(AccelerateTracker):
        name = "theirs"
        requires_logging_directory = False

        def __init__(self, project_name: str) -> None:
            super().__init__()
            self.project_name, self.logged = project_name, []

        @property
        def tracker(self) -> None:
            return None

        def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
            self.logged.append((values, step))

    register_tracker_class(Theirs)
    accelerator = Accelerator(log_with="theirs")
    accelerator.init_trackers("p")
    accelerator.log({"a": 1.0}, step=4)
    accelerator.end_training()
    (theirs,) = accelerator.trackers
    assert (theirs.project_name, theirs.logged) == ("p", [({"a": 1.0}, 4)])


# ---------------------------------------------------------------------------------------------
# "all": what is installed; an explicitly named missing library stays an error


def test_all_takes_only_what_is_installed_and_says_when_a_directory_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for missing in ("clearml", "swanlab", "aim"):
        monkeypatch.setitem(sys.modules, missing, None)  # as if it were not installed
    chosen = Accelerator(log_with="all")._tracking.chosen
    assert {"mlflow", "wandb"} <= set(chosen)
    assert not {"clearml", "swanlab", "aim", "tensorboard"} & set(chosen)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("nbtrain: log_with='all' leaves out tensorboard,")
    assert "project_dir" in line
    with_dir = Accelerator(log_with="all", project_dir=tmp_path)._tracking.chosen
    assert "tensorboard" in with_dir and capsys.readouterr().err == ""
    with pytest.raises(ImportError, match=r"needs the clearml package.*pip install clearml"):
        Accelerator(log_with=["all", "clearml"], project_dir=tmp_path)
    mine = CountsItself()
    assert Accelerator(log_with=[mine, "all"], project_dir=tmp_path)._tracking.chosen[0] is mine


# ---------------------------------------------------------------------------------------------
# Outside a launch: no printed line the user did not ask for


def test_outside_a_launch_log_prints_nothing_when_trackers_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    accelerator = Accelerator(log_with="tensorboard", project_dir=tmp_path)
    accelerator.init_trackers("quiet")
    accelerator.log({"loss": 0.25}, step=3)
    assert capsys.readouterr().out == ""
    for step in accelerator.progress(range(2), desc="fit"):  # a bar the user asked for
        accelerator.log({"loss": float(step)})
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip().endswith("loss 1")
    accelerator.end_training()
    assert [step for step, _ in tensorboard_scalars(tmp_path / "quiet", "loss")] == [3, 0, 0]


# ---------------------------------------------------------------------------------------------
# A 2-rank launch: ClearML, SwanLab and DVCLive by name and the user's MLflowTracker record on
# the main process only


STEPS = 4


def train_with_every_new_tracker(live_dir: str) -> dict[str, Any]:
    mlflow_tracker = MLflowTracker(experiment_name="two-ranks")  # built on every rank
    accelerator = Accelerator(log_with=["clearml", "swanlab", "dvclive", mlflow_tracker])
    accelerator.init_trackers(
        "two-ranks", config={"lr": 0.1},
        init_kwargs={
            "clearml": {"auto_resource_monitoring": False, "auto_connect_frameworks": False},
            "dvclive": {"dir": live_dir, "save_dvc_exp": False, "dvcyaml": None},
        },
    )
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    for index in range(STEPS):
        accelerator.backward(model(torch.ones(2, 2)).sum())
        optimizer.step()
        optimizer.zero_grad()
        accelerator.log({"value": float(index + 10 * accelerator.process_index)})
    mlflow_tracker.log({"direct": 1.0}, step=1)  # does nothing on rank 1 (never started there)
    found: dict[str, Any] = {"task": None, "swanlab_dir": None, "mlflow_run": None}
    if accelerator.is_main_process:  # elsewhere get_tracker gives a blank tracker
        found["task"] = accelerator.get_tracker("clearml", unwrap=True).id
        found["swanlab_dir"] = str(accelerator.get_tracker("swanlab", unwrap=True).dir)
        found["mlflow_run"] = mlflow_tracker.active_run.info.run_id
    assert mlflow_tracker.active_run is None or accelerator.is_main_process
    accelerator.end_training()
    found["trackers"] = [tracker.name for tracker in accelerator.trackers]
    return found


def swanlab_scalars(run_dir: str, key: str) -> list[tuple[int, float]]:
    """The scalars of an offline SwanLab run, read with SwanLab's own record reader."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    (path,) = glob.glob(os.path.join(run_dir, "*.swanlab"))
    reader = DataStoreReader()
    reader.open(path)
    found = []
    for data in reader:
        record = Record()
        record.ParseFromString(data)
        if record.HasField("scalar") and record.scalar.key == key:
            found.append((record.scalar.step, record.scalar.value.number))
    return found


def test_two_ranks_record_on_the_main_process_only(
    tmp_path: Path, offline: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for library in ("clearml", "swanlab", "dvclive"):
        pytest.importorskip(library)
    from clearml.utilities.config import text_to_config_dict

    main, other = notebook_launcher(
        train_with_every_new_tracker, args=(str(tmp_path / "dvclive"),), num_processes=2,
        return_all=True, **QUIET,
    )
    assert main["trackers"] == ["clearml", "swanlab", "dvclive", "mlflow"]
    assert other == {"task": None, "swanlab_dir": None, "mlflow_run": None, "trackers": []}
    rank_0_values = [float(index) for index in range(STEPS)]

    sessions = Path(os.environ["CLEARML_CACHE_DIR"]) / "offline"
    (session,) = [path for path in sessions.iterdir() if path.is_dir()]
    assert session.name == main["task"], "one ClearML task: the main process's"
    task = json.loads((session / "task.json").read_text())
    assert text_to_config_dict(task["configuration"]["General"]["value"]) == {"lr": 0.1}
    metrics = [m for line in (session / "metrics.jsonl").read_text().splitlines()
               for m in json.loads(line)]
    # no step given: ClearML's single values (its summary), as in Accelerate; the last one stays
    assert {(m["metric"], m["variant"]) for m in metrics} == {("Summary", "value")}
    assert [m["value"] for m in metrics] == rank_0_values

    (swanlab_dir,) = glob.glob(os.path.join(os.environ["SWANLAB_LOG_DIR"], "run-*"))
    assert swanlab_dir == main["swanlab_dir"], "one SwanLab run: the main process's"
    assert swanlab_scalars(swanlab_dir, "value") == list(enumerate(rank_0_values))

    from dvclive.utils import parse_tsv

    rows = parse_tsv(tmp_path / "dvclive" / "plots" / "metrics" / "value.tsv")
    assert [(int(r["step"]), float(r["value"])) for r in rows] == list(enumerate(rank_0_values))

    runs = mlflow_client(offline).search_runs(
        [mlflow_client(offline).get_experiment_by_name("two-ranks").experiment_id]
    )
    assert [run.info.run_id for run in runs] == [main["mlflow_run"]]
    optimizer_steps = list(zip(range(1, STEPS + 1), rank_0_values, strict=True))
    assert mlflow_history(offline, main["mlflow_run"], "value") == optimizer_steps
    assert mlflow_history(offline, main["mlflow_run"], "direct") == [(1, 1.0)]
