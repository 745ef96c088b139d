"""The dashboard inside a real Jupyter kernel (nbclient), read from the saved notebook.

When a launch ends its live dashboard is replaced in place by a static HTML + text/plain
rendering of the final state: that is what the saved notebook keeps (no widget mimetype, so a
reopened notebook never says "model not found"), and what these tests read. The text/plain is
the dashboard's plain-text version.
"""

from __future__ import annotations

import base64
import html
import re
import time
from html.parser import HTMLParser

import pytest
from kernelutil import Kernel

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

TRAIN = """
import os, time
from nbtrain import notebook_launcher, progress, log

def train(steps, fail_rank=None):
    rank = int(os.environ["RANK"])
    for i in progress(range(steps), desc="train"):
        time.sleep(0.01)
        log({"loss": 1.0 / (i + 1) + rank})
        if rank == fail_rank and i == 5:
            raise ValueError(f"boom on rank {rank}")
    print(f"rank {rank} finished")
    return rank
"""


class _Rows(HTMLParser):
    """Each div.nbtrain-row of the static dashboard: its data attributes and column texts."""

    COLUMNS = ("label", "steps", "metrics", "status")

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[int, dict[str, str]] = {}
        self._row: dict[str, str] | None = None
        self._column: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {name: value or "" for name, value in attrs}
        kind = found.get("class", "")
        if kind == "nbtrain-row":
            self._row = {"status_name": found["data-status"]}
            self.rows[int(found["data-rank"])] = self._row
        elif kind == "nbtrain-bar" and self._row is not None:
            self._row.update(value=found["data-value"], max=found["data-max"],
                             bar_style=found["data-style"])
        elif kind.removeprefix("nbtrain-") in self.COLUMNS and self._row is not None:
            self._column = kind.removeprefix("nbtrain-")
            self._row[self._column] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "div":
            self._column = None

    def handle_data(self, data: str) -> None:
        if self._row is not None and self._column is not None:
            self._row[self._column] += data


class Dashboard:
    """The static dashboard a cell's saved output holds once the launch ended."""

    def __init__(self, notebook, cell: int = 1) -> None:
        outputs = [
            o for o in notebook.cells[cell].outputs
            if "nbtrain-static" in o.get("data", {}).get("text/html", "")
        ]
        assert len(outputs) == 1, f"expected one dashboard, got {notebook.cells[cell].outputs}"
        self.data = outputs[0]["data"]
        self.markup = self.data["text/html"]

    def rows(self) -> dict[int, dict[str, str]]:
        """rank -> {"label", "value", "max", "bar_style", "steps", "metrics", "status", ...}."""
        parser = _Rows()
        parser.feed(self.markup)
        return parser.rows


def text(markup: str) -> str:
    """What the reader sees of a piece of markup."""
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


def widget_output(cell) -> dict:
    """The dashboard's saved output: static HTML and text, never a widget to look up."""
    outputs = [o for o in cell.outputs if "text/html" in o.get("data", {})]
    assert len(outputs) == 1, f"expected one dashboard, got {cell.outputs}"
    data = outputs[0]["data"]
    assert WIDGET_VIEW not in data, "a saved notebook would show 'model not found'"
    return data


@pytest.mark.timeout(300)
def test_a_three_rank_run_ends_with_every_bar_full_and_green(run_notebook) -> None:
    notebook = run_notebook(
        [
            TRAIN,
            "result = notebook_launcher(train, (40,), num_processes=3, start_method='fork')\n"
            "print('result', result)",
        ]
    )
    cell = notebook.cells[1]
    assert any("result 0" in o.get("text", "") for o in cell.outputs)
    dashboard = Dashboard(notebook)
    rows = dashboard.rows()
    assert sorted(rows) == [0, 1, 2]
    for rank, row in rows.items():
        assert row["label"] == f"rank {rank} · cpu"
        assert (row["value"], row["max"], row["bar_style"]) == ("40", "40", "success")
        assert row["steps"].startswith("train 40/40")
        assert row["metrics"] == f"loss {1 / 40 + rank:.3g}"  # compact: 3 digits
        assert row["status"] == "done"
    markup = dashboard.markup
    (chart,) = [base64.b64decode(data).decode() for data in  # the chart: an image of an SVG
                re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', markup)]
    assert 'data-metric="loss"' in chart and chart.count("<polyline") == 3  # a line per rank
    assert "<svg" not in markup  # nothing a sanitiser of untrusted notebooks would remove
    assert "rank 0 finished" not in markup  # the ranks' output is the cell's, not the view's
    assert "Done in" in markup  # the summary line
    data = widget_output(cell)
    assert data["text/plain"].splitlines()[0].startswith("[rank 0] train 40/40")
    assert "HBox" not in data["text/plain"] and "VBox" not in data["text/plain"]
    # What the ranks printed is the cell's own stream output, so a saved notebook keeps it all.
    printed = "".join(o.get("text", "") for o in cell.outputs if o["output_type"] == "stream")
    assert all(f"[rank {rank}] rank {rank} finished" in printed for rank in range(3))
    assert data["text/plain"].splitlines()[-1].startswith("Done in")


@pytest.mark.timeout(300)
def test_a_failing_rank_is_shown_in_red_with_its_reason(run_notebook) -> None:
    notebook = run_notebook(
        [
            TRAIN,
            "try:\n"
            "    notebook_launcher(train, (200, 1), num_processes=3, start_method='fork')\n"
            "except Exception as exc:\n"
            "    print('raised', type(exc).__name__, exc.rank)",
        ]
    )
    assert any("raised WorkerError 1" in o.get("text", "") for o in notebook.cells[1].outputs)
    rows = Dashboard(notebook).rows()
    failed = rows[1]
    assert failed["bar_style"] == "danger"
    assert failed["value"] == "5"  # where it stopped
    assert failed["status"] == "failed: ValueError: boom on rank 1"
    for rank in (0, 2):
        assert rows[rank]["bar_style"] == "warning"  # stopped by the launcher, not failed
        assert rows[rank]["status"] == "stopped"
    summary = widget_output(notebook.cells[1])["text/plain"].splitlines()[-1]
    assert summary.startswith("Failed after") and "rank 1" in summary


@pytest.mark.timeout(300)
def test_one_process_shows_the_same_dashboard(run_notebook) -> None:
    notebook = run_notebook([TRAIN, "notebook_launcher(train, (30,), num_processes=1)"])
    rows = Dashboard(notebook).rows()
    assert list(rows) == [0]
    assert (rows[0]["value"], rows[0]["max"], rows[0]["bar_style"]) == ("30", "30", "success")
    assert rows[0]["metrics"] == f"loss {1 / 30:.3g}"


MAX_UPDATES_PER_S = 10  # widget messages to the frontend, whatever the number of ranks


@pytest.mark.timeout(300)
def test_text_progress_in_a_kernel_prints_lines_and_no_widget(tmp_path) -> None:
    """(And in the same kernel, 8 ranks with the widget view: at most MAX_UPDATES_PER_S widget
    messages a second over the run, every rank logging and moving every 10 ms.)"""
    kernel = Kernel(tmp_path)
    try:
        out = kernel.run(TRAIN + "result = notebook_launcher(train, (40,), num_processes=2, "
                                 "start_method='fork', progress='text')", timeout=240)
        eight = kernel.run("_ = notebook_launcher(train, (250,), num_processes=8, "
                           "start_method='fork')", timeout=240)
    finally:
        kernel.shutdown()
    assert eight.error is None, eight.traceback_text
    rows = _Rows()
    rows.feed(eight.displays[-1]["data"]["text/html"])  # the dashboard as it ended
    assert sorted(rows.rows) == list(range(8)) and rows.rows[7]["steps"].startswith("train 250")
    assert len(eight.widget_states) > 5, "the live view sent next to nothing: not measured"
    assert eight.comm_rate() <= MAX_UPDATES_PER_S, (eight.comm_rate(), eight.wall)
    assert out.error is None, out.traceback_text
    assert out.displays == [], "a widget or other rich output was displayed"
    lines = out.stdout.splitlines()
    for rank in (0, 1):
        assert f"[rank {rank}] rank {rank} finished" in lines
        final = [line for line in lines if line.startswith(f"[rank {rank}] train 40/40")]
        assert final and final[-1].endswith(f"loss {1 / 40 + rank:.4g} done")
    assert lines[-1].startswith("Done in") and "\r" not in out.stdout
    assert "HBox" not in out.stdout and "VBox" not in out.stdout


@pytest.mark.timeout(300)
def test_a_timeout_keeps_its_stack_dumps_out_of_the_saved_text(run_notebook) -> None:
    """On a timeout each rank's stack goes to its log; the cell has the account of where each
    rank was (in the TimeoutError), and no raw dump; the dashboard's text version (what a saved
    notebook shows of it) has no stack lines."""
    notebook = run_notebook(
        [
            "import time\n"
            "from nbtrain import notebook_launcher\n"
            "def sleepy():\n"
            "    print('about to sleep')\n"
            "    time.sleep(600)",
            "try:\n"
            "    notebook_launcher(sleepy, num_processes=2, start_method='fork', timeout=3)\n"
            "except TimeoutError as exc:\n"
            "    print('raised TimeoutError')\n"
            "    print(exc)",
        ]
    )
    assert any("raised TimeoutError" in o.get("text", "") for o in notebook.cells[1].outputs)
    cell = notebook.cells[1]
    printed = "".join(o.get("text", "") for o in cell.outputs if o["output_type"] == "stream")
    assert "[rank 0] about to sleep" in printed and "[rank 1] about to sleep" in printed
    # The account: a line per rank (two ranks; at width, ranks at one line share it)
    assert "rank 0 was in Cell In[" in printed and "rank 1 was in Cell In[" in printed, printed
    assert "in sleepy" in printed, printed
    assert "Current thread" not in printed and "File " not in printed, printed  # no raw dump
    assert "rank-N.log" in printed  # where the full stacks are
    saved = widget_output(cell)["text/plain"]
    assert "File " not in saved and "in sleepy" not in saved, saved
    assert saved.splitlines()[-1].startswith("Timed out after 3s")


@pytest.mark.timeout(300)
def test_after_an_interrupt_every_row_says_stopped_at_its_step(tmp_path) -> None:
    """The stop button: the dashboard that replaces the live one says 'stopped' (orange) on
    every row, at the step the rank had reached, with no ETA; no widget is left to look up."""
    marker = tmp_path / "under-way"
    kernel = Kernel(tmp_path)
    try:
        msg_id = kernel.start(TRAIN.replace("time.sleep(0.01)", "time.sleep(0.02)\n"
                                            f"        if i == 20: open({str(marker)!r}, 'w')")
                              + "notebook_launcher(train, (5000,), num_processes=2, "
                                "start_method='fork')")
        began = time.monotonic()
        deadline = began + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), "the ranks never reached step 20"
        time.sleep(0.5)
        kernel.manager.interrupt_kernel()
        out = kernel.collect(msg_id, timeout=120)
        wall = time.monotonic() - began
    finally:
        kernel.shutdown()
    # 2 ranks moving every 20 ms: at most MAX_UPDATES_PER_S widget messages a second
    assert len(out.widget_states) > 5, "the live view sent next to nothing: not measured"
    assert out.comm_rate(wall) <= MAX_UPDATES_PER_S, (out.comm_rate(wall), wall)
    assert out.error is not None and out.error["ename"] == "KeyboardInterrupt"
    final = out.displays[-1]["data"]
    assert set(final) == {"text/html", "text/plain"}, final.keys()
    parser = _Rows()
    parser.feed(final["text/html"])
    assert sorted(parser.rows) == [0, 1]
    for row in parser.rows.values():
        assert (row["status_name"], row["status"], row["bar_style"]) == (
            "stopped", "stopped", "warning"
        )
        assert int(row["value"]) >= 20 and row["max"] == "5000"
        assert "ETA" not in row["steps"] and row["steps"].startswith("train ")
    assert final["text/plain"].splitlines()[-1].startswith("Interrupted")
    assert all(line.endswith(" stopped") for line in final["text/plain"].splitlines()[:2])
