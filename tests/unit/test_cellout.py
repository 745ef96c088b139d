"""Rank output as the cell's output (kernel/run/cellout.py): prefixed, filtered, coalesced, never
lost: flood control in the cell, every line in the launch's log folder."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from nbtrain.display.runstate import OutputLine, RunState
from nbtrain.kernel.run import cellout
from nbtrain.kernel.run.cellout import CellOutput
from nbtrain.shared.events import Output
from nbtrain.shared.options import OutputMode


@pytest.fixture(autouse=True)
def log_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "logs"
    monkeypatch.setenv("NBTRAIN_LOG_DIR", str(root))
    return root


def attached(mode: OutputMode = OutputMode.ALL, shared: bool = False):
    out, err = io.StringIO(), io.StringIO()
    cells = CellOutput(mode, stdout=out, stderr=out if shared else err)
    state = RunState([0, 1])
    state.add_output_listener(cells.take)
    return state, cells, out, err


def test_lines_are_prefixed_routed_filtered_and_written_once_per_flush() -> None:
    state, cells, out, err = attached()
    state.apply(Output(0, "stdout", "hello from 0"))
    state.apply(Output(1, "stderr", "warning from 1"))
    assert out.getvalue() == ""  # buffered until the run's next tick
    cells.flush()
    assert out.getvalue() == "[rank 0] hello from 0\n"
    assert err.getvalue() == "[rank 1] warning from 1\n"
    cells.flush()
    assert out.getvalue().count("hello from 0") == 1
    for mode, expected in [(OutputMode.MAIN, "[rank 0] x\n"), (OutputMode.NONE, "")]:
        state, cells, out, err = attached(mode)
        state.apply(Output(0, "stdout", "x"))
        state.apply(Output(1, "stdout", "y"))
        cells.close()
        assert out.getvalue() + err.getvalue() == expected


class CountingStream(io.StringIO):
    writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def test_a_burst_is_one_write_and_keeps_stdout_stderr_order() -> None:
    shared = CountingStream()
    cells = CellOutput(OutputMode.ALL, stdout=shared, stderr=shared)
    state = RunState([0])
    state.add_output_listener(cells.take)
    for i in range(3000):  # more than the RunState keeps (its deque is capped)
        state.apply(Output(0, "stdout", f"line {i}"))
    state.apply(Output(0, "stderr", "err"))
    state.apply(Output(0, "stdout", "after"))
    cells.flush()
    lines = shared.getvalue().splitlines()
    assert lines == [*(f"[rank 0] line {i}" for i in range(3000)), "[rank 0] err", "[rank 0] after"]
    assert shared.writes == 3  # one per run of the same stream


def test_a_flood_is_held_back_counted_and_every_line_is_in_the_log_folder(
    log_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cellout, "RATE", 0.0)  # no refill: only the burst reaches the cell
    monkeypatch.setattr(cellout, "BURST", 100)
    state, cells, out, err = attached(OutputMode.MAIN)
    for i in range(1000):
        state.apply(Output(i % 2, "stdout", f"line {i}"))
    cells.close()
    shown = out.getvalue().splitlines()
    assert shown == [f"[rank 0] line {i}" for i in range(0, 200, 2)]
    assert cells.folder is not None and cells.folder.parent == log_root
    notice = err.getvalue()
    assert "400 output lines held back from the cell (rank 0: 400)" in notice
    assert str(cells.folder) in notice and notice == f"[nbtrain] {cells.held_summary()}\n"
    for rank in (0, 1):  # every line of every rank, output= notwithstanding
        logged = (cells.folder / f"rank-{rank}.log").read_text().splitlines()
        assert logged == [f"line {i}" for i in range(rank, 1000, 2)]


def test_stderr_lines_are_marked_in_the_log_file() -> None:
    state, cells, _, _ = attached()
    state.apply(Output(1, "stdout", "plain"))
    state.apply(Output(1, "stderr", "warned"))
    cells.close()
    assert cells.folder is not None
    assert (cells.folder / "rank-1.log").read_text() == "plain\n[stderr] warned\n"


def test_old_launch_folders_are_pruned(log_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cellout, "KEEP", 3)
    folders = []
    for _ in range(5):
        state, cells, _, _ = attached()
        state.apply(Output(0, "stdout", "x"))
        cells.close()
        folders.append(cells.folder)
    kept = sorted(p for p in log_root.iterdir())
    assert len(kept) == 3 and folders[-1] in kept


def test_a_stack_dump_goes_to_the_log_not_the_cell() -> None:
    # The cell gets the account of where each rank was (the TimeoutError's, the note's); the
    # raw dump, with nbtrain's frames and the kernel's temp file names, only the rank's log.
    state, cells, _, err = attached()
    state.apply(Output(1, "stderr", "before the timeout"))
    dump = [
        "Current thread 0x00007f30ff810b80 (most recent call first):",
        '  File "/site-packages/torch/distributed/distributed_c10d.py", line 5356 in barrier',
        '  File "/tmp/ipykernel_1/2.py", line 4 in train',
        '  File "/x/nbtrain/rank/worker.py", line 109 in call_and_report',
    ]
    for line in dump:
        state.apply(Output(1, "stderr", line, dump=True))
    cells.close()
    assert err.getvalue() == "[rank 1] before the timeout\n"
    assert cells.folder is not None
    logged = (cells.folder / "rank-1.log").read_text()
    assert all(f"[stderr] {line}" in logged for line in dump)


def test_every_rich_form_of_a_rank_display_carries_the_rank() -> None:
    markdown = cellout.labelled(3, {"text/markdown": "**loss** fell", "text/plain": "<Markdown>"})
    assert markdown["text/markdown"].startswith("<sub>rank 3</sub>\n\n**loss** fell")
    assert markdown["text/plain"] == "[rank 3] <Markdown>"
    figure = cellout.labelled(1, {"image/png": "iVBOR", "text/plain": "<Figure>"})
    assert "rank 1" in figure["text/html"] and 'src="data:image/png;base64,iVBOR"' in (
        figure["text/html"]
    )


def test_a_warm_cells_first_lines_come_below_its_view_not_above() -> None:
    from nbtrain.display.deferred import DeferredView

    cell = io.StringIO()

    class Shown:
        def draw(self, state: RunState, *, now: bool = False) -> None:
            if "VIEW" not in cell.getvalue():
                cell.write("VIEW\n")

        def close(self, state: RunState) -> None:
            pass

        def note(self, text: str) -> None:
            pass

    view = DeferredView(Shown, after=0.05)
    output = CellOutput(OutputMode.ALL, stdout=cell, stderr=cell, hold=view.pending)
    state = RunState([0])
    output.take(OutputLine(0, 0, "stdout", "early"))
    output.flush()
    view.draw(state)
    assert cell.getvalue() == ""  # held: the view may still appear
    time.sleep(0.06)
    output.flush()
    view.draw(state)
    output.flush()
    assert cell.getvalue() == "VIEW\n[rank 0] early\n"


def test_a_quick_warm_cell_gets_its_lines_at_the_end() -> None:
    cell = io.StringIO()
    output = CellOutput(OutputMode.ALL, stdout=cell, stderr=cell, hold=lambda: True)
    output.take(OutputLine(0, 0, "stdout", "quick"))
    output.flush()
    assert cell.getvalue() == ""
    output.close()
    assert cell.getvalue() == "[rank 0] quick\n"


def test_a_figure_sent_as_raw_png_bytes_is_labelled_too() -> None:
    figure = cellout.labelled(0, {"image/png": b"\x89PNG", "text/plain": "<Figure>"})
    assert figure["image/png"] == "iVBORw=="  # base64, as a notebook stores it
    assert ">rank 0</div><img src=\"data:image/png;base64,iVBORw==\">" in figure["text/html"]
