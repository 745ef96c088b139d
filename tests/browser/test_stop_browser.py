"""The stop button under on_interrupt="checkpoint", in JupyterLab (Chromium via Playwright).

A two-rank Accelerator run trains with a live dashboard; the test clicks JupyterLab's own
interrupt button. Checked on the DOM: the header says the run is stopping, the rows "saving
checkpoint…"; then the dashboard freezes with every row "stopped (saved)" (orange) at the same
step, the summary "Stopped at step N (saved): checkpoint in …", and the cell's error says where
the checkpoint is and that resume=True continues. Every text fits its column.
Screenshots: tests/artifacts/stop_<moment>.png.
"""

from __future__ import annotations

import re
import time

import pytest
from labutil import ARTIFACTS, RUN_ALL_JS, Server, chromium, open_notebook
from test_dashboard_browser import LIVE_ROWS, ROWS_JS, STATIC_ROWS
from test_live_view_browser import MISSING, _browser_required

pytestmark = [
    pytest.mark.skipif(MISSING is not None and not _browser_required(), reason=str(MISSING)),
    pytest.mark.slow,
    pytest.mark.parametrize("jupyter", ["lab"], indirect=True),  # conftest.py's server
]

TRAIN = """
import time, torch
from nbtrain import Accelerator, notebook_launcher

class SlowToSave:  # a registered object whose state takes a while: the save can be watched
    def state_dict(self):
        time.sleep(3)
        return {}
    def load_state_dict(self, state):
        pass

def train():
    accelerator = Accelerator()
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(4096, 8), torch.randint(0, 2, (4096,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.register_for_checkpointing(SlowToSave())
    for x, y in accelerator.progress(loader, desc="batch"):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(0.02)

notebook_launcher(train, num_processes=2, start_method="fork", on_interrupt="checkpoint",
                  project_dir="stop-run")
"""

STOP_BUTTON = '[data-command="notebook:interrupt-kernel"]'



@pytest.mark.timeout(300)
def test_the_stop_button_saves_then_every_row_says_where_it_stopped(lab: Server) -> None:

    with chromium() as browser:
        page = open_notebook(browser, lab, "stop.ipynb", [TRAIN])
        page.evaluate(RUN_ALL_JS)
        page.wait_for_function(  # training, with a step count shown
            "() => /batch \\d+\\/\\d+/.test((document.querySelector('.nbtrain-dashboard')"
            " || {}).innerText || '')",
            timeout=120_000,
        )
        time.sleep(1.0)
        page.locator(STOP_BUTTON).first.click()  # JupyterLab's own ■ button
        page.wait_for_function(
            "() => (((document.querySelector('.nbtrain-dashboard') || {}).innerText || '')"
            ".match(/saving checkpoint/g) || []).length === 2",  # both rows
            timeout=60_000,
        )
        saving = page.evaluate("() => document.querySelector('.nbtrain-dashboard').innerText")
        saving_rows = page.evaluate(ROWS_JS, LIVE_ROWS)
        page.screenshot(path=str(ARTIFACTS / "stop_saving.png"))
        page.wait_for_selector(".nbtrain-static", timeout=120_000)
        time.sleep(0.5)
        rows = page.evaluate(ROWS_JS, STATIC_ROWS)
        summary = page.evaluate(
            "() => document.querySelector('.nbtrain-static').innerText"
        )
        error = page.evaluate(
            "() => Array.from(document.querySelectorAll('.jp-RenderedText'))"
            ".map(e => e.innerText).join('\\n')"
        )
        page.screenshot(path=str(ARTIFACTS / "stop_stopped.png"))

    assert "stopping at the next optimizer step" in saving, saving
    assert [cols[-1]["text"] for cols in saving_rows] == ["saving checkpoint…"] * 2, saving_rows
    assert not any(col["clipped"] for cols in saving_rows for col in cols), saving_rows
    assert len(rows) == 2, rows
    assert [cols[-1]["text"] for cols in rows] == ["stopped (saved)"] * 2, rows
    assert not any(col["clipped"] for cols in rows for col in cols), rows
    assert all(cols[0]["status"] == "stopped" for cols in rows), rows
    where = {re.search(r"batch (\d+)/", cols[2]["text"]).group(1) for cols in rows}  # type: ignore[union-attr]
    assert len(where) == 1, f"both ranks stopped at one step: {rows}"
    assert f"Stopped at step {where.pop()} (saved): checkpoint in" in summary, summary
    assert "KeyboardInterrupt" in error and "stopped at step" in error, error[-2000:]
    assert "stop-run/checkpoints/checkpoint_0" in error and "resume=True" in error
    saved = lab.root / "stop-run" / "checkpoints" / "checkpoint_0"
    assert (saved / "nbtrain_checkpoint.json").is_file()
