"""Everything a rank shows reaches the notebook (real kernels through nbclient): its lines are
the cell's stream output, its tqdm bars drive its row, its rich displays are rank-labelled rich
outputs, and no rank ever sends over the kernel's sockets."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
from jupyter_client.manager import AsyncKernelManager
from kernelutil import KERNEL_NAME
from nbclient import NotebookClient

pytestmark = pytest.mark.timeout(600)

FORK_WARNING = "send message from fork"


@pytest.fixture
def execute(kernel_spec_manager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Run cells in a fresh kernel whose own stderr (ipykernel's log) is kept in a file."""
    monkeypatch.setenv("NBTRAIN_LOG_DIR", str(tmp_path / "logs"))
    kernel_log = tmp_path / "kernel.log"

    def run(cells: list[str]) -> tuple[nbformat.NotebookNode, str]:
        notebook = nbformat.v4.new_notebook(
            cells=[nbformat.v4.new_code_cell(source) for source in cells]
        )
        manager = AsyncKernelManager(
            kernel_name=KERNEL_NAME, kernel_spec_manager=kernel_spec_manager
        )
        client = NotebookClient(notebook, km=manager, kernel_name=KERNEL_NAME, timeout=300,
                                store_widget_state=True, allow_errors=True)
        with open(kernel_log, "w") as log:
            client.execute(cleanup_kc=True, cwd=str(tmp_path), stderr=log)
        return notebook, kernel_log.read_text()

    return run


def streams(cell: nbformat.NotebookNode, name: str | None = None) -> str:
    return "".join(
        out["text"] for out in cell.outputs
        if out["output_type"] == "stream" and (name is None or out["name"] == name)
    )


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_every_rank_line_is_in_the_cells_stream_output(execute, method):
    notebook, log = execute([f"""
from nbtrain import notebook_launcher
def train():
    import os, sys
    rank = int(os.environ["RANK"])
    for i in range(40):
        print(f"line {{i}} of rank {{rank}}", file=sys.stderr if i % 10 == 9 else sys.stdout)
notebook_launcher(train, num_processes=2, start_method="{method}")
"""])
    out, err = streams(notebook.cells[0], "stdout"), streams(notebook.cells[0], "stderr")
    for rank in (0, 1):  # each stream in its order (the two pipes of a rank race each other)
        for text, wanted in ((out, [i for i in range(40) if i % 10 != 9]), (err, [9, 19, 29, 39])):
            mine = [line for line in text.splitlines() if line.startswith(f"[rank {rank}] ")]
            assert mine == [f"[rank {rank}] line {i} of rank {rank}" for i in wanted]
    messages = [out for out in notebook.cells[0].outputs if out["output_type"] == "stream"]
    assert len(messages) < 40, "published in batches, not a message per line"
    assert FORK_WARNING not in log


def test_output_main_shows_rank_0_only_even_from_dataloader_workers(execute):
    notebook, _ = execute(["""
import torch
from torch.utils.data import DataLoader
from nbtrain import notebook_launcher
class Loud(torch.utils.data.Dataset):
    def __len__(self): return 8
    def __getitem__(self, i):
        import os
        print(f"worker item {i} in rank {os.environ['RANK']}")
        return i
def train():
    import os
    print(f"hello from rank {os.environ['RANK']}")
    return sum(int(x) for x in DataLoader(Loud(), num_workers=2))
print(notebook_launcher(train, num_processes=2, output="main"))
"""])
    text = streams(notebook.cells[0])
    assert "[rank 0] hello from rank 0" in text and "rank 1" not in text.replace("[rank 0]", "")
    assert text.count("worker item") == 8
    assert "28" in text


def test_the_last_line_before_os_exit_arrives(execute):
    notebook, _ = execute(["""
from nbtrain import notebook_launcher
def train():
    import os
    if os.environ["RANK"] == "1":
        print("my last words", flush=False)
        os._exit(3)
notebook_launcher(train, num_processes=2)
"""])
    cell = notebook.cells[0]
    assert "[rank 1] my last words" in streams(cell)
    errors = [out["ename"] for out in cell.outputs if out["output_type"] == "error"]
    assert errors == ["WorkerError"]


def test_a_flood_is_held_back_counted_and_kept_whole_in_the_log_folder(execute, tmp_path):
    notebook, _ = execute(["""
import time
from nbtrain import notebook_launcher
def flood():
    import sys
    write = sys.stdout.write
    for i in range(100_000):
        write(f"flood line {i}\\n")
started = time.monotonic()
notebook_launcher(flood, num_processes=2)
""", "print('responsive', round(time.monotonic() - started))"])
    text = streams(notebook.cells[0])
    notices = re.findall(
        r"([\d,]+) output lines held back from the cell .*; every line is in (\S+)", text
    )
    assert notices, text[-2000:]
    held = notices[-1]  # counts so far while the flood ran, the total at the end
    shown = text.count("flood line")
    assert int(held[0].replace(",", "")) == 200_000 - shown
    folder = Path(held[1])
    assert folder.parent == tmp_path / "logs"
    for rank in (0, 1):
        lines = (folder / f"rank-{rank}.log").read_text().splitlines()
        assert lines == [f"flood line {i}" for i in range(100_000)]
    assert "responsive" in streams(notebook.cells[1])


TQDM_TUTORIAL = """
from tqdm.auto import tqdm
from nbtrain import notebook_launcher
def training_function():
    import time
    num_training_steps = 18
    progress_bar = tqdm(range(num_training_steps))
    for epoch in range(3):
        for step in range(6):
            time.sleep(0.01)
            progress_bar.update(1)
            progress_bar.set_postfix(loss=1.0 / (epoch + 1), note="text is not a metric")
notebook_launcher(training_function, num_processes=2)
"""


def test_tqdm_auto_in_ranks_drives_their_rows_and_sends_nothing_from_the_fork(execute):
    notebook, log = execute([TQDM_TUTORIAL])
    cell = notebook.cells[0]
    assert FORK_WARNING not in log, log[-3000:]
    assert "\r" not in streams(cell)
    final = "".join(
        str(out.get("data", {}).get("text/plain", "")) for out in cell.outputs
        if out["output_type"] == "display_data"
    )
    for rank in (0, 1):
        assert re.search(rf"\[rank {rank}\] 18/18", final), final
        assert re.search(rf"\[rank {rank}\] 18/18 .*it/s loss 0.3333 done", final), final
    assert "text is not a metric" not in final  # set_postfix's numbers are metrics, text not


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_display_and_plt_show_give_rank_labelled_rich_outputs(execute, method):
    notebook, log = execute([f"""
from nbtrain import notebook_launcher
def show():
    import os
    from IPython.display import HTML, display
    import matplotlib
    import matplotlib.pyplot as plt
    rank = os.environ["RANK"]
    display(HTML(f"<b>bold from {{rank}}</b>"))
    plt.plot([1, 2, 3])
    plt.show()
notebook_launcher(show, num_processes=2, start_method="{method}")
"""])
    cell = notebook.cells[0]
    shown = [out for out in cell.outputs if out["output_type"] == "display_data"]
    html = [out["data"].get("text/html", "") for out in shown]
    html = [text for text in html if "bold from" in text]
    assert sorted(re.findall(r"rank (\d)</div><b>bold from (\d)</b>", "".join(html))) == [
        ("0", "0"), ("1", "1")
    ]
    images = [out for out in shown if "image/png" in out["data"]]
    assert len(images) == 2
    assert all(out["data"]["text/plain"].startswith("[rank ") for out in images)
    # What a frontend draws (the HTML form) carries the label too, under every start method.
    assert sorted(re.search(r">rank (\d)</div><img ", out["data"].get("text/html", "")).group(1)
                  for out in images) == ["0", "1"], [out["data"].keys() for out in images]
    assert FORK_WARNING not in log


def test_a_trainers_progress_bar_in_forked_ranks_drives_their_rows(execute, tmp_path):
    """Transformers picked its HTML notebook progress callback in the kernel; in the ranks its
    tqdm bar serves instead and drives the main rank's row: no HTML progress, nothing sent from
    the fork."""
    notebook, log = execute([f"""
import torch
import transformers.trainer  # imported in the kernel: it chose the notebook progress callback
from transformers import Trainer, TrainingArguments
from nbtrain import notebook_launcher

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
    def forward(self, x, labels):
        return {{"loss": torch.nn.functional.mse_loss(self.layer(x).squeeze(-1), labels)}}

def fit():
    data = [{{"x": torch.randn(2), "labels": torch.tensor(0.5)}} for _ in range(24)]
    args = TrainingArguments(output_dir={str(tmp_path / "out")!r}, max_steps=6,
                             per_device_train_batch_size=2, report_to=[], save_strategy="no",
                             logging_strategy="no", use_cpu=True)
    Trainer(model=Tiny(), args=args, train_dataset=data).train()

notebook_launcher(fit, num_processes=2, start_method="fork")
"""])
    cell = notebook.cells[0]
    errors = [out for out in cell.outputs if out["output_type"] == "error"]
    assert not errors, errors
    assert FORK_WARNING not in log, log[-3000:]
    displays = [out for out in cell.outputs if out["output_type"] == "display_data"]
    assert not any("<progress" in str(out["data"].get("text/html", "")) for out in displays)
    final = "".join(str(out["data"].get("text/plain", "")) for out in displays)
    # Transformers shows its bar on the main process only (is_world_process_zero).
    assert re.search(r"\[rank 0\] 6/6", final), final
    assert "\r" not in streams(cell)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_ranks_prints_and_displays_keep_their_order(execute, method):
    """Lines and displays travel through different pipes; the cell shows them as made."""
    notebook, _ = execute([f"""
from nbtrain import notebook_launcher
def talk():
    import os, sys
    from IPython.display import HTML, display
    rank = os.environ["RANK"]
    for i in range(25):
        print(f"before {{i}}")
        display(HTML(f"<i>shown {{rank}} {{i}}</i>"))
        print(f"after {{i}}", file=sys.stderr if i % 2 else sys.stdout)
notebook_launcher(talk, num_processes=2, start_method="{method}")
"""])
    seen: dict[str, list[str]] = {"0": [], "1": []}
    for output in notebook.cells[0].outputs:
        if output["output_type"] == "stream":
            for rank, text in re.findall(r"\[rank (\d)\] (\w+ \d+)", output["text"]):
                seen[rank].append(text)
        elif output["output_type"] == "display_data":
            for rank, i in re.findall(r"shown (\d) (\d+)", output["data"].get("text/html", "")):
                seen[rank].append(f"shown {i}")
    for rank, made in seen.items():
        # Between two displays: the lines printed between them (stdout and stderr are two pipes
        # that race each other, as in a terminal: their lines keep their order within a stream).
        shown = [text for text in made if text.startswith("shown")]
        assert shown == [f"shown {i}" for i in range(25)], (rank, made)
        between: list[set[str]] = [set()]
        for text in made:
            if text.startswith("shown"):
                between.append(set())
            else:
                between[-1].add(text)
        assert between == [{"before 0"}, *({f"after {i}", f"before {i + 1}"} for i in range(24)),
                           {"after 24"}], (rank, made)
    assert "nbtrain-display-mark" not in json.dumps(notebook.cells[0].outputs)
