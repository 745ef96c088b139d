"""A wide run (32 real fork ranks, tiny work) in a real Jupyter kernel, read from the saved
notebook: the compact view, grouped output and the failure of one rank among many."""

from __future__ import annotations

import base64
import re

import pytest
from test_widgets_kernel import Dashboard

WIDE = """
import os, pathlib, tempfile, time
import nbtrain
from nbtrain import notebook_launcher, progress, log

N = 32
folder = tempfile.mkdtemp()

def work(folder):
    rank = int(os.environ["RANK"])
    for i in progress(range(30), desc="train"):
        log({"loss": 1.0 / (i + 1) + rank / 100})
        time.sleep(0.01)
    pathlib.Path(folder, str(rank)).touch()
    while len(os.listdir(folder)) < N:  # every rank prints the line at about the same time
        time.sleep(0.02)
    print("epoch 1 done")
    print(f"rank {rank} says hello")
    if rank == N - 1:
        time.sleep(1.0)
        raise ValueError("boom on the last rank")
    time.sleep(120)
"""

LAUNCH = """
try:
    notebook_launcher(work, (folder,), num_processes=N, start_method="fork")
except nbtrain.WorkerError as error:
    print("ERROR", str(error).splitlines()[0])
"""


@pytest.mark.timeout(400)
def test_32_ranks_show_groups_one_failed_row_and_each_line_once(run_notebook) -> None:
    notebook = run_notebook([WIDE, LAUNCH], timeout=360)
    cell = notebook.cells[1]
    printed = "".join(o.get("text", "") for o in cell.outputs if o["output_type"] == "stream")
    assert "ERROR rank 31 failed with ValueError: boom on the last rank" in printed
    # the same line of 32 ranks once, with its ranks; each rank's own line with its own prefix
    assert printed.count("epoch 1 done") == 1, printed
    assert "[ranks 0-31] epoch 1 done" in printed
    assert "[rank 7] rank 7 says hello" in printed
    dashboard = Dashboard(notebook)
    markup = dashboard.markup
    assert markup.count("nbtrain-group") == 4  # 32 ranks: 4 rows of 8, not 32 rows
    assert re.search(r'data-ranks="ranks 0-7"', markup)
    rows = dashboard.rows()  # the ranks on rows of their own: the failed one alone
    assert list(rows) == [31] and rows[31]["status_name"] == "failed"
    assert rows[31]["status"].startswith("failed: ValueError: boom on the last rank")
    assert "stopped" in markup  # the others were stopped with it, counted in their groups
    (chart,) = [base64.b64decode(data).decode() for data in
                re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', markup)]
    assert 'class="nbtrain-band"' in chart and chart.count("<polyline") == 1  # the mean
    plain = next(o["data"]["text/plain"] for o in cell.outputs
                 if "nbtrain-static" in o.get("data", {}).get("text/html", ""))
    assert plain.splitlines()[0].startswith("[ranks 0-7]")
