"""A background run across a browser reload, in JupyterLab and Notebook 7 (Chromium, Playwright).

A notebook starts ``notebook_launcher(..., block=False)``; its live dashboard and output pane
appear under the launching cell while the kernel is idle. The notebook is saved and the page
reloaded mid-run: the launching cell's saved dashboard is live again (its bars move). A new
cell ``nbtrain.runs()[-1]`` shows the run again: the dashboard keeps moving (bars
read from the DOM several times), the output pane has the ranks' lines so far, and the run ends
"Done" (the static dashboard replaces the live one, the lines become static text), in the new
cell and in the reloaded launching cell alike.

Then a BLOCKING launch, saved once its view appeared, and the page reloaded mid-run: the
saved dashboard is live again while the kernel is busy (the launch's loop answers the page's
widget-state request: display/commpump.py), with the ranks' newest lines copied into it, and at
the end it holds the final dashboard and the last lines (display/reloaded.py); what a person
sees is recorded (the texts and screenshots under tests/artifacts/long_runs_*.png) and checked
against what the guide (notebooks/guides/long-runs.md) says survives.
"""

from __future__ import annotations

import time

import pytest
from labutil import ARTIFACTS, READY_JS, Server, chromium, open_notebook
from test_dashboard_browser import JUPYTER_BROWSER_MARKS

pytestmark = JUPYTER_BROWSER_MARKS

SETUP = """
import os, time
import nbtrain
from nbtrain import notebook_launcher, progress, log

def train(steps, delay):
    rank = int(os.environ["RANK"])
    for i in progress(range(steps), desc="train"):
        time.sleep(delay)
        log({"loss": 1.0 / (i + 1) + 0.1 * rank})
        if i % 20 == 0:
            print(f"rank {rank} at step {i}", flush=True)
    return rank
"""

BACKGROUND = (
    'run = notebook_launcher(train, (400, 0.05), num_processes=2, start_method="fork", '
    'block=False)'
)
AGAIN = "nbtrain.runs()[-1]"
BLOCKING = 'notebook_launcher(train, (300, 0.05), num_processes=2, start_method="fork")'

BARS_JS = """(root) => Array.from(document.querySelectorAll(
    root + ' .nbtrain-dashboard .nbtrain-bar > div')).map(bar => bar.style.width)"""
CELL_TEXT_JS = """(index) => {
    const cells = document.querySelectorAll('.jp-Notebook .jp-Cell');
    return cells[index] ? cells[index].querySelector('.jp-Cell-outputWrapper').innerText : '';
}"""
RUN_CELL_JS = """(index) => {
    const widget = window.jupyterapp.shell.currentWidget;
    widget.content.activeCellIndex = index;
    window.jupyterapp.commands.execute('notebook:run-cell');
}"""



def _shot(page, frontend: str, moment: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"long_runs_{frontend}_{moment}.png"))


def _cell(index: int) -> str:
    return f".jp-Notebook .jp-Cell:nth-child({index + 1})"


@pytest.mark.timeout(420)
def test_a_background_run_survives_a_reload_and_ends_done(server: Server) -> None:
    frontend = server.app
    with chromium() as browser:
        page = open_notebook(browser, server, "long.ipynb", [SETUP, BACKGROUND, AGAIN])
        for index in (0, 1):
            page.evaluate(RUN_CELL_JS, index)
            page.wait_for_function(READY_JS, arg="long.ipynb", timeout=120_000)
        # the launching cell shows the live view; the kernel is idle meanwhile
        page.wait_for_function(
            "(root) => Array.from(document.querySelectorAll(root + "
            "' .nbtrain-dashboard .nbtrain-bar > div')).some(b => parseFloat(b.style.width) > 5)",
            arg=_cell(1), timeout=120_000,
        )
        page.wait_for_function(READY_JS, arg="long.ipynb", timeout=10_000)
        _shot(page, frontend, "before_reload")

        # saved with the live view in it, then reloaded: the kernel and the run go on
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        time.sleep(1.0)
        page.reload()
        page.wait_for_function(READY_JS, arg="long.ipynb", timeout=120_000)
        page.wait_for_selector(f"{_cell(1)} .nbtrain-dashboard .nbtrain-bar > div",
                               timeout=60_000)
        saved_cell = []
        for _ in range(4):  # the launching cell's saved dashboard is live again
            saved_cell.append(tuple(page.evaluate(BARS_JS, _cell(1))))
            time.sleep(0.5)
        page.evaluate(RUN_CELL_JS, 2)
        page.wait_for_selector(f"{_cell(2)} .nbtrain-dashboard .nbtrain-bar > div",
                               timeout=60_000)
        widths = []
        for sample in range(8):  # the reopened dashboard moves on
            widths.append(tuple(page.evaluate(BARS_JS, _cell(2))))
            if sample == 1:
                _shot(page, frontend, "shown_again")
            time.sleep(0.5)
        pane = page.evaluate(
            "(root) => (document.querySelector(root + ' .nbtrain-run-output') || {})"
            ".innerText || ''", _cell(2),
        )
        page.wait_for_selector(f"{_cell(2)} .nbtrain-static", timeout=120_000)
        # the launching cell, rendered from the saved notebook: the final view reaches it
        # by its widgets' state (update_display's display id was never saved)
        page.wait_for_selector(f"{_cell(1)} .nbtrain-static", timeout=30_000)
        page.wait_for_function(
            "(root) => !document.querySelector(root + ' .nbtrain-run-stop')", arg=_cell(1),
            timeout=30_000,
        )
        time.sleep(0.5)
        final = page.evaluate(CELL_TEXT_JS, 2)
        launching_at_end = page.evaluate(CELL_TEXT_JS, 1)
        bars_at_end = page.evaluate(BARS_JS, _cell(1))
        _shot(page, frontend, "done")
        page.locator(_cell(1)).scroll_into_view_if_needed()
        _shot(page, frontend, "launching_cell_done")

    assert len(set(saved_cell)) >= 3, saved_cell
    (ARTIFACTS / f"long_runs_{frontend}_launching_cell_at_end.txt").write_text(launching_at_end)
    moving = {w for w in widths if w and all(float(x.rstrip("%")) < 100 for x in w)}
    assert len(moving) >= 3, widths  # several distinct live widths after the reload
    assert "[rank 0] rank 0 at step 0" in pane and "[rank 1] rank 1 at step 0" in pane, pane
    assert "Done in" in final, final
    assert "[rank 1] rank 1 at step 380" in final, final  # the lines, kept as static text
    # the launching cell after the reload ends the same: the final dashboard and every line
    assert "Done in" in launching_at_end, launching_at_end
    assert "[rank 1] rank 1 at step 380" in launching_at_end, launching_at_end
    assert not bars_at_end, bars_at_end  # the live bars are gone: the static rows replace them


@pytest.mark.timeout(420)
def test_what_a_reload_during_a_blocking_launch_shows(server: Server) -> None:
    frontend = server.app
    with chromium() as browser:
        page = open_notebook(browser, server, "blocking.ipynb", [SETUP, BLOCKING, AGAIN])
        page.evaluate(RUN_CELL_JS, 0)
        page.wait_for_function(READY_JS, arg="blocking.ipynb", timeout=120_000)
        page.evaluate(RUN_CELL_JS, 1)
        page.wait_for_function(
            "(root) => Array.from(document.querySelectorAll(root + "
            "' .nbtrain-dashboard .nbtrain-bar > div')).some(b => parseFloat(b.style.width) > 5)",
            arg=_cell(1), timeout=120_000,
        )
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        time.sleep(1.0)
        page.reload()
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
        # the busy kernel's launch loop answers the page's widget-state request: the
        # saved dashboard is drawn live again (not "Loading widget...") and moves on
        page.wait_for_selector(f"{_cell(1)} .nbtrain-dashboard .nbtrain-bar > div",
                               timeout=30_000)
        during = page.evaluate(CELL_TEXT_JS, 1)
        bars_during = []
        for _ in range(4):
            bars_during.append(tuple(page.evaluate(BARS_JS, _cell(1))))
            time.sleep(0.5)
        _shot(page, frontend, "blocking_reloaded")
        page.wait_for_function(READY_JS, arg="blocking.ipynb", timeout=180_000)
        time.sleep(1.0)
        after = page.evaluate(CELL_TEXT_JS, 1)
        bars_after = page.evaluate(BARS_JS, _cell(1))
        _shot(page, frontend, "blocking_ended")
        page.evaluate(RUN_CELL_JS, 2)  # nbtrain.runs()[-1]: the final view and the lines
        page.wait_for_selector(f"{_cell(2)} .nbtrain-static", timeout=60_000)
        page.wait_for_selector(f"{_cell(2)} .nbtrain-run-output", timeout=10_000)
        shown = page.evaluate(CELL_TEXT_JS, 2)
        _shot(page, frontend, "blocking_shown_again")
    record = (f"{frontend}: during={during!r} bars={bars_during} | after={after!r} "
              f"bars={bars_after}")
    (ARTIFACTS / f"long_runs_{frontend}_blocking.txt").write_text(record)
    # What a reload during a blocking launch shows (the guide says so): the saved lines and
    # the live dashboard moving on (the launch's loop answers the page's widget-state request),
    # with the newest lines copied into it (the cell's stream output goes to the page that ran
    # it: display/reloaded.py); at the end the dashboard's widget holds the final dashboard and
    # the lines up to the last. A new cell shows them too: nbtrain.runs()[-1].
    assert "[rank 0] rank 0 at step 0" in during and "Loading widget" not in during, record
    assert len({bars for bars in bars_during if bars}) >= 2, record  # live: the bars move
    assert "Done in" in after and "[rank 1] rank 1 at step 280" in after, record
    assert "Done in" in shown and "[rank 1] rank 1 at step 280" in shown, shown
