"""The dashboard's "where?" button in JupyterLab (Chromium via Playwright), clicked mid-run.

A launch whose rank 0 waits in an all_reduce that rank 1 joins only after a while: a person
clicks "where?" in the live dashboard while the cell is busy; the cell shows where each rank is,
naming rank 1 as the one rank 0 waits for, before the launch ends. Screenshot:
tests/artifacts/where_lab.png. Reuses test_dashboard_browser.py's server.
"""

from __future__ import annotations

import time
from pathlib import Path

import nbformat
import pytest
from test_dashboard_browser import (  # noqa: F401 (fixtures)
    APPS,
    READY_JS,
    _browser_present,
    _scroll_to,
    server,
)
from test_live_view_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, MISSING, _browser_required

pytestmark = [
    pytest.mark.skipif(
        MISSING is not None and not _browser_required(), reason=str(MISSING)
    ),
    pytest.mark.slow,
]

LATE_PEER = """
import time, torch
import torch.distributed as dist
from nbtrain import notebook_launcher

def late_peer():
    dist.init_process_group("gloo")
    print("ready", flush=True)
    if dist.get_rank() == 1:
        time.sleep(20)  # rank 0 waits in the all_reduce meanwhile
    dist.all_reduce(torch.ones(1))
    dist.destroy_process_group()
    return "joined"

print(notebook_launcher(late_peer, num_processes=2, start_method="fork", hang_after=None))
"""


# The cell's output (the page's text holds the cell's source too, "joined" included).
OUTPUT = "Array.from(document.querySelectorAll('.jp-OutputArea')).map(o => o.innerText).join()"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("server", ["lab"], indirect=True)
def test_the_where_button_shows_each_rank_while_the_cell_runs(server) -> None:  # noqa: F811
    from playwright.sync_api import sync_playwright

    frontend, url, token, root = server
    name = "where.ipynb"
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(LATE_PEER)])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    nbformat.write(notebook, Path(root) / name)
    ARTIFACTS.mkdir(exist_ok=True)
    _, route = APPS[frontend]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{url}/{route}/{name}?token={token}")
            page.wait_for_function(READY_JS, arg=name, timeout=120_000)
            page.evaluate("() => { window.jupyterapp.commands.execute("
                          "'notebook:run-all-cells'); }")
            page.wait_for_selector(".nbtrain-where", timeout=120_000)
            page.wait_for_function(
                "() => (document.body.innerText.match(/\\] ready/g) || []).length === 2",
                timeout=120_000,
            )
            time.sleep(1.0)  # rank 0 is inside the all_reduce by now
            page.click(".nbtrain-where")
            page.wait_for_function(
                "() => document.body.innerText.includes('rank 1 has not entered it')",
                timeout=30_000,
            )
            busy = page.evaluate(f"() => !{OUTPUT}.includes('joined')")
            _scroll_to(page, ".nbtrain-dashboard")
            page.screenshot(path=str(ARTIFACTS / f"where_{frontend}.png"), full_page=False)
            text = page.evaluate(f"() => {OUTPUT}")
            page.wait_for_function(f"() => {OUTPUT}.includes('joined')", timeout=120_000)
        finally:
            browser.close()
    assert busy, "the picture came only once the launch had ended"
    assert "rank 0 waits in all_reduce; rank 1 has not entered it" in text
    assert "in late_peer" in text
