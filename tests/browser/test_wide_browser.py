"""A 64-rank run in JupyterLab (Chromium via Playwright), as a person sees it.

Live: 8 rows of groups (not 64 rows), the selector shows any one rank's own row while the cell
is busy. At the end, at 1400 and at 900 px: the static dashboard's rows keep inside their columns,
the failed rank stands out on its own red row with its error, the chart is a band. Screenshots
go to tests/artifacts/ (wide_lab_<moment>.png). Helpers: test_dashboard_browser.py;
the server: conftest.py.
"""

from __future__ import annotations

import time

import pytest
from labutil import ARTIFACTS, READY_JS, RUN_ALL_JS, Server, chromium, open_notebook
from test_dashboard_browser import JUPYTER_BROWSER_MARKS, ROWS_JS, _overlaps, _scroll_to

pytestmark = JUPYTER_BROWSER_MARKS

SETUP = """
import os, time
import nbtrain
from nbtrain import notebook_launcher, progress, log

def train(steps, fail_at):
    rank = int(os.environ["RANK"])
    for step in progress(range(steps), desc="train"):
        time.sleep(0.05)
        log({"loss": 1.0 / (step + 1) + rank / 1000})
        if rank == 63 and step == fail_at:
            raise ValueError("rank 63 saw a NaN loss at this step")
"""

LAUNCH = """
try:
    notebook_launcher(train, (400, 150), num_processes=64, start_method="fork")
except nbtrain.WorkerError as error:
    print("raised", type(error).__name__)
"""

GROUPS = ".nbtrain-dashboard .nbtrain-wide .nbtrain-group"
STATIC_ROWS = ".nbtrain-static .nbtrain-row"


def _shot(page, moment: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"wide_lab_{moment}.png"), full_page=False)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("jupyter", ["lab"], indirect=True)
def test_64_ranks_are_8_rows_and_the_failed_rank_stands_out(server: Server) -> None:
    name = "wide.ipynb"
    with chromium() as browser:
        page = open_notebook(browser, server, name, [SETUP, LAUNCH])
        page.evaluate(RUN_ALL_JS)
        page.wait_for_function(
            f"() => document.querySelectorAll('{GROUPS}').length === 8 && "
            "document.querySelector('.nbtrain-dashboard').innerText.includes('train ')",
            timeout=240_000,
        )
        live_groups = page.evaluate(f"() => document.querySelectorAll('{GROUPS}').length")
        page.select_option(".nbtrain-rank-selector select", label="rank 5")
        page.wait_for_selector(".nbtrain-selected [data-rank='5']", timeout=30_000)
        _scroll_to(page, ".nbtrain-dashboard")
        _shot(page, "live_1400")
        page.wait_for_selector(".nbtrain-static", timeout=300_000)
        page.wait_for_function(READY_JS, arg=name, timeout=120_000)
        ended = {}
        for width in (1400, 900):
            page.set_viewport_size({"width": width, "height": 1000})
            time.sleep(0.7)  # the layout settles
            ended[width] = {
                "rows": page.evaluate(ROWS_JS, STATIC_ROWS),
                "failed": page.evaluate(
                    "() => { const row = document.querySelector("
                    "'.nbtrain-static .nbtrain-row[data-status=\"failed\"]');"
                    " if (!row) return null;"
                    " const status = row.querySelector('.nbtrain-status span[title]');"
                    " return {rank: row.dataset.rank, text: status.innerText,"
                    " color: getComputedStyle(status).color}; }"
                ),
                "bands": page.evaluate(
                    "() => document.querySelectorAll('.nbtrain-static img.nbtrain-band-chart')"
                    ".length"
                ),
            }
            _scroll_to(page, ".nbtrain-static")
            _shot(page, f"ended_{width}")
        text = page.evaluate("() => document.body.innerText")

    assert live_groups == 8
    assert "raised WorkerError" in text
    assert text.count("[rank 63]") <= 3  # the root cause's own lines, not 64 tracebacks
    for width, seen in ended.items():
        rows = seen["rows"]
        groups = [cols for cols in rows if not cols[0]["status"]]  # group rows: no data-status
        assert len(groups) == 8, (width, len(rows))
        assert _overlaps(rows) == [], (width, _overlaps(rows)[:3])
        failed = seen["failed"]
        assert failed is not None and failed["rank"] == "63", (width, failed)
        assert failed["text"].startswith("failed: ValueError"), failed
        assert failed["color"] == "rgb(198, 40, 40)", failed  # the failed red (#c62828)
        assert seen["bands"] >= 1
