"""A kernel interrupt in every phase of a launch, in a real Jupyter kernel.

Jupyter's interrupt (KernelManager.interrupt_kernel) sends SIGINT to the kernel's process group:
the kernel, and its forkserver and resource tracker, but not the ranks (each leads its own
group). In every phase the cell must end with KeyboardInterrupt, every process the launch
created (ranks, their DataLoader workers) must be gone, and the next launch must work:

- start-up: spawned ranks still booting; and a cold forkserver still importing torch, which the
  interrupt kills (the kernel is then blocked starting ranks, inside processes.start_ranks);
- training: a DDP loop with DataLoader workers;
- result transfer: a 384 MB return value on its way through the pipe;
- checkpoint save: save_state of 512 MB of weights; the previous checkpoint still loads after.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil
import pytest
import rankfaults
from kernelutil import Kernel, running_kernel

pytestmark = pytest.mark.timeout(300)

HERE = Path(__file__).parent
GONE_WITHIN = 15.0  # generous: only catches survivors

SETUP = f"""
import os, sys, time
sys.path.insert(0, {str(HERE)!r})
import torch
import torch.distributed as dist
from pathlib import Path
from nbtrain import Accelerator, notebook_launcher
import rankfaults

def note(marks, what):
    rankfaults.record_process(Path(marks), what, int(os.environ["RANK"]))
"""

CELLS = {
    "booting": """
print("launching", flush=True)
notebook_launcher(note, ({marks!r}, "rank"), num_processes=2, start_method="spawn",
                  progress="off")
""",
    "cold forkserver": """
print("launching", flush=True)
notebook_launcher(note, ({marks!r}, "rank"), num_processes=2, start_method="forkserver",
                  progress="off")
""",
    "training": """
from torch.utils.data import DataLoader, TensorDataset
import functools

def train(marks):
    note(marks, "rank")
    acc = Accelerator()
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1))
    loader = DataLoader(data, batch_size=8, num_workers=2,
                        worker_init_fn=functools.partial(rankfaults._record_worker, marks,
                                                         acc.process_index))
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    for epoch in range(1000):
        for step, (x, y) in enumerate(loader):
            loss = torch.nn.functional.mse_loss(model(x), y)
            acc.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if epoch == 0 and step == 5:
                print("training", flush=True)

notebook_launcher(train, ({marks!r},), num_processes=2, progress="off")
""",
    "result transfer": """
def big_result(marks):
    note(marks, "rank")
    value = torch.ones(96 << 20)  # 384 MB
    print("returning", flush=True)
    time.sleep(1.0)  # the test watches this rank's writes from before they start
    return value

result = notebook_launcher(big_result, ({marks!r},), num_processes=2, progress="off")
""",
    "checkpoint save": """
def save(marks, size):
    note(marks, "rank")
    acc = Accelerator()
    acc.register_for_checkpointing(rankfaults.Tag(size))
    if size > 100:  # 512 MB of weights: about 2 s of writing here
        for _ in range(2):
            acc.register_for_checkpointing(torch.nn.Linear(size, size))
        print("saving", flush=True)
    acc.save_state(os.path.join(marks, "checkpoint"))

notebook_launcher(save, ({marks!r}, 4), num_processes=2, progress="off")  # the previous one
notebook_launcher(save, ({marks!r}, 8192), num_processes=2, progress="off")
""",
}
SIGNAL_LINE = {
    "booting": "launching",
    "cold forkserver": "launching",
    "training": "training",
    "result transfer": "returning",
    "checkpoint save": "saving",
}
TRANSFER_SEEN = 64 << 20  # bytes rank 0 must have written into its pipe before the interrupt


def rank_pid(marks: Path, rank: int) -> int:
    return next(pid for kind, r, pid, _ in rankfaults.traces(marks, "rank") if r == rank)


def wait_for(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


def ready_for_interrupt(phase: str, marks: Path) -> psutil.Process | None:
    """Wait until the phase is surely under way; returns a rank held there (SIGSTOP) until the
    interrupt has reached it."""
    if phase == "result transfer":
        # Rank 0 is writing its result: watch its write counter move, then hold it mid-way.
        # On an idle machine its 384 MB take a tenth of a second: left running, it had finished
        # (and exited) before the interrupt arrived.
        rank0 = psutil.Process(rank_pid(marks, 0))  # (known since the cell's first line)
        start = rank0.io_counters().write_chars
        wait_for(lambda: rank0.io_counters().write_chars - start > TRANSFER_SEEN,
                 "rank 0 to start sending its result", timeout=120)
        rank0.suspend()
        return rank0
    if phase == "checkpoint save":
        partial = marks / ".checkpoint.partial"
        wait_for(lambda: partial.is_dir() and any(partial.iterdir()), "the save to begin writing")
        return None
    time.sleep(0.3)  # booting, training: the line itself says the phase is under way
    return None


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    with running_kernel(tmp_path_factory.mktemp("kernelspec"), SETUP) as k:
        yield k


@pytest.fixture
def fresh_kernel(tmp_path_factory):
    """A kernel whose forkserver has not started yet."""
    with running_kernel(tmp_path_factory.mktemp("kernelspec"), SETUP) as k:
        yield k


def interrupt_during(kernel: Kernel, phase: str, marks: Path) -> tuple[dict, list[int], float]:
    """Run the phase's cell, interrupt it at the right moment; returns the cell's error, the
    pids of every descendant at the moment of the interrupt, and the seconds until the
    KeyboardInterrupt."""
    marks.mkdir(parents=True, exist_ok=True)
    msg_id = kernel.start(CELLS[phase].format(marks=str(marks)))
    kernel.collect(msg_id, timeout=180, until=SIGNAL_LINE[phase])
    held = ready_for_interrupt(phase, marks)
    descendants = [p.pid for p in psutil.Process(kernel.pid).children(recursive=True)]
    sent = time.monotonic()
    kernel.manager.interrupt_kernel()
    if held is not None:  # let it go once the launcher's stop signal waits for it
        wait_for(lambda: _stop_pending(held), "the launcher to signal the held rank")
        held.resume()
    out = kernel.collect(msg_id, timeout=120)
    back = time.monotonic() - sent
    assert out.error is not None, f"the cell finished before the interrupt: {out.stdout[-500:]}"
    return out.error, descendants, back


def assert_all_gone(kernel: Kernel, pids: list[int], marks: Path) -> None:
    recorded = [pid for _, _, pid, _ in rankfaults.traces(marks)]
    deadline = time.monotonic() + GONE_WITHIN
    watched = {pid for pid in pids + recorded}
    helpers = {p.pid for p in psutil.Process(kernel.pid).children() if _is_helper(p)}
    watched -= helpers  # the forkserver and resource tracker stay, on purpose
    while time.monotonic() < deadline:
        alive = [pid for pid in watched if _alive(pid)]
        if not alive and not kernel.live_children():
            return
        time.sleep(0.1)
    raise AssertionError(f"still running: {alive}, kernel children {kernel.live_children()}")


def _stop_pending(process: psutil.Process) -> bool:
    """A SIGTERM or SIGKILL waits for the (stopped) process, or it is gone already."""
    try:
        with open(f"/proc/{process.pid}/status", encoding="ascii") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
    except FileNotFoundError:
        return True
    pending = int(fields["ShdPnd"], 16) | int(fields["SigPnd"], 16)
    return bool(pending & ((1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGKILL - 1))))


def _is_helper(process: psutil.Process) -> bool:
    try:
        command = " ".join(process.cmdline())
    except psutil.Error:
        return False
    return "forkserver" in command or "resource_tracker" in command


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_next_launch_works(kernel: Kernel, method: str = "fork") -> None:
    out = kernel.run(
        f'print(notebook_launcher(rankfaults.echo, ("again",), num_processes=2, '
        f'start_method="{method}", progress="off"))'
    )
    assert out.error is None, out.traceback_text
    assert "again" in out.stdout


@pytest.mark.parametrize("phase", ["booting", "training", "result transfer"])
def test_interrupt(kernel, phase, tmp_path):
    error, descendants, seconds = interrupt_during(kernel, phase, tmp_path)
    assert error["ename"] == "KeyboardInterrupt", error
    assert seconds < 60, "the interrupt took too long to come back"
    if phase == "booting":
        assert not list(tmp_path.glob("proc-rank-*")), "a rank got to run: not start-up"
    if phase == "training":
        workers = list(tmp_path.glob("proc-worker-*"))
        assert len(workers) == 4, "each rank's two DataLoader workers should have started"
    if phase == "result transfer":
        assert kernel.value("'result' in globals()") is False
    assert_all_gone(kernel, descendants, tmp_path)
    assert_next_launch_works(kernel)


def test_interrupt_during_checkpoint_save_keeps_the_previous_checkpoint(kernel, tmp_path):
    error, descendants, _ = interrupt_during(kernel, "checkpoint save", tmp_path)
    assert error["ename"] == "KeyboardInterrupt", error
    assert (tmp_path / ".checkpoint.partial").exists(), "the interrupt did not land mid-save"
    assert_all_gone(kernel, descendants, tmp_path)
    out = kernel.run(f"""
def load(marks):
    acc = Accelerator()
    tag = rankfaults.Tag(0)
    acc.register_for_checkpointing(tag)
    acc.load_state(os.path.join(marks, "checkpoint"))
    return tag.value

print("loaded", notebook_launcher(load, ({str(tmp_path)!r},), num_processes=2, progress="off"))
""")
    assert out.error is None, out.traceback_text
    assert "loaded 4" in out.stdout, "the previous checkpoint did not load"


def test_interrupt_while_a_cold_forkserver_starts(fresh_kernel, tmp_path):
    """The interrupt reaches the forkserver too (same process group) while it imports torch:
    it goes on importing (rank/forkserver_preload.py: a half-imported forkserver once served
    ranks whose import of torch failed), the kernel is interrupted inside start_ranks before a
    rank runs, and the next forkserver launch works."""
    error, descendants, _ = interrupt_during(fresh_kernel, "cold forkserver", tmp_path)
    assert error["ename"] == "KeyboardInterrupt", error
    assert not list(tmp_path.glob("proc-rank-*")), "a rank got to run: not start-up"
    assert_all_gone(fresh_kernel, descendants, tmp_path)
    assert_next_launch_works(fresh_kernel, "forkserver")
