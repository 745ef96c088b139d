"""Stop and resume options checked in the kernel (kernel/options/stopping.py), and how a
graceful stop is folded into the run's outcome and view."""

from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path

import pytest

from nbtrain.display.formatting import format_status
from nbtrain.display.runstate import RankStatus, RunState
from nbtrain.kernel.group.outcome import Outcome
from nbtrain.kernel.launch.choose import choose
from nbtrain.kernel.options.config import build_config
from nbtrain.kernel.options.stopping import StopOptions, build_policy
from nbtrain.shared.events import Exited, Status, Stopped


def policy(tmp_path: Path, **options):
    return build_policy("train", 2, StopOptions(project_dir=tmp_path, **options))


def test_no_stop_option_means_no_policy(tmp_path: Path) -> None:
    assert build_policy("train", 2) is None


def xla_launch():
    config = build_config(
        num_processes=2, start_method="fork", mixed_precision=None, gpu_ids=None, num_nodes=1,
        node_rank=0, rdzv_endpoint=None, max_restarts=0, timeout=None, output="all",
        progress="off", return_all=False, allow_xla=False,
    )
    config = dataclasses.replace(config, xla_device="CPU")  # (no torch_xla in this venv)
    return choose(config, cluster=False)  # the kind that runs it: torch_xla's host


def test_a_launch_asking_for_stop_where_it_does_not_run_is_refused_before_any_folder(
    tmp_path: Path,
) -> None:
    with pytest.raises(ValueError, match="on XLA/TPU"):
        build_policy(
            "train", 2, StopOptions(on_interrupt="checkpoint", project_dir=tmp_path / "run"),
            refused=xla_launch().no_stop_resume,
        )
    assert not (tmp_path / "run").exists()
    assert build_policy("train", 2, refused=xla_launch().no_stop_resume) is None  # asked none


@pytest.mark.parametrize(
    ("every", "steps", "seconds"),
    [
        (500, 500, None),
        ("90s", None, 90.0),
        ("10min", None, 600.0),
        ("1.5h", None, 5400.0),
        (datetime.timedelta(minutes=2), None, 120.0),
    ],
)
def test_checkpoint_every_takes_steps_or_a_duration(tmp_path, every, steps, seconds) -> None:
    made = policy(tmp_path, checkpoint_every=every)
    assert made is not None
    assert (made.every_steps, made.every_seconds) == (steps, seconds)
    assert (tmp_path / "checkpoints").is_dir(), "the folder is made (and proven writable)"


@pytest.mark.parametrize("every", [0, -5, "soon", "5 parsecs", 2.5, True, "0s"])
def test_a_bad_checkpoint_every_is_explained(tmp_path, every) -> None:
    with pytest.raises((TypeError, ValueError), match="checkpoint_every="):
        policy(tmp_path, checkpoint_every=every)


def test_bad_on_interrupt_and_resume_values_name_the_choices(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"on_interrupt='save'.*'checkpoint'"):
        policy(tmp_path, on_interrupt="save")
    with pytest.raises(ValueError, match=r"resume='yes'.*'auto'"):
        policy(tmp_path, resume="yes")
    with pytest.raises(ValueError, match="total_limit"):
        policy(tmp_path, checkpoint_every=5, total_limit=0)


def test_project_dir_alone_asks_what_it_is_for(tmp_path) -> None:
    with pytest.raises(ValueError, match="only used for checkpoints"):
        build_policy("train", 2, StopOptions(project_dir=tmp_path))


def test_the_default_project_dir_is_named_after_the_function(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    made = build_policy("<lambda>", 2, StopOptions(on_interrupt="checkpoint"))
    assert made is not None and made.on_interrupt
    assert made.project_dir == str(tmp_path / "nbtrain-runs" / "lambda")


def fake_checkpoint(root: Path, number: int, world: int, steps: int, complete: bool = True):
    folder = root / "checkpoints" / f"checkpoint_{number}"
    folder.mkdir(parents=True)
    if complete:
        meta = {"format": 2, "world_size": world, "steps": steps}
        (folder / "nbtrain_checkpoint.json").write_text(json.dumps(meta))
    return folder


def test_resume_picks_the_newest_complete_checkpoint_and_numbers_after_all(tmp_path) -> None:
    fake_checkpoint(tmp_path, 0, 2, 10)
    newest = fake_checkpoint(tmp_path, 1, 2, 20)
    fake_checkpoint(tmp_path, 2, 2, 30, complete=False)  # a save cut short
    made = policy(tmp_path, resume=True, checkpoint_every=5)
    assert made is not None
    assert made.resume_from == str(newest.absolute()) and made.resumed_steps == 20
    assert made.next_number == 3


def test_resume_from_must_be_a_complete_checkpoint(tmp_path) -> None:
    cut = fake_checkpoint(tmp_path, 0, 2, 10, complete=False)
    with pytest.raises(FileNotFoundError, match=r"resume_from=.*not a complete checkpoint"):
        build_policy("train", 2, StopOptions(resume_from=cut))


def test_a_graceful_stop_is_no_failure_and_its_row_says_where_it_stopped() -> None:
    state, outcome = RunState([0, 1]), Outcome([0, 1])
    for event in (
        Status(0, "saving checkpoint…"),
        Stopped(0, 40, "/p/checkpoints/checkpoint_0"),
        Stopped(1, 40, "/p/checkpoints/checkpoint_0"),
        Exited(0, 0, None, False),
        Exited(1, 0, None, False),
    ):
        state.apply(event)
        outcome.apply(event)
    assert not outcome.has_failure()
    assert [stop.step for stop in outcome.stops()] == [40, 40]
    assert state.ranks[0].status is RankStatus.STOPPED
    assert format_status(state.ranks[0]) == "stopped (saved)"


def test_a_rank_row_shows_the_save_while_it_runs() -> None:
    state = RunState([0])
    state.apply(Status(0, "saving checkpoint…"))
    assert format_status(state.ranks[0]) == "saving checkpoint…"
