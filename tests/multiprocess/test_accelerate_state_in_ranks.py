"""Hugging Face Accelerate's own state inside nbtrain's CPU ranks describes the launch's world
(issue 43, point 7): a bare ``accelerate.PartialState()`` in rank 1 of 2 says process 1 of 2,
``DistributedType.MULTI_CPU``, not main; so Accelerate's ``on_main_process`` (the state's and
the trackers' decorator), ``main_process_first()`` and a custom tracker on Accelerate's own
``GeneralTracker`` base behave as under torchrun with Accelerate's Accelerator. Before the fix
every rank said "process 0 of 1, DistributedType.NO" and ran all of them as the main process.

The real Accelerate, real rank processes, gloo. (The module imports no Accelerate at its top:
a spawn rank imports this module, and must not have Accelerate loaded before it asks.)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import nbtrain
from nbtrain import notebook_launcher

pytestmark = pytest.mark.timeout(300)

QUIET: dict[str, Any] = {"progress": "off", "output": "none"}
HOLD = 1.0  # seconds the main process stays inside main_process_first()


def _state() -> dict[str, Any]:
    from accelerate import PartialState

    state = PartialState()
    return {
        "index": state.process_index,
        "processes": state.num_processes,
        "local": state.local_process_index,
        "type": str(state.distributed_type),
        "main": state.is_main_process,
        "device": state.device.type,  # (Accelerate's MULTI_CPU device is "cpu:0")
    }


def _recording_tracker(directory: Path) -> Any:
    """A custom tracker on Accelerate's own base class, written as Accelerate's tracking guide
    shows it: ``@on_main_process`` on the methods that would start and write a real run."""
    from accelerate.tracking import GeneralTracker, on_main_process

    class Recording(GeneralTracker):
        name = "recording"
        requires_logging_directory = False

        def __init__(self) -> None:
            super().__init__()
            self.calls: list[str] = []

        @property
        def tracker(self) -> list[str]:
            return self.calls

        @on_main_process
        def start(self) -> None:
            self.calls.append("start")

        @on_main_process
        def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
            self.calls.append(f"log {step}")

        @on_main_process
        def finish(self) -> None:
            self.calls.append("finish")
            (directory / "recording.json").write_text(json.dumps(self.calls))

    return Recording()


def accelerate_in_rank(directory: str) -> dict[str, Any]:
    """Accelerate's state asked first (it forms the process group itself), then its helpers."""
    loaded_before = "accelerate.state" in sys.modules
    here = Path(directory)
    result = {"loaded before": loaded_before, **_state()}
    from accelerate import PartialState

    state = PartialState()
    ran: list[int] = []
    state.on_main_process(lambda: ran.append(state.process_index))()
    result["on_main_process ran"] = ran

    state.wait_for_everyone()  # both ranks are here: the timings below are comparable
    with state.main_process_first():
        entered = time.monotonic()
        if state.is_main_process:
            time.sleep(HOLD)
    result["entered"], result["left"] = entered, time.monotonic()

    own = here / f"rank{os.environ['RANK']}"  # (the launch's rank, whatever Accelerate says)
    own.mkdir()
    tracker = _recording_tracker(own)
    tracker.start()
    tracker.log({"loss": 1.0}, step=3)
    tracker.finish()
    result["tracker calls"] = tracker.calls
    state.wait_for_everyone()
    return result


def check(results: list[dict[str, Any]], directory: Path) -> None:
    first, second = results
    assert [(r["index"], r["processes"], r["local"]) for r in results] == [(0, 2, 0), (1, 2, 1)]
    assert {r["type"] for r in results} == {"DistributedType.MULTI_CPU"}
    assert [r["main"] for r in results] == [True, False]
    assert {r["device"] for r in results} == {"cpu"}
    assert [r["on_main_process ran"] for r in results] == [[0], []]
    # rank 1 entered main_process_first() only after rank 0 had left it
    assert second["entered"] >= first["left"] - 0.05, (first, second)
    assert second["entered"] - first["entered"] >= HOLD * 0.9
    assert [r["tracker calls"] for r in results] == [["start", "log 3", "finish"], []]
    assert json.loads((directory / "rank0" / "recording.json").read_text())[0] == "start"
    assert not (directory / "rank1" / "recording.json").exists()


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_bare_partial_state_sees_two_ranks(start_method: str, tmp_path: Path) -> None:
    results = notebook_launcher(
        accelerate_in_rank,
        (str(tmp_path),),
        num_processes=2,
        start_method=start_method,
        return_all=True,
        **QUIET,
    )
    check(results, tmp_path)
    if start_method == "spawn":
        # a fresh rank that has not asked for Accelerate has not loaded it (nbtrain waits
        # for the user's import)
        assert [r["loaded before"] for r in results] == [False, False]


def nbtrain_accelerator_then_accelerate() -> dict[str, Any]:
    """nbtrain's Accelerator forms the process group; Accelerate's state joins that world."""
    accelerator = nbtrain.Accelerator()
    state = _state()
    import accelerate

    # Accelerate's own Accelerator (Transformers' Trainer makes one) agrees.
    other = accelerate.Accelerator()
    return {
        **state,
        "nbtrain": (accelerator.process_index, accelerator.num_processes),
        "accelerate": (other.process_index, other.num_processes),
    }


def accelerate_then_nbtrain_accelerator() -> dict[str, Any]:
    """Accelerate's state first (it forms the group); nbtrain's Accelerator joins it."""
    state = _state()
    accelerator = nbtrain.Accelerator()
    import torch

    total = accelerator.reduce(torch.tensor([accelerator.process_index + 1.0]), "sum")
    return {**state, "nbtrain": (accelerator.process_index, accelerator.num_processes),
            "sum": total.item()}


def test_either_accelerator_first() -> None:
    first = notebook_launcher(
        nbtrain_accelerator_then_accelerate, num_processes=2, start_method="fork",
        return_all=True, **QUIET,
    )
    assert [(r["index"], r["processes"], r["main"]) for r in first] == [(0, 2, True), (1, 2, False)]
    assert [r["nbtrain"] for r in first] == [(0, 2), (1, 2)]
    assert [r["accelerate"] for r in first] == [(0, 2), (1, 2)]
    second = notebook_launcher(
        accelerate_then_nbtrain_accelerator, num_processes=2, start_method="fork",
        return_all=True, **QUIET,
    )
    assert [(r["index"], r["processes"]) for r in second] == [(0, 2), (1, 2)]
    assert [r["nbtrain"] for r in second] == [(0, 2), (1, 2)]
    assert [r["sum"] for r in second] == [3.0, 3.0]  # one group: a real all-reduce over both


def test_warm_ranks_keep_the_world_between_calls(tmp_path: Path) -> None:
    with nbtrain.start_ranks(2, start_method="spawn", return_all=True, **QUIET) as ranks:
        for _ in range(2):  # the second call finds the state Accelerate formed in the first
            states = ranks.run(_state)
            assert [(s["index"], s["processes"], s["main"]) for s in states] == [
                (0, 2, True),
                (1, 2, False),
            ]
        results = ranks.run(accelerate_in_rank, str(tmp_path))
    check(results, tmp_path)


def test_fork_ranks_after_this_process_formed_its_own_state() -> None:
    """Accelerate loaded here and its state formed ("0 of 1"): forked ranks start with it
    loaded (the switch is taken at once, not on import) and forget this process's state."""
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        assert PartialState().num_processes == 1
        results = notebook_launcher(
            _state, num_processes=2, start_method="fork", return_all=True, **QUIET
        )
        assert [(r["index"], r["processes"], r["main"]) for r in results] == [
            (0, 2, True),
            (1, 2, False),
        ]
        assert PartialState().num_processes == 1  # this process's own state is left as it was
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
