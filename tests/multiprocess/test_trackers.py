"""Experiment trackers on real ranks, with the real libraries, offline: TensorBoard, MLflow (a
sqlite store), W&B (offline mode), trackio (local), Aim and Comet (offline) record the main
process's values (at the run's optimizer steps, or W&B's and trackio's own count of them),
read back with each library's own reader; a user's GeneralTracker gets every call; a
stopped-then-resumed launch continues the same run with contiguous steps, and the stopped launch
is recorded as stopped where the library has a run status (MLflow KILLED, W&B exit code 255); a
missing library is named with its pip install; nothing of the trackers outlives the launch."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from stopresume import Seen, interrupt_when
from torch.utils.data import DataLoader, TensorDataset

from nbtrain import Accelerator, notebook_launcher
from nbtrain.tracking import GeneralTracker, on_main_process
from nbtrain.utils import LoggerType

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")
pytest.importorskip("wandb")
pytest.importorskip("trackio")

pytestmark = pytest.mark.timeout(300)

QUIET: dict[str, Any] = {"progress": "off", "output": "none"}
LIBRARIES = ["tensorboard", "mlflow", "wandb", "trackio"]
EPOCHS, PER_EPOCH = 3, 12  # 36 optimizer steps in all
_TRACKIO_DIR: list[Path] = []


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One sqlite store for the module: MLflow takes seconds to create one (its schema
    migrations); each test's runs are in experiments of their own names."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"


@pytest.fixture(autouse=True)
def offline(
    mlflow_store: str, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> str:
    """Every library local and offline; the ranks inherit the environment."""
    uri = mlflow_store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")  # (it would also set a variable)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    # trackio reads TRACKIO_DIR once, at import: one directory for the session's reader
    if not _TRACKIO_DIR:
        _TRACKIO_DIR.append(tmp_path_factory.mktemp("trackio"))
    monkeypatch.setenv("TRACKIO_DIR", str(_TRACKIO_DIR[0]))
    return uri


def train(
    project: str,
    project_dir: str,
    log_with: Any = LIBRARIES,
    marker: str | None = None,
    slow: float = 0.0,
    init_kwargs: dict | None = None,
) -> list[str]:
    """Every rank logs; the value is the step the batch count says, plus 1000 on rank 1."""
    accelerator = Accelerator(log_with=log_with, project_dir=project_dir)
    accelerator.init_trackers(project, config={"lr": 0.5, "batch_size": 4}, init_kwargs=init_kwargs)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(PER_EPOCH * 8, 4), torch.randn(PER_EPOCH * 8, 1))
    loader = DataLoader(data, batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    seen = Seen()
    accelerator.register_for_checkpointing(seen)
    for _epoch in range(loader.iteration, EPOCHS):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            seen.batches += 1
            accelerator.log({"seen": seen.batches + 1000 * accelerator.process_index})
            if marker and accelerator.is_main_process and not os.path.exists(marker):
                Path(marker).write_text("training")
            time.sleep(slow)
    names = [tracker.name for tracker in accelerator.trackers]
    if "mlflow" in log_with:
        accelerator.get_tracker("mlflow").log({"direct": 1.0}, step=1)  # blank on rank 1
    accelerator.end_training()
    return names


# ---------------------------------------------------------------------------------------------
# Readers: each library's own


def tensorboard_scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


def mlflow_runs(uri: str, project: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(project)
    assert experiment is not None, f"no MLflow experiment {project!r}"
    return client.search_runs([experiment.experiment_id])


def mlflow_status(uri: str, run_id: str) -> str:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri).get_run(run_id).info.status


def mlflow_history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    history = MlflowClient(tracking_uri=uri).get_metric_history(run_id, key)
    return sorted((metric.step, metric.value) for metric in history)


def wandb_records(run_dir: Path) -> list[dict[str, Any]]:
    """The records of an offline run, as W&B's own reader prints them (wandb leet inspect)."""
    wandb_cli = Path(sys.executable).with_name("wandb")
    out = subprocess.run(
        [str(wandb_cli), "leet", "inspect", "--json", str(run_dir)],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def wandb_history(run_dir: Path, key: str) -> list[tuple[int, float]]:
    return [
        (record["history"]["item"]["_step"], record["history"]["item"][key])
        for record in wandb_records(run_dir)
        if record["type"] == "history" and key in record["history"]["item"]
    ]


def wandb_exit_code(run_dir: Path) -> int:
    (code,) = [r["exit"].get("exit_code", 0) for r in wandb_records(run_dir) if r["type"] == "exit"]
    return code


def aim_runs(repo: Path) -> list[Any]:
    """The runs of an Aim repository, read with Aim's own SDK. Aim 3.29's reader sees only the
    runs in the repository's index, which `aim up`'s background indexer fills, or Aim's
    `aim storage reindex` command: a training process's runs are not in it until then."""
    from aim import Repo

    aim_cli = Path(sys.executable).with_name("aim")
    subprocess.run(
        [str(aim_cli), "storage", "--repo", str(repo), "reindex", "--yes"],
        capture_output=True, text=True, timeout=120, check=True,
    )
    return list(Repo.from_path(str(repo)).iter_runs())


def aim_history(run: Any, key: str) -> list[tuple[int, float]]:
    for metric in run.metrics():
        if metric.name == key:
            steps, (values, *_) = metric.data.items_list()
            return list(zip(steps, values, strict=True))
    return []


def trackio_history(project: str, key: str) -> dict[str, list[tuple[int, float]]]:
    """{run name: [(step, value)]} for every run of the project."""
    from trackio.sqlite_storage import SQLiteStorage

    runs = {record["name"] for record in SQLiteStorage.get_run_records(project)}
    return {
        str(name): [
            (log["step"], log[key])
            for log in SQLiteStorage.get_logs(project, run=name)
            if key in log
        ]
        for name in runs
    }


def steps_1_to(n: int) -> list[tuple[int, float]]:
    """Contiguous steps 1..n, each once, each value its step: rank 0's values only."""
    return [(step, float(step)) for step in range(1, n + 1)]


def counted_from_0(n: int) -> list[tuple[int, float]]:
    """What a library that counts its own steps records of n log() calls without step= (W&B,
    trackio: Accelerate's behaviour): its steps 0..n-1, the values (optimizer steps) 1..n."""
    return [(step - 1, float(step)) for step in range(1, n + 1)]


def tracker_processes() -> list[str]:
    return [
        " ".join(proc.cmdline())
        for proc in psutil.Process().children(recursive=True)
        if re.search(r"wandb|trackio|mlflow|tensorboard|aim", " ".join(proc.cmdline()))
    ]


# ---------------------------------------------------------------------------------------------
# Tests


def test_the_main_process_records_one_run_per_launch_in_every_library(
    tmp_path: Path, offline: str, capfd: pytest.CaptureFixture[str]
) -> None:
    project = f"launch-{os.getpid()}-{time.monotonic_ns()}"
    names = notebook_launcher(
        train,
        args=(project, str(tmp_path / "project")),
        num_processes=2,
        return_all=True,
        progress="text",
        output="none",
    )
    assert names == [LIBRARIES, []], "trackers exist on the main process only"
    total = EPOCHS * PER_EPOCH

    log_dir = tmp_path / "project" / project
    assert tensorboard_scalars(log_dir, "seen") == steps_1_to(total)

    (run,) = mlflow_runs(offline, project)
    assert mlflow_history(offline, run.info.run_id, "seen") == steps_1_to(total)
    assert run.data.params == {"lr": "0.5", "batch_size": "4"}
    assert mlflow_history(offline, run.info.run_id, "direct") == [(1, 1.0)]
    assert run.info.status == "FINISHED"

    (wandb_dir,) = (tmp_path / "project" / "wandb").glob("offline-run-*")
    assert wandb_history(wandb_dir, "seen") == counted_from_0(total)
    assert wandb_exit_code(wandb_dir) == 0
    config = [r["config"] for r in wandb_records(wandb_dir) if r["type"] == "config"]
    assert any('"lr"' in json.dumps(item) for item in config), config

    (trackio_run,) = trackio_history(project, "seen").values()
    assert trackio_run == counted_from_0(total)

    summary = capfd.readouterr().out
    assert f"recorded in TensorBoard {log_dir}" in summary
    assert f"MLflow run {run.info.run_id}" in summary
    assert f"W&B run {wandb_dir.name.rsplit('-', 1)[1]} ({wandb_dir})" in summary
    assert "trackio run " in summary
    assert re.search(r"\[rank 1\] seen 1036", summary), "the live view still gets every rank"
    assert tracker_processes() == []


class Recorder(GeneralTracker):
    """A user's tracker, written as Accelerate's guide writes one (built on every rank, its
    methods decorated with on_main_process): writes every call it gets to a file of its
    process."""

    name = "recorder"
    requires_logging_directory = False

    @on_main_process
    def __init__(self, folder: str) -> None:
        super().__init__()
        self.folder = folder
        self._note("init")

    @property
    def tracker(self) -> str:
        return "the recorder"

    def _note(self, *call: Any) -> None:
        with open(os.path.join(self.folder, f"calls-{os.getpid()}.jsonl"), "a") as file:
            file.write(json.dumps(call) + "\n")

    def start(self) -> None:
        self._note("start")

    def store_init_configuration(self, values: dict) -> None:
        self._note("config", values)

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        self._note("log", values, step, kwargs)

    def finish(self) -> None:
        self._note("finish")


def record_with_own_tracker(folder: str) -> Any:
    accelerator = Accelerator(log_with=Recorder(folder))
    accelerator.init_trackers("mine", config={"depth": 3})
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.log({"before": 0.5})  # no step taken yet: step 0
    for _ in range(3):
        accelerator.backward(model(torch.ones(2, 2)).sum())
        optimizer.step()
        optimizer.zero_grad()
        accelerator.log({"x": 1.0}, log_kwargs={"recorder": {"note": "hi"}})
    accelerator.log({"explicit": 2.0}, step=40)
    unwrapped = accelerator.get_tracker("recorder", unwrap=True)
    accelerator.end_training()
    return unwrapped


def test_a_user_tracker_receives_every_call_on_the_main_process(tmp_path: Path) -> None:
    unwrapped = notebook_launcher(
        record_with_own_tracker, args=(str(tmp_path),), num_processes=2, return_all=True, **QUIET
    )
    assert unwrapped[0] == "the recorder"
    # rank 1, as in Accelerate: a blank tracker, whose calls do nothing (even unwrapped)
    assert isinstance(unwrapped[1], GeneralTracker) and unwrapped[1].log({"a": 1}) is None
    # one process made calls, the main one: rank 1 built its Recorder too (on_main_process)
    (calls_file,) = tmp_path.glob("calls-*.jsonl")
    calls = [json.loads(line) for line in calls_file.read_text().splitlines()]
    assert calls == [
        ["init"],
        ["start"],
        ["config", {"depth": 3}],
        ["log", {"before": 0.5}, 0, {}],
        ["log", {"x": 1.0}, 1, {"note": "hi"}],
        ["log", {"x": 1.0}, 2, {"note": "hi"}],
        ["log", {"x": 1.0}, 3, {"note": "hi"}],
        ["log", {"explicit": 2.0}, 40, {}],
        ["finish"],
    ]


def stop_then_resume(
    project: str,
    project_dir: Path,
    after_stop: Callable[[dict[str, Any]], None] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """A launch stopped by an interrupt (checkpoint saved), then resumed; the checkpoint's
    meta. ``after_stop(meta)`` checks the runs between the two launches."""
    marker = project_dir.parent / "marker"
    thread = interrupt_when(marker, 0.5)
    try:
        with pytest.raises(KeyboardInterrupt, match="stopped at step"):
            notebook_launcher(
                train,
                args=(project, str(project_dir)),
                kwargs={"marker": str(marker), "slow": 0.05, **options},
                num_processes=2,
                on_interrupt="checkpoint",
                project_dir=project_dir,
                **QUIET,
            )
    finally:
        thread.join()
    meta = json.loads(
        (project_dir / "checkpoints" / "checkpoint_0" / "nbtrain_checkpoint.json").read_text()
    )
    assert 0 < meta["steps"] < EPOCHS * PER_EPOCH, "stopped mid-run"
    if after_stop is not None:
        after_stop(meta)
    notebook_launcher(
        train,
        args=(project, str(project_dir)),
        kwargs=options,
        num_processes=2,
        resume=True,
        project_dir=project_dir,
        **QUIET,
    )
    return meta


def test_stop_and_resume_continue_the_same_run_in_every_library(
    tmp_path: Path, offline: str
) -> None:
    project = f"resume-{os.getpid()}-{time.monotonic_ns()}"
    project_dir = tmp_path / "project"
    libraries = [*LIBRARIES, "aim"]

    def recorded_as_stopped(meta: dict[str, Any]) -> None:
        """MLflow's and W&B's own record of the stopped launch: killed, as for a Ctrl-C."""
        assert mlflow_status(offline, meta["trackers"]["mlflow"]["run_id"]) == "KILLED"
        (stopped,) = (project_dir / "wandb").glob("offline-run-*")
        assert wandb_exit_code(stopped) == 255

    meta = stop_then_resume(project, project_dir, recorded_as_stopped, log_with=libraries)
    total = EPOCHS * PER_EPOCH
    assert set(meta["trackers"]) == set(libraries)
    log_dir = project_dir / project
    assert tensorboard_scalars(log_dir, "seen") == steps_1_to(total)

    (run,) = mlflow_runs(offline, project)
    assert run.info.run_id == meta["trackers"]["mlflow"]["run_id"]
    assert mlflow_history(offline, run.info.run_id, "seen") == steps_1_to(total)
    assert run.info.status == "FINISHED", "the resumed launch finished the run"

    runs = sorted((project_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2, "one directory per launch"
    ids = {run_dir.name.rsplit("-", 1)[1] for run_dir in runs}
    assert ids == {meta["trackers"]["wandb"]["id"]}, "one W&B run id"
    history = wandb_history(runs[0], "seen") + wandb_history(runs[1], "seen")
    assert sorted(history) == counted_from_0(total), "the resumed launch counts on"
    assert sorted(map(wandb_exit_code, runs)) == [0, 255]

    (aim_run,) = aim_runs(project_dir)
    assert aim_run.hash == meta["trackers"]["aim"]["run_hash"]
    assert (aim_run.experiment, aim_run["hparams"]) == (project, {"lr": 0.5, "batch_size": 4})
    assert aim_history(aim_run, "seen") == steps_1_to(total)

    assert trackio_history(project, "seen") == {
        meta["trackers"]["trackio"]["name"]: counted_from_0(total)
    }
    assert tracker_processes() == []


def test_tensorboard_drops_what_a_crashed_launch_logged_past_the_checkpoint(
    tmp_path: Path,
) -> None:
    """A launch resumed from an earlier checkpoint than where its predecessor got to (a crash
    after the checkpoint) logs each step once: TensorBoard purges the predecessor's later
    steps (purge_step)."""
    project = "crash"
    project_dir = tmp_path / "project"
    notebook_launcher(
        crash_after_checkpoint,
        args=(project, str(project_dir), True),
        num_processes=2,
        checkpoint_every=5,
        project_dir=project_dir,
        **QUIET,
    )
    notebook_launcher(
        crash_after_checkpoint,
        args=(project, str(project_dir), False),
        num_processes=2,
        resume=True,
        project_dir=project_dir,
        **QUIET,
    )
    assert tensorboard_scalars(project_dir / project, "seen") == steps_1_to(12)


def crash_after_checkpoint(project: str, project_dir: str, first: bool) -> None:
    """Logs 7 steps (a checkpoint saved at step 5) and ends as if it had crashed there; the
    resumed launch goes on from step 5 to 12."""
    accelerator = Accelerator(log_with="tensorboard", project_dir=project_dir)
    accelerator.init_trackers(project)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(96, 4), torch.randn(96, 1)), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    seen = Seen()
    accelerator.register_for_checkpointing(seen)
    for x, y in loader:
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
        seen.batches += 1
        # the crashed launch logged 100+ at steps 6 and 7, which the resumed one redoes
        accelerator.log({"seen": seen.batches + (100 if first and seen.batches > 5 else 0)})
        if first and seen.batches == 7:
            return


def test_a_missing_library_an_unknown_name_and_a_missing_directory_are_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"needs the wandb package.*pip install wandb"):
        Accelerator(log_with=["tensorboard", "wandb"], project_dir="unused")
    with pytest.raises(ValueError, match=r"no tracker 'neptune'.*'tensorboard', 'wandb'"):
        Accelerator(log_with="neptune")
    with pytest.raises(ValueError, match=r"log_with='tensorboard'.*pass project_dir="):
        Accelerator(log_with="tensorboard")
    assert Accelerator(log_with=[LoggerType.MLFLOW])._tracking.chosen == ["mlflow"]
    # "all": the installed ones (W&B now is not) that need no directory (none was given)
    chosen = Accelerator(log_with="all")._tracking.chosen
    assert {"mlflow", "trackio"} <= set(chosen) and not {"wandb", "tensorboard"} & set(chosen)


def test_trackers_write_under_the_project_configurations_logging_dir(tmp_path: Path) -> None:
    """Accelerate's ProjectConfiguration(logging_dir=...): the trackers' directory, apart from
    project_dir's checkpoints (outside a launch: this process is the main one)."""
    from accelerate.utils import ProjectConfiguration

    config = ProjectConfiguration(project_dir=str(tmp_path / "p"), logging_dir=str(tmp_path / "l"))
    accelerator = Accelerator(log_with="tensorboard", project_config=config)
    accelerator.init_trackers("here")
    accelerator.log({"a": 2.0}, step=3)
    accelerator.end_training()
    assert tensorboard_scalars(tmp_path / "l" / "here", "a") == [(3, 2.0)]
    assert not (tmp_path / "p").exists()


def fail_after_logging() -> None:
    accelerator = Accelerator(log_with="mlflow")
    accelerator.init_trackers("failing")
    accelerator.log({"a": 1.0}, step=1)
    raise RuntimeError("the user's code failed")


def test_a_launch_that_raised_is_recorded_as_failed(offline: str) -> None:
    """In the kernel's own process (num_processes=1): cheap, and the same ending as a rank's."""
    with pytest.raises(RuntimeError, match="the user's code failed"):
        notebook_launcher(fail_after_logging, num_processes=1, **QUIET)
    (run,) = mlflow_runs(offline, "failing")
    assert run.info.status == "FAILED"
    assert mlflow_history(offline, run.info.run_id, "a") == [(1, 1.0)]


def test_nbtrain_tracking_has_accelerates_names() -> None:
    """``from accelerate.tracking import X`` -> ``from nbtrain.tracking import X``."""
    import accelerate.tracking

    import nbtrain.tracking

    for name in nbtrain.tracking.__all__:
        theirs = getattr(accelerate.tracking, name)
        if isinstance(theirs, type) and name != "GeneralTracker":
            assert getattr(nbtrain.tracking, name).name == theirs.name
    with pytest.raises(AttributeError, match=r"NeptuneTracker.*GeneralTracker subclass"):
        nbtrain.tracking.NeptuneTracker  # noqa: B018


def comet_metrics(archive: Path, key: str) -> list[tuple[int, float]]:
    """The metric messages of an offline Comet experiment, unpacked by comet_ml's own helper."""
    from comet_ml.offline import unzip_offline_archive

    folder = Path(unzip_offline_archive(str(archive)))
    try:
        lines = (folder / "messages.json").read_text().splitlines()
        messages = [json.loads(line) for line in lines]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return [
        (message["payload"]["metric"]["step"], message["payload"]["metric"]["metricValue"])
        for message in messages
        if message["type"] == "metric_msg" and message["payload"]["metric"]["metricName"] == key
    ]


def test_comet_offline_continues_the_same_experiment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("comet_ml")
    from comet_ml.offline_utils import extract_experiment_key_from_offline_file

    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(tmp_path / "comet"))
    meta = stop_then_resume(
        "comet", tmp_path / "project", log_with="comet_ml",
        init_kwargs={"comet_ml": {"online": False}},
    )
    archives = sorted((tmp_path / "comet").glob("*.zip"))
    assert len(archives) == 2, "one archive per launch"
    keys = {extract_experiment_key_from_offline_file(str(archive)) for archive in archives}
    assert keys == {meta["trackers"]["comet_ml"]["experiment_key"]}, "one experiment"
    logged = sorted(comet_metrics(archives[0], "seen") + comet_metrics(archives[1], "seen"))
    assert logged == steps_1_to(EPOCHS * PER_EPOCH)


WARM_CELL = """
import torch
from nbtrain import Accelerator
accelerator = Accelerator(log_with="tensorboard", project_dir={project_dir!r})
accelerator.init_trackers("warm")  # the second cell's call goes on with the run
if "model" not in globals():
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
for _ in range(3):
    accelerator.backward(model(torch.ones(2, 2)).sum())
    optimizer.step()
    optimizer.zero_grad()
    accelerator.log({{"cell_value": float({cell})}})
"""


def test_on_warm_ranks_one_run_spans_cells_until_the_ranks_stop(tmp_path: Path) -> None:
    import nbtrain

    project_dir = tmp_path / "project"
    handle = nbtrain.start_ranks(2, **QUIET)
    try:
        handle.run_cell(WARM_CELL.format(project_dir=str(project_dir), cell=1))
        handle.run_cell(WARM_CELL.format(project_dir=str(project_dir), cell=2))
        assert handle.pull("[t.name for t in accelerator.trackers]") == [["tensorboard"], []]
    finally:
        handle.stop()  # ends the run
    log_dir = project_dir / "warm"
    assert len(list(log_dir.glob("events.out.tfevents.*"))) == 1, "one run, one writer"
    assert tensorboard_scalars(log_dir, "cell_value") == [
        (1, 1.0), (2, 1.0), (3, 1.0), (4, 2.0), (5, 2.0), (6, 2.0)
    ]
    assert tracker_processes() == []


def trainer_reporting(output_dir: str) -> int:
    """A Transformers Trainer in the ranks, reporting to TensorBoard and MLflow itself (its
    own callbacks, as under torchrun), next to nbtrain's live view."""
    from transformers import Trainer, TrainingArguments

    from nbtrain import NbtrainCallback

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict:
            return {"loss": torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), labels)}

    generator = torch.Generator().manual_seed(0)
    data = [
        {"x": torch.randn(4, generator=generator), "labels": torch.randn((), generator=generator)}
        for _ in range(32)
    ]
    args = TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=4, num_train_epochs=2,
        logging_steps=2, save_strategy="no", report_to=["tensorboard", "mlflow"],
        disable_tqdm=True, use_cpu=True, run_name="trainer-run",
    )
    trainer = Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=[NbtrainCallback()])
    trainer.train()
    return trainer.state.max_steps


def test_a_trainer_in_the_ranks_reports_to_its_trackers_from_the_main_process(
    tmp_path: Path, offline: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("transformers")
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "trainer")
    max_steps = notebook_launcher(
        trainer_reporting, args=(str(tmp_path / "out"),), num_processes=2, **QUIET
    )
    assert max_steps == 8  # 32 samples / (4 per device * 2 ranks) * 2 epochs
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 1, "rank 0 only"
    assert [step for step, _ in tensorboard_scalars(tmp_path / "tb", "train/loss")] == [2, 4, 6, 8]
    (run,) = mlflow_runs(offline, "trainer")
    assert [step for step, _ in mlflow_history(offline, run.info.run_id, "loss")] == [2, 4, 6, 8]


def record_without_ending(folder: str) -> None:
    accelerator = Accelerator(log_with=Recorder(folder))
    accelerator.init_trackers("unended")
    accelerator.log({"a": 1.0}, step=7)  # and no end_training(): the launch's end finishes


@pytest.mark.parametrize("processes", [1, 2])
def test_the_end_of_a_launch_finishes_a_run_left_open(tmp_path: Path, processes: int) -> None:
    """num_processes=1 runs in this very process (the kernel's), 2 in rank processes."""
    notebook_launcher(record_without_ending, args=(str(tmp_path),), num_processes=processes,
                      **QUIET)
    (calls_file,) = tmp_path.glob("calls-*.jsonl")
    calls = [json.loads(line) for line in calls_file.read_text().splitlines()]
    assert calls == [["init"], ["start"], ["log", {"a": 1.0}, 7, {}], ["finish"]]


def count_steps(folder: str) -> None:
    """Two optimizers (as a GAN's) and gradient accumulation over 2 micro-steps."""
    accelerator = Accelerator(log_with=Recorder(folder), gradient_accumulation_steps=2)
    accelerator.init_trackers("count")
    first, second = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    first, second = accelerator.prepare(first, second)
    one = accelerator.prepare(torch.optim.SGD(first.parameters(), lr=0.1))
    two = accelerator.prepare(torch.optim.SGD(second.parameters(), lr=0.1))
    for index in range(6):
        with accelerator.accumulate(first, second):
            accelerator.backward((first(torch.ones(2, 2)) + second(torch.ones(2, 2))).sum())
            one.step()
            two.step()
            one.zero_grad()
            two.zero_grad()
        accelerator.log({"micro_step": float(index)})


def test_the_default_step_counts_optimizer_steps_not_micro_steps_nor_optimizers(
    tmp_path: Path,
) -> None:
    notebook_launcher(count_steps, args=(str(tmp_path),), num_processes=2, **QUIET)
    (calls_file,) = tmp_path.glob("calls-*.jsonl")
    steps = [call[2] for call in map(json.loads, calls_file.read_text().splitlines())
             if call[0] == "log"]
    assert steps == [0, 1, 1, 2, 2, 3]


def wandb_in_this_process(project_dir: str) -> None:
    accelerator = Accelerator(log_with="wandb", project_dir=project_dir)
    accelerator.init_trackers("kernel")
    accelerator.log({"a": 1.0})


def test_a_launch_in_the_kernels_own_process_leaves_no_tracker_process(tmp_path: Path) -> None:
    """num_processes=1 runs in this process, which goes on: W&B's service must end with the
    launch's run."""
    notebook_launcher(wandb_in_this_process, args=(str(tmp_path),), num_processes=1, **QUIET)
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    assert wandb_history(run_dir, "a") == [(0, 1.0)]
    assert tracker_processes() == []
