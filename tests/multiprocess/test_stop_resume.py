"""Stop and resume on real ranks: the first interrupt saves a checkpoint at an optimizer step the
ranks agree on, resume=True continues bitwise, periodic checkpoints are kept as asked, and bad
input is refused before any process starts."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo  # (DDP imports it; loading it once here keeps forked ranks fast)
from stopresume import Seen, interrupt_when
from torch.utils.data import DataLoader, TensorDataset

from nbtrain import Accelerator, WorkerError, log, notebook_launcher, set_seed
from nbtrain.display.runstate import RunState
from nbtrain.shared.events import Log

pytestmark = pytest.mark.timeout(240)

QUIET: dict[str, Any] = {"progress": "off", "output": "none"}
EPOCHS = 3



def train(
    marker: str | None = None,
    slow: float = 0.0,
    accumulate: int = 1,
    own_checkpoint: str | None = None,
    swallow: bool = False,
    raw_optimizer: bool = False,
    workers: int = 0,
) -> dict[str, Any]:
    """Dropout, shuffling, Adam and a scheduler: a resume that is off by one batch or one random
    draw gives other weights."""
    set_seed(0)
    accelerator = Accelerator(gradient_accumulation_steps=accumulate)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 2)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.7)
    data = TensorDataset(torch.randn(192, 8), torch.randint(0, 2, (192,)))
    loader = DataLoader(data, batch_size=8, shuffle=True, num_workers=workers)
    if raw_optimizer:  # only the model and the loader prepared: steps still count
        model, loader = accelerator.prepare(model, loader)
    else:
        model, optimizer, loader, scheduler = accelerator.prepare(
            model, optimizer, loader, scheduler
        )
    seen = Seen()
    accelerator.register_for_checkpointing(seen)
    if own_checkpoint is not None:
        # load_state restores the RNG at once (as in Accelerate): nothing may draw after it.
        accelerator.load_state(own_checkpoint)
    else:
        torch.rand(3)  # drawn between prepare() and the loop: must not shift a resumed run
    for _epoch in range(loader.iteration, EPOCHS):
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            log({"loss": loss.item()})  # the chart's step axis must go on after a resume
            seen.batches += 1
            if marker and accelerator.is_main_process and not os.path.exists(marker):
                Path(marker).write_text("training")
            try:
                time.sleep(slow)
            except Exception:  # user code that swallows errors must not swallow a stop
                if not swallow:
                    raise
    weights = {k: v.clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}
    return {"weights": weights, "batches": seen.batches, "lr": scheduler.get_last_lr()}


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (
        a["batches"] == b["batches"]
        and a["lr"] == b["lr"]
        and all(torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"])
    )


def stopped_run(tmp_path: Path, delay: float, **options: Any) -> str:
    """Launch with on_interrupt='checkpoint', interrupt once training runs; the message."""
    marker = tmp_path / f"marker-{time.monotonic_ns()}"
    thread = interrupt_when(marker, delay)
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            notebook_launcher(
                train,
                kwargs={"marker": str(marker), "slow": options.pop("slow", 0.03), **options},
                num_processes=2,
                on_interrupt="checkpoint",
                project_dir=tmp_path / "project",
                **QUIET,
            )
    finally:
        thread.join()
    return str(info.value)


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    return notebook_launcher(train, num_processes=2, **QUIET)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_first_interrupt_saves_and_resume_equals_an_uninterrupted_run(
    tmp_path: Path, reference: dict[str, Any], method: str
) -> None:
    marker = tmp_path / "marker"
    thread = interrupt_when(marker, 0.4)
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            notebook_launcher(
                train,
                kwargs={"marker": str(marker), "slow": 0.03},
                num_processes=2,
                start_method=method,
                on_interrupt="checkpoint",
                project_dir=tmp_path / "project",
                **QUIET,
            )
    finally:
        thread.join()
    saved = tmp_path / "project" / "checkpoints" / "checkpoint_0"
    assert f"saved in {saved}" in str(info.value) and "resume=True" in str(info.value)
    meta = json.loads((saved / "nbtrain_checkpoint.json").read_text())
    assert 0 < meta["steps"] < EPOCHS * 12, "stopped mid-run, at an optimizer step"
    resumed = notebook_launcher(
        train, num_processes=2, start_method=method, resume=True,
        project_dir=tmp_path / "project", **QUIET,
    )
    assert same(resumed, reference)


def test_in_the_kernels_own_process_too(tmp_path: Path) -> None:
    """num_processes=1: the kernel is the rank; its own Ctrl-C asks for the stop."""
    alone = notebook_launcher(train, num_processes=1, **QUIET)
    marker = tmp_path / "marker"
    thread = interrupt_when(marker, 0.3)
    try:
        with pytest.raises(KeyboardInterrupt, match="stopped at step"):
            notebook_launcher(
                train, kwargs={"marker": str(marker), "slow": 0.03}, num_processes=1,
                on_interrupt="checkpoint", project_dir=tmp_path / "project", **QUIET,
            )
    finally:
        thread.join()
    resumed = notebook_launcher(
        train, num_processes=1, resume=True, project_dir=tmp_path / "project", **QUIET
    )
    assert same(resumed, alone)


def test_with_gradient_accumulation_the_stop_lands_on_a_real_step(
    tmp_path: Path,
) -> None:
    full = notebook_launcher(train, kwargs={"accumulate": 3}, num_processes=2, **QUIET)
    message = stopped_run(tmp_path, 0.3, accumulate=3)
    assert "stopped at step" in message
    resumed = notebook_launcher(
        train, kwargs={"accumulate": 3}, num_processes=2, resume=True,
        project_dir=tmp_path / "project", **QUIET,
    )
    assert same(resumed, full)


def test_a_loader_with_worker_processes_stops_and_resumes_bitwise(tmp_path: Path) -> None:
    full = notebook_launcher(train, kwargs={"workers": 2}, num_processes=2, **QUIET)
    assert "stopped at step" in stopped_run(tmp_path, 0.3, workers=2)
    resumed = notebook_launcher(
        train, kwargs={"workers": 2}, num_processes=2, resume=True,
        project_dir=tmp_path / "project", **QUIET,
    )
    assert same(resumed, full)


def test_an_optimizer_that_was_not_prepared_still_gets_its_stop(tmp_path: Path) -> None:
    assert "stopped at step" in stopped_run(tmp_path, 0.2, raw_optimizer=True)


def test_user_code_catching_exception_does_not_swallow_the_stop(tmp_path: Path) -> None:
    message = stopped_run(tmp_path, 0.2, swallow=True)
    assert "stopped at step" in message


def test_a_second_interrupt_stops_at_once_and_keeps_the_previous_checkpoint(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    project = tmp_path / "project"
    first = project / "checkpoints" / "checkpoint_0" / "nbtrain_checkpoint.json"
    thread = interrupt_when(first, 0.0, times=2)  # both while a slow step runs
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            notebook_launcher(
                train, kwargs={"slow": 0.3}, num_processes=2, on_interrupt="checkpoint",
                checkpoint_every=2, project_dir=project, **QUIET,
            )
    finally:
        thread.join()
    assert "every rank was stopped" in str(info.value)
    assert "newest complete checkpoint is" in str(info.value)
    resumed = notebook_launcher(
        train, num_processes=2, resume=True, project_dir=project, **QUIET
    )
    assert same(resumed, reference)


def test_periodic_checkpoints_by_steps_keep_the_newest_total_limit(tmp_path: Path) -> None:
    project = tmp_path / "project"
    notebook_launcher(
        train, num_processes=2, checkpoint_every=5, total_limit=2, project_dir=project, **QUIET
    )
    kept = sorted((project / "checkpoints").iterdir(), key=lambda p: int(p.name.split("_")[1]))
    assert [p.name for p in kept] == ["checkpoint_5", "checkpoint_6"]  # 36 steps: 7 saves
    steps = [json.loads((p / "nbtrain_checkpoint.json").read_text())["steps"] for p in kept]
    assert steps == [30, 35]


def test_periodic_checkpoints_by_time_are_agreed_by_every_rank(tmp_path: Path) -> None:
    project = tmp_path / "project"
    notebook_launcher(
        train, kwargs={"slow": 0.05}, num_processes=2, checkpoint_every="0.4s",
        total_limit=None, project_dir=project, **QUIET,
    )
    saved = sorted((project / "checkpoints").iterdir())
    assert len(saved) >= 2
    for path in saved:  # a save every rank joined: both ranks' files, and the marker last
        assert (path / "nbtrain_checkpoint.json").is_file()
        assert {"random_states_0.pkl", "random_states_1.pkl"} <= {p.name for p in path.iterdir()}


def test_resume_continues_the_numbering_and_the_step_count(
    tmp_path: Path, reference: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    stopped_run(tmp_path, 0.2)
    project = tmp_path / "project"
    logged: list[Log] = []
    states: list[RunState] = []
    original = RunState.apply

    def apply(self: RunState, event: Any) -> None:
        if isinstance(event, Log) and event.rank == 0:
            logged.append(event)
        states.append(self)
        original(self, event)

    monkeypatch.setattr(RunState, "apply", apply)
    again = notebook_launcher(
        train, num_processes=2, resume=True, checkpoint_every=10, total_limit=None,
        project_dir=project, **QUIET,
    )
    assert same(again, reference)
    first = json.loads((project / "checkpoints" / "checkpoint_0" / "nbtrain_checkpoint.json")
                       .read_text())["steps"]
    start = logged[0].earlier[0][0] if logged[0].earlier else logged[0].step
    # The chart goes on right after the first run's last point: log() without progress() puts
    # its N-th call at step N (1-based), and the checkpoint holds the first ``first`` calls.
    assert first > 0 and start == first + 1
    # Said in the dashboard's header and summary (was a line in the cell's stderr)
    resumed = f"resumed from checkpoint_0 (step {first})"
    assert states[-1].resumed == resumed and resumed in states[-1].summary, states[-1].summary
    metas = {
        p.name: json.loads((p / "nbtrain_checkpoint.json").read_text())
        for p in (project / "checkpoints").iterdir()
    }
    later = [m["steps"] for name, m in metas.items() if name != "checkpoint_0"]
    assert later and all(step % 10 == 0 and step > metas["checkpoint_0"]["steps"] for step in later)


def test_resume_auto_starts_fresh_when_there_is_no_checkpoint(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    fresh = notebook_launcher(
        train, num_processes=2, resume="auto", project_dir=tmp_path / "p", **QUIET
    )
    assert same(fresh, reference)


def test_a_function_that_loads_its_own_checkpoint_keeps_working(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    stopped_run(tmp_path, 0.2)
    own = str(tmp_path / "project" / "checkpoints" / "checkpoint_0")
    # resume=True names the same checkpoint; the function's own load_state wins, once.
    resumed = notebook_launcher(
        train, kwargs={"own_checkpoint": own}, num_processes=2, resume=True,
        project_dir=tmp_path / "project", **QUIET,
    )
    assert same(resumed, reference)


def wait_then_prepare(marker: str) -> None:
    Path(marker).write_text("setting up")
    time.sleep(60)  # data loading, say: no prepared DataLoader yet


def test_an_interrupt_before_the_training_loop_stops_at_once(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    thread = interrupt_when(marker, 0.3)
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            notebook_launcher(
                wait_then_prepare, args=(str(marker),), num_processes=2,
                on_interrupt="checkpoint", project_dir=tmp_path / "project", **QUIET,
            )
    finally:
        thread.join()
    assert time.monotonic() - started < 30
    assert str(info.value) == (
        "stopped at once: no prepared DataLoader to stop at yet (stop-and-resume guide, 'What "
        "it covers'); no checkpoint was saved"
    )


# -- refused before any process starts ---------------------------------------------------------


def never_called() -> None:
    raise AssertionError("no rank should have started")


def test_resume_without_a_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="resume='auto'"):
        notebook_launcher(never_called, num_processes=2, resume=True, project_dir=tmp_path)


def test_resume_with_another_world_size_is_refused(tmp_path: Path) -> None:
    stopped_run(tmp_path, 0.2)
    with pytest.raises(ValueError, match=r"written by 2 rank.*num_processes=2"):
        notebook_launcher(
            never_called, num_processes=3, resume=True, project_dir=tmp_path / "project"
        )


def test_a_project_dir_that_cannot_be_written_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(PermissionError, match="project_dir="):
        notebook_launcher(
            never_called, num_processes=2, checkpoint_every=10, project_dir=blocker / "run"
        )


def test_stop_and_resume_are_refused_where_they_do_not_run_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="elastic"):
        notebook_launcher(never_called, num_processes=2, max_restarts=1, checkpoint_every=5)
    assert list(tmp_path.iterdir()) == [], "a refused launch creates no folder"


def test_a_bad_option_is_named_before_the_launch_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The option's own error, not 'not available through the elastic agent'."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="on_interrupt='pause' is not a valid choice"):
        notebook_launcher(never_called, num_processes=2, max_restarts=1, on_interrupt="pause")
    assert list(tmp_path.iterdir()) == []


def test_a_failure_during_a_stop_policy_is_still_the_root_cause(tmp_path: Path) -> None:
    def broken() -> None:
        raise ValueError("boom")

    with pytest.raises(WorkerError, match="boom"):
        notebook_launcher(
            broken, num_processes=2, on_interrupt="checkpoint", project_dir=tmp_path, **QUIET
        )


# -- warm ranks ---------------------------------------------------------------------------------


def test_warm_ranks_stop_gracefully_stay_warm_and_a_new_session_resumes(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    import nbtrain

    project, marker = tmp_path / "project", tmp_path / "marker"
    with nbtrain.start_ranks(2, on_interrupt="checkpoint", project_dir=project, **QUIET) as ranks:
        pids = ranks.pull("__import__('os').getpid()")
        thread = interrupt_when(marker, 0.3)
        try:
            with pytest.raises(KeyboardInterrupt, match="idle again with its state"):
                ranks.run(train, marker=str(marker), slow=0.03)
        finally:
            thread.join()
        assert ranks.pull("__import__('os').getpid()") == pids, "no restart: still warm"
        assert (project / "checkpoints" / "checkpoint_0" / "nbtrain_checkpoint.json").is_file()
    with nbtrain.start_ranks(2, resume=True, project_dir=project, **QUIET) as ranks:
        assert same(ranks.run(train), reference)


def test_one_warm_run_can_ask_for_the_graceful_stop_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nbtrain

    monkeypatch.chdir(tmp_path)  # the default project_dir: nbtrain-runs/session here
    marker = tmp_path / "marker"
    with nbtrain.start_ranks(2, **QUIET) as ranks:
        with pytest.raises(ValueError, match="on_interrupt='later'"):
            ranks.run(train, on_interrupt="later")  # checked before anything is sent
        thread = interrupt_when(marker, 0.3)
        try:
            with pytest.raises(KeyboardInterrupt, match="stopped at step"):
                ranks.run(train, marker=str(marker), slow=0.03, on_interrupt="checkpoint")
        finally:
            thread.join()
        saved = tmp_path / "nbtrain-runs" / "session" / "checkpoints" / "checkpoint_0"
        assert (saved / "nbtrain_checkpoint.json").is_file()
        assert ranks.pull("1 + 1") == [2, 2]


def test_warm_ranks_refuse_bad_stop_options_before_starting(tmp_path: Path) -> None:
    import nbtrain

    with pytest.raises(FileNotFoundError, match="resume=True"):
        nbtrain.start_ranks(2, resume=True, project_dir=tmp_path)
