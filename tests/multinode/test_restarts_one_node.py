"""max_restarts on one node: the same attempt loop, without a rendezvous (real ranks)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch.distributed as dist

from nbtrain import WorkerError, notebook_launcher

pytestmark = pytest.mark.timeout(120)

QUIET = {"progress": "off", "output": "none"}


def flaky(marker: str, counter: str) -> str:
    with open(counter, "a") as handle:
        handle.write(os.environ["RANK"] + "\n")
    dist.init_process_group("gloo")
    if os.environ["RANK"] == "1" and not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("first attempt fails")
    dist.barrier()
    dist.destroy_process_group()
    return os.environ["TORCHELASTIC_RESTART_COUNT"]


def always_fails(counter: str) -> None:
    with open(counter, "a") as handle:
        handle.write(os.environ["RANK"] + "\n")
    if os.environ["RANK"] == "1":
        raise ValueError("broken for good")


def test_one_restart_recovers(tmp_path: Path):
    marker, counter = str(tmp_path / "marker"), str(tmp_path / "count")
    values = notebook_launcher(
        flaky, (marker, counter), num_processes=2, max_restarts=1, return_all=True, **QUIET
    )
    assert values == ["1", "1"]  # every rank restarted, and knows its attempt
    assert sorted(Path(counter).read_text().split()) == ["0", "0", "1", "1"]


def test_restarts_run_out_and_the_last_failure_is_raised(tmp_path: Path):
    counter = str(tmp_path / "count")
    with pytest.raises(WorkerError) as caught:
        notebook_launcher(always_fails, (counter,), num_processes=2, max_restarts=2, **QUIET)
    assert caught.value.rank == 1 and caught.value.type_name == "ValueError"
    assert "broken for good" in str(caught.value)
    assert Path(counter).read_text().split().count("1") == 3  # the first run and two restarts


def test_a_single_rank_with_restarts_runs_in_a_child_process(tmp_path: Path):
    marker = str(tmp_path / "marker")

    def one(marker: str) -> tuple[int, str]:
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(7)  # a hard crash: only a separate process can be restarted after it
        return os.getpid(), os.environ["TORCHELASTIC_RESTART_COUNT"]

    pid, attempt = notebook_launcher(one, (marker,), num_processes=1, max_restarts=1, **QUIET)
    assert pid != os.getpid() and attempt == "1"


def test_relaunch_after_restarts_in_the_same_process(tmp_path: Path):
    for round_ in range(2):
        marker = str(tmp_path / f"marker{round_}")
        counter = str(tmp_path / f"count{round_}")
        assert (
            notebook_launcher(flaky, (marker, counter), num_processes=2, max_restarts=1, **QUIET)
            == "1"
        )


def lost_peer(counter: str) -> None:
    with open(counter, "a") as handle:
        handle.write(os.environ["TORCHELASTIC_RESTART_COUNT"] + "\n")
    raise RuntimeError("Connection reset by peer")


def test_peer_loss_failures_alone_are_still_failures(tmp_path: Path):
    counter = str(tmp_path / "count")
    with pytest.raises(WorkerError, match="Connection reset by peer"):
        notebook_launcher(lost_peer, (counter,), num_processes=2, max_restarts=1, **QUIET)
    assert set(Path(counter).read_text().split()) == {"0", "1"}  # the first run and a restart
