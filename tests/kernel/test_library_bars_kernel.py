"""Library progress bars in ranks launched from a real Jupyter kernel leave no stuck line in the
cell (issue 43, point 10). ``huggingface_hub`` (installed with transformers) and ``datasets``
make their bars as subclasses of ``tqdm.auto.tqdm``, which in the kernel is tqdm's notebook bar:
a forked rank inherits that class, built a widget that could not work from it, and left lines
like ``[rank 0] Tokenizing:   0%|          | 0/50`` that never moved; a spawned rank wrote text
bars into the cell. Now both drive the rank's row of the live view, as plain tqdm does.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from jupyter_client.manager import AsyncKernelManager
from kernelutil import KERNEL_NAME
from nbclient import NotebookClient

pytestmark = pytest.mark.timeout(600)

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
TQDM_TEXT = re.compile(r"\d+%\||\d+/\d+ \[")  # what tqdm's own bars draw: '0%|', '5/5 ['

CELL = """
import datasets, huggingface_hub.utils  # loaded in the kernel: their bars are notebook bars here
from nbtrain import notebook_launcher

def work():
    from datasets import Dataset
    from huggingface_hub.utils import tqdm as hub_tqdm
    data = Dataset.from_dict({{"x": list(range(50))}})
    data = data.map(lambda row: {{"y": 2 * row["x"]}}, desc="Tokenizing")
    for _ in hub_tqdm(range(5), desc="hub bar"):
        pass
    return sum(data["y"])

notebook_launcher(work, num_processes=2, start_method="{method}", return_all=True)
"""


def run_cell(kernel_spec_manager, directory: Path, source: str) -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    manager = AsyncKernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=kernel_spec_manager)
    client = NotebookClient(notebook, km=manager, kernel_name=KERNEL_NAME, timeout=300,
                            store_widget_state=True, allow_errors=True)
    client.execute(cleanup_kc=True, cwd=str(directory))
    return notebook.cells[0]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_dataset_map_and_hub_bars_leave_no_stuck_line(kernel_spec_manager, tmp_path, method):
    pytest.importorskip("datasets")
    cell = run_cell(kernel_spec_manager, tmp_path, CELL.format(method=method))
    errors = [out for out in cell.outputs if out["output_type"] == "error"]
    assert not errors, errors
    result = [out for out in cell.outputs if out["output_type"] == "execute_result"]
    assert result[0]["data"]["text/plain"] == "[2450, 2450]"
    displays = [out for out in cell.outputs if out["output_type"] == "display_data"]
    # One display: nbtrain's own view (its static form once the launch ended); no widget and
    # no line from a rank's bar.
    assert not any(WIDGET_VIEW in out["data"] for out in displays), displays
    texts = [str(out["data"].get("text/plain", "")) for out in displays]
    streams = "".join(out["text"] for out in cell.outputs if out["output_type"] == "stream")
    assert not TQDM_TEXT.search(streams), streams
    view = [text for text in texts if "Done in" in text]
    assert len(view) == 1 and len(texts) == 1, texts
    # The bars went to the ranks' rows: the last one (the hub's) is what each row shows.
    for rank in (0, 1):
        assert re.search(rf"\[rank {rank}\] hub bar 5/5 .*done", view[0]), view[0]
