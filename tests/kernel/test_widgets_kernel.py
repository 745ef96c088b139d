"""The live dashboard inside a real Jupyter kernel (nbclient, widget state stored).

The notebook's saved widget state is what a frontend received over the comms: every model with
its final values. The text/plain of the widget output is the dashboard's plain-text version.
"""

from __future__ import annotations

import html
import re

import pytest
from kernelutil import Kernel

WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
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


def text(markup: str) -> str:
    """What the reader sees of an HTML widget's value."""
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


class Dashboard:
    """Reads the dashboard's rows out of the saved widget models."""

    def __init__(self, notebook) -> None:
        self.models = {
            model_id: model["state"]
            for model_id, model in notebook.metadata["widgets"][WIDGET_STATE]["state"].items()
        }
        self.names = {
            model_id: model["model_name"]
            for model_id, model in notebook.metadata["widgets"][WIDGET_STATE]["state"].items()
        }

    def child(self, reference: str) -> dict:
        return self.models[reference.removeprefix("IPY_MODEL_")]

    def rows(self) -> dict[int, dict[str, dict]]:
        """rank -> {"label", "bar", "steps", "metrics", "status"} states."""
        rows = {}
        for model_id, state in self.models.items():
            if self.names[model_id] != "HBoxModel" or len(state.get("children", [])) != 5:
                continue
            parts = dict(
                zip(
                    ["label", "bar", "steps", "metrics", "status"],
                    (self.child(c) for c in state["children"]),
                    strict=True,
                )
            )
            label = parts["label"]["value"]  # "<b>rank 2</b> · cpu"
            rank = int(label.split("rank ")[1].split("<")[0])
            rows[rank] = parts
        return rows

    def html_values(self) -> list[str]:
        return [s["value"] for i, s in self.models.items() if self.names[i] == "HTMLModel"]


def widget_output(cell) -> dict:
    outputs = [o for o in cell.outputs if WIDGET_VIEW in o.get("data", {})]
    assert len(outputs) == 1, f"expected one dashboard, got {cell.outputs}"
    return outputs[0]["data"]


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
        assert text(row["label"]["value"]) == f"rank {rank} · cpu"
        bar = row["bar"]
        assert (bar["value"], bar["max"], bar["bar_style"]) == (40, 40, "success")
        assert text(row["steps"]["value"]).startswith("train 40/40")
        assert text(row["metrics"]["value"]) == f"loss {1 / 40 + rank:.4g}"
        assert text(row["status"]["value"]) == "done"
    markup = "\n".join(dashboard.html_values())
    assert 'data-metric="loss"' in markup and markup.count("<polyline") == 3  # the live chart
    assert all(f"rank {rank} finished" in markup for rank in range(3))  # the output area
    assert "Done in" in markup  # the summary line
    data = widget_output(cell)
    assert data["text/plain"].splitlines()[0].startswith("[rank 0] train 40/40")
    assert "HBox" not in data["text/plain"] and "VBox" not in data["text/plain"]
    # A saved notebook keeps what the ranks printed (the end of it) in the text version.
    assert all(f"[rank {rank}] rank {rank} finished" in data["text/plain"] for rank in range(3))
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
    assert failed["bar"]["bar_style"] == "danger"
    assert failed["bar"]["value"] == 5  # where it stopped
    assert text(failed["status"]["value"]) == "failed: ValueError: boom on rank 1"
    for rank in (0, 2):
        assert rows[rank]["bar"]["bar_style"] != "danger"  # stopped by the launcher, not failed
        assert text(rows[rank]["status"]["value"]) == "stopped"
    summary = widget_output(notebook.cells[1])["text/plain"].splitlines()[-1]
    assert summary.startswith("Failed after") and "rank 1" in summary


@pytest.mark.timeout(300)
def test_one_process_shows_the_same_dashboard(run_notebook) -> None:
    notebook = run_notebook([TRAIN, "notebook_launcher(train, (30,), num_processes=1)"])
    rows = Dashboard(notebook).rows()
    assert list(rows) == [0]
    bar = rows[0]["bar"]
    assert (bar["value"], bar["max"], bar["bar_style"]) == (30, 30, "success")
    assert text(rows[0]["metrics"]["value"]) == f"loss {1 / 30:.4g}"


@pytest.mark.timeout(300)
def test_text_progress_in_a_kernel_prints_lines_and_no_widget(tmp_path) -> None:
    kernel = Kernel(tmp_path)
    try:
        out = kernel.run(TRAIN + "result = notebook_launcher(train, (40,), num_processes=2, "
                                 "start_method='fork', progress='text')", timeout=240)
    finally:
        kernel.shutdown()
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
    """On a timeout each rank's stack is dumped into the output area; the text version (what a
    saved notebook shows) keeps only what the ranks printed themselves."""
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
            "    print('raised TimeoutError')",
        ]
    )
    assert any("raised TimeoutError" in o.get("text", "") for o in notebook.cells[1].outputs)
    markup = text("\n".join(Dashboard(notebook).html_values()))
    assert "in sleepy" in markup  # the dumps are in the output area
    saved = widget_output(notebook.cells[1])["text/plain"]
    assert "[rank 0] about to sleep" in saved and "[rank 1] about to sleep" in saved
    assert "File " not in saved and "in sleepy" not in saved, saved
    assert "earlier output lines" not in saved  # the dumps are not counted as lines left out
    assert saved.splitlines()[-1].startswith("Timed out after 3s")
