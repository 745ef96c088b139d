"""A wide run's output and errors: identical lines grouped with their ranks, each rank's order
kept, every line still in the log; many consequences of one failure summarised."""

from __future__ import annotations

import io

from nbtrain.display.runstate import OutputLine
from nbtrain.kernel.run.cellout import CellOutput
from nbtrain.kernel.run.outgroup import LineGroups
from nbtrain.shared.errors import WorkerError
from nbtrain.shared.options import OutputMode


def test_the_same_line_of_64_ranks_is_written_once_with_their_ranks() -> None:
    groups = LineGroups(hold=1.0)
    for rank in range(64):
        groups.add(rank, "stdout", "epoch 1 done", now=0.0)
    groups.add(5, "stdout", "rank five only", now=0.1)
    assert groups.take(0.5) == []  # others may still join
    assert groups.take(1.2) == [("stdout", "[ranks 0-63] epoch 1 done\n"),
                                ("stdout", "[rank 5] rank five only\n")]


def test_a_group_waits_while_ranks_keep_joining_but_not_forever() -> None:
    groups = LineGroups(hold=0.5, max_hold=3.0)
    for rank in range(8):  # one rank every 0.3 s: each joins before the last one's wait ends
        groups.add(rank, "stdout", "step 50", now=0.3 * rank)
    assert groups.take(2.2) == []
    assert groups.take(2.6) == [("stdout", "[ranks 0-7] step 50\n")]
    written = []
    for rank in range(20):  # the wait ends MAX_HOLD after the first copy: later ones regroup
        written += groups.take(10 + 0.3 * rank)
        groups.add(rank, "stdout", "step 100", now=10 + 0.3 * rank)
    written += groups.take(30.0)
    assert [line for _, line in written] == ["[ranks 0-9] step 100\n", "[ranks 10-19] step 100\n"]


def test_a_rank_s_own_order_is_kept_when_ranks_print_in_different_orders() -> None:
    groups = LineGroups(hold=1.0)
    groups.add(0, "stdout", "A", 0.0)
    groups.add(0, "stdout", "B", 0.0)
    groups.add(1, "stdout", "B", 0.0)
    groups.add(1, "stdout", "A", 0.0)  # after its B: must not join the first A
    lines = [line for _, line in groups.take(0.0, final=True)]
    assert lines == ["[rank 0] A\n", "[ranks 0-1] B\n", "[rank 1] A\n"]
    for rank in (0, 1):  # each rank's lines, read from the groups, are in its own order
        own = [line.split("] ")[1].strip() for line in lines if str(rank) in line.split("]")[0]]
        assert own == (["A", "B"] if rank == 0 else ["B", "A"])


def test_the_cell_gets_grouped_lines_and_the_log_every_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NBTRAIN_LOG_DIR", str(tmp_path))
    out = io.StringIO()
    cell = CellOutput(OutputMode.ALL, stdout=out, stderr=io.StringIO(), wide=True)
    for index, rank in enumerate(range(32)):
        cell.take(OutputLine(index, rank, "stdout", "all ranks reached step 50"))
    cell.close()
    assert out.getvalue() == "[ranks 0-31] all ranks reached step 50\n"
    assert cell.folder is not None
    assert (cell.folder / "rank-17.log").read_text() == "all ranks reached step 50\n"


def test_62_consequences_of_one_failure_are_summarised() -> None:
    others = {rank: f"RuntimeError: Connection closed by peer [127.0.0.1]:{40000 + rank}"
              for rank in range(62)}
    error = WorkerError(63, type_name="ValueError", message="boom", other_failures=others)
    text = str(error)
    assert "62 other ranks failed: ranks 0-61 with RuntimeError (e.g. rank 0: RuntimeError" in text
    assert text.count("Connection closed") == 1
    few = WorkerError(3, type_name="ValueError", message="boom",
                      other_failures={0: "RuntimeError: lost"})
    assert "then, as a consequence: rank 0: RuntimeError: lost" in str(few)
    stopped = WorkerError(31, type_name="ValueError", message="boom", stopped=31)
    assert str(stopped) == "rank 31 failed with ValueError: boom\n  31 other ranks were stopped"
