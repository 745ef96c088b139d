"""progress() / log() / NbtrainCallback in real ranks started by notebook_launcher.

The kernel side's RunState.apply is wrapped to record every event it folds, in arrival order:
that is exactly what the ranks sent through their pipes (plus the kernel's Output/Exited).
"""

from __future__ import annotations

import time

import pytest

from nbtrain import WorkerError, notebook_launcher
from nbtrain.display.runstate import RunState
from nbtrain.rank.reporter import INTERVAL
from nbtrain.shared.events import Event, Failed, Finished, Log, Progress

STEPS = 300


def of(events: list[Event], kind: type, rank: int) -> list:
    return [e for e in events if isinstance(e, kind) and e.rank == rank]


def train_loop(steps: int, fail_rank: int | None = None) -> str:
    import os

    from nbtrain import log, progress

    rank = int(os.environ["RANK"])
    for i in progress(range(steps), desc="train"):
        time.sleep(0.003)
        log({"loss": float(i), "rank": float(rank)})
        if rank == fail_rank and i == 17:
            raise ValueError(f"boom on rank {rank}")
    log({"val_acc": 0.5 + rank})
    return f"rank {rank} ok"


def check_rank_events(events: list[Event], rank: int, steps: int) -> None:
    progress = of(events, Progress, rank)
    assert (progress[0].step, progress[0].total, progress[0].desc) == (0, steps, "train")
    assert (progress[-1].step, progress[-1].total) == (steps, steps)  # the final step
    assert [e.step for e in progress] == sorted(e.step for e in progress)
    duration = progress[-1].time - progress[0].time
    assert len(progress) <= duration / INTERVAL + 3, "updates were not coalesced"
    logs = of(events, Log, rank)
    assert len(logs) <= duration / INTERVAL + 4
    last: dict[str, float] = {}
    for event in logs:
        last.update(event.values)
    assert last == {"loss": steps - 1.0, "rank": float(rank), "val_acc": 0.5 + rank}
    finished = of(events, Finished, rank)
    assert len(finished) == 1
    assert events.index(progress[-1]) < events.index(finished[0])
    assert events.index(logs[-1]) < events.index(finished[0])  # val_acc, held, then flushed


@pytest.mark.timeout(120)
def test_ranks_send_coalesced_progress_and_their_last_metrics(received) -> None:
    result = notebook_launcher(
        train_loop,
        (STEPS,),
        num_processes=2,
        start_method="fork",
        progress="off",
        return_all=True,
    )
    assert result == ["rank 0 ok", "rank 1 ok"]
    for rank in (0, 1):
        check_rank_events(received, rank, STEPS)


@pytest.mark.timeout(120)
def test_one_process_in_the_kernel_reports_the_same_way(received) -> None:
    assert notebook_launcher(train_loop, (STEPS,), num_processes=1, progress="off") == "rank 0 ok"
    check_rank_events(received, 0, STEPS)


@pytest.mark.timeout(120)
def test_a_failing_rank_reports_where_it_stopped(received) -> None:
    with pytest.raises(WorkerError) as caught:
        notebook_launcher(
            train_loop, (STEPS, 1), num_processes=2, start_method="fork", progress="off"
        )
    assert caught.value.rank == 1
    last = of(received, Progress, 1)[-1]
    assert (last.step, last.total) == (17, STEPS)
    assert of(received, Log, 1)[-1].values["loss"] == 17.0  # the metric logged just before
    assert of(received, Failed, 1)[0].message == "boom on rank 1"


def raw_loop(steps: int, fail_rank: int | None = None) -> int:
    """Raw DDP style: log() every step, no progress() loop around it."""
    import os

    from nbtrain import log

    rank = int(os.environ["RANK"])
    for i in range(steps):
        time.sleep(0.003)
        log({"loss": float(i)}, step=i)
        if rank == fail_rank and i == steps // 2:
            raise ValueError(f"boom on rank {rank}")
    return rank


@pytest.mark.timeout(120)
def test_raw_logs_every_step_are_coalesced_and_the_last_arrives_first(received) -> None:
    assert notebook_launcher(
        raw_loop, (STEPS,), num_processes=2, start_method="fork", progress="off",
        return_all=True,
    ) == [0, 1]
    for rank in (0, 1):
        logs = of(received, Log, rank)
        assert logs[-1].values == {"loss": STEPS - 1.0} and logs[-1].step == STEPS - 1
        duration = logs[-1].time - logs[0].time
        assert len(logs) <= duration / INTERVAL + 4, "logs outside a loop were not coalesced"
        assert received.index(logs[-1]) < received.index(of(received, Finished, rank)[0])


@pytest.mark.timeout(120)
def test_a_failing_rank_sends_its_last_raw_log_before_failed(received) -> None:
    with pytest.raises(WorkerError) as caught:
        notebook_launcher(
            raw_loop, (STEPS, 1), num_processes=2, start_method="fork", progress="off"
        )
    assert caught.value.rank == 1
    logs = of(received, Log, 1)
    assert logs[-1].values == {"loss": STEPS // 2}  # logged just before it raised
    assert received.index(logs[-1]) < received.index(of(received, Failed, 1)[0])


def trainer_run(output_dir: str) -> dict:
    import torch
    from torch import nn
    from transformers import Trainer, TrainingArguments

    from nbtrain import NbtrainCallback

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 1)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict:
            loss = nn.functional.mse_loss(self.linear(x).squeeze(-1), labels)
            return {"loss": loss}

    generator = torch.Generator().manual_seed(0)
    data = [
        {"x": torch.randn(4, generator=generator), "labels": torch.randn((), generator=generator)}
        for _ in range(64)
    ]
    args = TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=8,
        num_train_epochs=2,
        logging_steps=2,
        eval_strategy="epoch",
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(
        model=Tiny(),
        args=args,
        train_dataset=data,
        eval_dataset=data[:32],
        callbacks=[NbtrainCallback()],
    )
    trainer.train()
    trainer.evaluate()  # outside training: its own (outermost) bar, so its end surely arrives
    return {"max_steps": trainer.state.max_steps, "world": args.world_size}


@pytest.mark.timeout(300)
def test_the_trainer_callback_reports_steps_and_logs_from_every_rank(received, tmp_path) -> None:
    pytest.importorskip("transformers")
    info = notebook_launcher(
        trainer_run, (str(tmp_path),), num_processes=2, start_method="fork", progress="off"
    )
    assert info["world"] == 2
    max_steps = info["max_steps"]  # 64 samples / (4 per device * 2 ranks) * 2 epochs
    assert max_steps == 16
    for rank in (0, 1):
        train = [e for e in of(received, Progress, rank) if e.desc == "train"]
        assert (train[-1].step, train[-1].total) == (max_steps, max_steps)
        evaluation = of(received, Progress, rank)[-1]
        assert (evaluation.desc, evaluation.step, evaluation.total) == ("eval", 2, 2)
        names = set().union(*(e.values for e in of(received, Log, rank)))
        assert {"loss", "eval_loss", "train_loss"} <= names
        assert of(received, Log, rank)[-1].step == max_steps


def accelerated() -> int:
    from nbtrain import Accelerator

    return Accelerator().process_index


def test_a_starting_rank_says_what_it_is_busy_with(received: list[Event]) -> None:
    from nbtrain.shared.events import Status

    notebook_launcher(accelerated, num_processes=2, start_method="spawn", progress="off")
    for rank in (0, 1):
        notes = [event.text for event in of(received, Status, rank)]
        # A spawned rank is a fresh Python: each phase of its start is said before it begins.
        assert notes[:4] == [
            "starting Python",
            "importing torch",
            "loading the function and importing its modules",
            "",
        ], notes
        assert any(note.startswith("forming the process group") for note in notes), notes
        assert notes[-1] == "", notes  # said, then cleared: the row does not keep a stale note


def resumed_loop() -> int:
    from torch.utils.data import DataLoader

    from nbtrain import Accelerator, progress

    acc = Accelerator()
    loader = acc.prepare(DataLoader(list(range(80)), batch_size=2))  # 20 batches per rank
    loader.skip_first_batches(5)  # where a resumed run's loader starts (load_state pins it)
    return sum(1 for _ in progress(loader, desc="train"))


def test_a_resumed_pass_counts_from_where_it_resumed(received, monkeypatch) -> None:
    # 15 batches left of 20: the bar goes from 5 to 20/20 (full at the end, not 15/20), and
    # the run's step rate counts the 15 this run took.
    captured: list[RunState] = []
    original = RunState.finish

    def finish(self: RunState, summary: str, verdict=None) -> None:
        captured.append(self)
        original(self, summary, verdict)

    monkeypatch.setattr(RunState, "finish", finish)
    assert notebook_launcher(resumed_loop, num_processes=2, progress="off") == 15
    for rank in (0, 1):
        steps = [e.step for e in of(received, Progress, rank)]
        assert steps[0] >= 5 and steps[-1] == 20, steps
        assert {e.start for e in of(received, Progress, rank)} == {5}
    state = captured[0]
    assert all((view.step, view.total) == (20, 20) for view in state.ranks.values())
    assert all(view.iterations == 15 for view in state.ranks.values())


def test_the_kernels_own_phase_is_said_once_not_on_a_ranks_row(tmp_path) -> None:
    # A first fork launch in a fresh process imports torch there before it forks: that is the
    # launching process's phase, said once as a note, not as one rank's.
    import subprocess
    import sys

    script = tmp_path / "launch.py"
    script.write_text(
        "import time\nfrom nbtrain import notebook_launcher\n"
        "def work():\n    import torch\n    time.sleep(0.5)\n    return 1\n"
        "if __name__ == '__main__':\n"
        "    print(notebook_launcher(work, num_processes=2, start_method='fork', "
        "progress='text'))\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr
    lines = (out.stdout + out.stderr).splitlines()
    assert any(line.startswith("[nbtrain] importing torch") for line in lines), lines
    assert not any(line.startswith("[rank") and "importing" in line for line in lines), lines
