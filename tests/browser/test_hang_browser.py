"""A hang at the Accelerator's barrier, as a person sees it in JupyterLab (Chromium via
Playwright): rank 1 is late to ``acc.wait_for_everyone()``; once hang detection fires, its live
row turns orange and says the others wait for it (with its cell line), rank 0's says what it
waits in and for whom; the cell's note names rank 1. At 1400 and 900 px the status is whole.
Screenshots go to tests/artifacts/hang_<width>.png; look at them.
"""

from __future__ import annotations

import time

import pytest
from labutil import ARTIFACTS, RUN_ALL_JS, Server, chromium, open_notebook
from test_live_view_browser import MISSING, _browser_required

pytestmark = [
    pytest.mark.skipif(MISSING is not None and not _browser_required(), reason=str(MISSING)),
    pytest.mark.slow,
]

LATE_BARRIER = """
import time
from nbtrain import Accelerator, notebook_launcher

def late_barrier():
    acc = Accelerator()
    if acc.process_index == 1:
        time.sleep(14)
    acc.wait_for_everyone()
    return "joined"

notebook_launcher(late_barrier, num_processes=2, start_method="fork", hang_after=3)
"""

SLEEP = LATE_BARRIER.strip("\n").splitlines().index("        time.sleep(14)") + 1  # its line

# Each live row's status text, its bar's classes and the status's colour.
STATUS_JS = """() => Array.from(
        window.jupyterapp.shell.currentWidget.node.querySelectorAll(
            '.nbtrain-dashboard .nbtrain-row'))
    .map(row => {
        const status = row.querySelector('.nbtrain-status');
        const span = status && status.querySelector('span[title]');
        const shown = span ? span.getBoundingClientRect() : null;
        const box = status ? status.getBoundingClientRect() : null;
        return {status: status ? status.innerText : '',
                bar: 'progress-bar-' + row.querySelector('.nbtrain-bar').dataset.style,
                color: span ? getComputedStyle(span).color : '',
                cut: span ? span.scrollWidth > span.clientWidth + 1 : false,
                inside: shown && box ? shown.right <= box.right + 1 : false};
    })"""


@pytest.mark.timeout(600)
@pytest.mark.parametrize("jupyter", ["lab"], indirect=True)
def test_the_rank_others_wait_for_is_marked_in_its_row(server: Server) -> None:
    seen: dict[int, list[dict]] = {}
    note = ""
    with chromium() as browser:
        page = open_notebook(browser, server, "hang.ipynb", [LATE_BARRIER], height=900)
        page.evaluate(RUN_ALL_JS)
        page.wait_for_function(
            "() => Array.from(document.querySelectorAll('.nbtrain-status'))"
            ".some(s => s.innerText.includes('the others wait for it'))",
            timeout=120_000,
        )
        time.sleep(0.5)
        for width in (1400, 900):
            page.set_viewport_size({"width": width, "height": 900})
            time.sleep(0.7)
            seen[width] = page.evaluate(STATUS_JS)
            page.screenshot(path=str(ARTIFACTS / f"hang_{width}.png"))
        note = page.evaluate(
            "() => document.querySelector('.jp-Cell-outputWrapper').innerText"
        )
        page.wait_for_selector(".nbtrain-static", timeout=120_000)

    for width, rows in seen.items():
        assert len(rows) == 2, (width, rows)
        waiter, late = rows
        assert late["status"].startswith(f"the others wait for it (Cell In[1], line {SLEEP})"), rows
        assert "progress-bar-warning" in late["bar"], rows
        assert late["color"] == "rgb(239, 108, 0)", rows  # #ef6c00: it stands out
        assert waiter["status"].startswith("waiting in wait_for_everyone() for rank 1"), rows
        assert "progress-bar-warning" not in waiter["bar"], rows
        assert all(row["inside"] for row in rows), rows
        if width == 1400:
            assert not late["cut"], rows  # whole at 1400 px
    assert "rank 0 waits in wait_for_everyone; rank 1 has not entered it" in note, note
