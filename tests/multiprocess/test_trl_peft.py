"""TRL's ``SFTTrainer`` with a PEFT LoRA adapter in nbtrain's ranks gives torchrun's run bitwise
(the losses it logs and the trained adapter), and ``NbtrainCallback`` shows the loss the Trainer
logs: the mean over the ranks, as torchrun's log says (issue 43, point 11; the guide
notebooks/guides/trl-peft.md states what this checks). A tiny Llama made in code: no downloads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nbtrain import notebook_launcher
from nbtrain.display.runstate import RunState
from nbtrain.shared.events import Event, Log

pytestmark = pytest.mark.timeout(480)

TESTS = Path(__file__).resolve().parents[1]


def torchrun(out: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         str(TESTS / "tinysft.py"), str(out)],
        capture_output=True, text=True, timeout=400, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"result-{rank}.json").read_text()) for rank in (0, 1)]


def test_sft_with_lora_matches_torchrun(tmp_path, monkeypatch):
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    from tinysft import train

    shown: list[Event] = []
    original = RunState.apply

    def apply(self: RunState, event: Event) -> None:
        shown.append(event)
        original(self, event)

    monkeypatch.setattr(RunState, "apply", apply)
    (tmp_path / "nbtrain").mkdir()
    (tmp_path / "torchrun").mkdir()
    ours = notebook_launcher(train, (str(tmp_path / "nbtrain"), True), num_processes=2,
                             start_method="fork", return_all=True, progress="off")
    theirs = torchrun(tmp_path / "torchrun")
    assert [r["world"] for r in ours] == [2, 2]
    assert len(ours[0]["losses"]) == 6
    for mine, reference in zip(ours, theirs, strict=True):
        assert mine["losses"] == reference["losses"]  # bitwise: floats compared exactly
        assert mine["adapter"] == reference["adapter"]
    # The live view's loss at each step is the one torchrun's Trainer logged (the ranks' mean).
    for rank in (0, 1):
        # (one Log event carries the points logged since the rank's last update: earlier, then
        # its own values)
        points = [values for e in shown if isinstance(e, Log) and e.rank == rank
                  for values in (*(v for _, v in e.earlier), e.values)]
        logged = [values["loss"] for values in points if "loss" in values]
        assert logged == theirs[rank]["losses"]
