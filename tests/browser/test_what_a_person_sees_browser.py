"""What a person sees in JupyterLab (Chromium via Playwright): labels, charts, output order, and
the dashboard of an untrusted notebook.

One notebook: a live dashboard and a finished one of 12 ranks with long labels (``cuda:N``,
FSDP, ranks >= 10), then a real launch whose ranks log 8 points each while interleaving prints
and displays. Checked on the DOM, at 1400 and 900 px:
- each rank's label stays on one line inside its row, and no row draws over the next one
  (vertical overlap, which side-by-side checks miss);
- the final chart of the launch holds every logged point (8 per rank);
- rank 0's prints and displays are in the cell in the order it made them;
- an untrusted copy of the saved notebook (every freshly cloned one: JupyterLab sanitises its
  HTML) still shows the chart as an image, and its labels still do not overlap.
Screenshots go to tests/artifacts/person_<moment>.png; look at them.
"""

from __future__ import annotations

import itertools
import time

import nbformat
import pytest
from labutil import (
    ARTIFACTS,
    READY_JS,
    RUN_ALL_JS,
    Server,
    chromium,
    open_notebook,
    save_and_shut_down,
)
from test_live_view_browser import MISSING, _browser_required

pytestmark = [
    pytest.mark.skipif(MISSING is not None and not _browser_required(), reason=str(MISSING)),
    pytest.mark.slow,
]

LABELS = """
from nbtrain.display.widgets import WidgetView
from nbtrain.display.runstate import RunState
from nbtrain.shared.events import Finished, Log, Progress, Started, Strategy
from nbtrain.shared.options import OutputMode

def dashboard(title):
    state = RunState(list(range(12)), title=title)
    for rank in range(12):
        state.apply(Started(rank, 100 + rank, f"cuda:{rank}", "host", rank))
        if rank % 3 == 0:
            state.apply(Strategy(rank, "fsdp2"))
        state.apply(Progress(rank, 5, 10, "train"))
        for step in range(3):
            state.apply(Log(rank, {"loss": 1.0 / (step + 1 + rank)}, step=step))
    view = WidgetView(output=OutputMode.ALL, world_size=12)
    view.draw(state, final=True)
    return state, view

live = dashboard("live, long labels")
"""

FINISHED = """
state, view = dashboard("finished, long labels")
for rank in range(12):
    state.apply(Progress(rank, 10, 10, "train"))
    state.apply(Finished(rank, None))
state.finish("Done")
view.close(state)
"""

LAUNCH = """
import os, sys, time
from IPython.display import HTML, display
from nbtrain import log, notebook_launcher, progress

def train():
    rank = int(os.environ["RANK"])
    for i in progress(range(80), desc="train"):
        time.sleep(0.005)  # 8 logs within about three updates: each one must reach the chart
        if i % 10 == 0:
            log({"loss": 1.0 / (i + 1) + rank})
        if i % 20 == 0:
            print(f"before {i // 20}")
            display(HTML(f"<i>shown {rank} {i // 20}</i>"))
            print(f"after {i // 20}")

notebook_launcher(train, num_processes=2, start_method="fork")
"""

# Every row of every dashboard: the row's and its label's rectangles, and whether the label's
# text is taller than one line.
ROWS_JS = """(selector) => Array.from(
        window.jupyterapp.shell.currentWidget.node.querySelectorAll(selector))
    .filter(row => row.querySelector('.nbtrain-bar'))
    .map(row => {
        const label = row.firstElementChild;
        const text = label.querySelector('span[title]') || label;
        const r = row.getBoundingClientRect(), l = text.getBoundingClientRect();
        const range = document.createRange();
        range.selectNodeContents(text);
        const tops = Array.from(range.getClientRects()).map(box => box.top).sort((a, b) => a - b);
        const lines = tops.filter((top, i) => i === 0 || top - tops[i - 1] > 5).length;
        return {top: r.top, bottom: r.bottom, labelTop: l.top, labelBottom: l.bottom,
                wraps: lines > 1, text: label.innerText, title: text.title || ''};
    })"""

# The polylines of each chart image of the last finished dashboard: rank -> number of points.
CHART_POINTS_JS = """() => {
    const all = document.querySelectorAll('.nbtrain-static');
    const images = Array.from(all[all.length - 1].querySelectorAll('img.nbtrain-chart'));
    return images.map(img => {
        const svg = atob(img.src.split(',')[1]);
        const found = {};
        for (const m of svg.matchAll(/<polyline data-rank="(\\d+)" points="([^"]*)"/g))
            found[m[1]] = m[2].trim().split(/\\s+/).length;
        return {points: found, width: img.naturalWidth, alt: img.alt};
    });
}"""


def _row_problems(rows: list[dict]) -> list[str]:
    found = []
    for row in rows:
        if row["labelTop"] < row["top"] - 1 or row["labelBottom"] > row["bottom"] + 1:
            found.append(f"label {row['text']!r} leaves its row {row}")
        if row["wraps"]:
            found.append(f"label {row['text']!r} wraps {row}")
    for upper, lower in itertools.pairwise(rows):
        if upper["bottom"] > lower["top"] + 1 and lower["top"] >= upper["top"]:
            found.append(f"{upper['text']!r} draws over {lower['text']!r}")
    return found


def _shot(page, moment: str, selector: str | None = None, index: int = -1) -> None:
    if selector:
        page.evaluate(
            "([s, i]) => { const all = window.jupyterapp.shell.currentWidget.node"
            ".querySelectorAll(s); const el = all[i < 0 ? "
            "all.length + i : i]; if (el) el.scrollIntoView({block: 'start'}); }",
            [selector, index],
        )
        time.sleep(0.3)
    page.screenshot(path=str(ARTIFACTS / f"person_{moment}.png"))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("jupyter", ["lab"], indirect=True)
def test_labels_charts_order_and_an_untrusted_reopen(lab: Server) -> None:
    name = "person.ipynb"
    problems: dict[str, list[str]] = {}

    with chromium() as browser:
        page = open_notebook(browser, lab, name, [LABELS, FINISHED, LAUNCH])
        page.evaluate(RUN_ALL_JS)
        page.wait_for_function(
            "() => document.querySelectorAll('.nbtrain-static').length === 2", timeout=180_000
        )
        page.wait_for_function(READY_JS, arg=name, timeout=120_000)
        time.sleep(1.0)
        for width in (1400, 900):
            page.set_viewport_size({"width": width, "height": 1000})
            time.sleep(0.7)
            live = page.evaluate(ROWS_JS, ".nbtrain-dashboard .nbtrain-row")
            ended = page.evaluate(ROWS_JS, ".nbtrain-static .nbtrain-row")
            assert len(live) == 12 and len(ended) == 12 + 2, (len(live), len(ended))
            problems[f"live {width}"] = _row_problems(live)
            problems[f"ended {width}"] = _row_problems(ended[:12])
            _shot(page, f"live_{width}", ".nbtrain-dashboard", 0)
            _shot(page, f"ended_{width}", ".nbtrain-static", 0)
            _shot(page, f"launch_{width}", ".nbtrain-static", 1)
        page.set_viewport_size({"width": 1400, "height": 1000})
        charts = page.evaluate(CHART_POINTS_JS)
        cell = page.evaluate(
            "() => document.querySelectorAll('.jp-Cell')[2]"
            ".querySelector('.jp-Cell-outputWrapper').innerText"
        )
        save_and_shut_down(page, lab)  # no kernel for the copy

        # A copy nobody signed: JupyterLab opens it untrusted and sanitises its HTML.
        saved = nbformat.read(lab.root / name, as_version=4)
        saved.metadata.pop("signature", None)
        saved.cells[0].source += "\n# a copy"  # its digest is not in the server's trust db
        nbformat.write(saved, lab.root / "untrusted.ipynb")
        fresh = browser.new_page(viewport={"width": 1400, "height": 1000})
        fresh.goto(f"{lab.url}/{lab.route}/untrusted.ipynb?token={lab.token}")
        fresh.wait_for_selector(".nbtrain-static", timeout=120_000)
        time.sleep(1.5)
        untrusted = fresh.evaluate(
            "() => ({trusted: window.jupyterapp.shell.currentWidget.content.model"
            ".cells.get(2).trusted,"
            " images: Array.from(window.jupyterapp.shell.currentWidget.node"
            ".querySelectorAll('.nbtrain-static img'))"
            ".map(img => ({width: img.naturalWidth, shown: img.getBoundingClientRect().width}))"
            ", svg: document.querySelectorAll('.nbtrain-static svg').length})"
        )
        untrusted_rows = fresh.evaluate(ROWS_JS, ".nbtrain-static .nbtrain-row")
        problems["untrusted"] = _row_problems(untrusted_rows[:12])
        _shot(fresh, "untrusted_labels", ".nbtrain-static", 0)
        _shot(fresh, "untrusted_launch", ".nbtrain-static", 1)

    assert {moment: found for moment, found in problems.items() if found} == {}
    # Every logged point is drawn: 8 logs per rank, none coalesced away.
    launch_chart = charts[0]
    assert launch_chart["points"] == {"0": 8, "1": 8}, charts
    assert launch_chart["width"] > 0 and "8 points" in launch_chart["alt"]
    # Rank 0's prints and displays in the order it made them.
    made = [f"{what} {i}" for i in range(4) for what in ("before", "shown 0", "after")]
    positions = [cell.find(f"[rank 0] {text}" if "shown" not in text else text) for text in made]
    assert -1 not in positions and positions == sorted(positions), (made, positions, cell)
    # Untrusted: the charts are still images that the browser drew; no inline SVG was needed.
    assert untrusted["trusted"] is False, untrusted
    assert len(untrusted["images"]) >= 2, untrusted  # the finished dashboard's and the launch's
    assert all(img["width"] > 0 and img["shown"] > 0 for img in untrusted["images"]), untrusted
    assert len(untrusted_rows) == 14
