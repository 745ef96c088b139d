"""Stop and resume in real Jupyter kernels, as a user does it: the stop button mid-epoch at
random moments, then ``resume=True`` in the next cell; a double stop; a kernel killed after a
periodic checkpoint and a fresh kernel that resumes. Every resumed run must end with the weights
of an uninterrupted one, bit for bit."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest
from kernelutil import Kernel, running_kernel

pytestmark = pytest.mark.timeout(600)

TRIALS = 20

# The same cell in every kernel: shuffling, dropout, Adam, a scheduler, a registered object.
SETUP = """
import os, sys, time, torch
from pathlib import Path
from nbtrain import Accelerator, notebook_launcher, set_seed
sys.path.insert(0, TESTS_DIR)
from stopresume import Seen  # the tests' shared registered object (tests/stopresume.py)

def train(marker=None, slow=0.0, epochs=3):
    set_seed(0)
    accelerator = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.7)
    gen = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(192, 8, generator=gen),
                                          torch.randint(0, 2, (192,), generator=gen))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    seen = Seen()
    accelerator.register_for_checkpointing(seen)
    for epoch in range(loader.iteration, epochs):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step(); scheduler.step(); optimizer.zero_grad()
            seen.batches += 1
            if marker and accelerator.is_main_process and not os.path.exists(marker):
                Path(marker).write_text("training")
            time.sleep(slow)
    weights = accelerator.unwrap_model(model).state_dict()
    return {"weights": {k: v.clone() for k, v in weights.items()}, "batches": seen.batches}

def same(a, b):
    return a["batches"] == b["batches"] and all(
        torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"])

reference = notebook_launcher(train, num_processes=2, progress="off")
""".replace("TESTS_DIR", repr(str(Path(__file__).resolve().parent.parent)))


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    with running_kernel(tmp_path_factory.mktemp("kernelspec"), SETUP) as k:
        yield k


def wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def stop_button(kernel: Kernel, code: str, marker: Path, delay: float, presses: int = 1):
    """Run ``code``; once training runs, wait ``delay`` and press stop ``presses`` times."""
    msg_id = kernel.start(code)
    wait_for(marker)
    time.sleep(delay)
    for _ in range(presses):
        kernel.manager.interrupt_kernel()
        time.sleep(0.05)
    return kernel.collect(msg_id, timeout=120)


def test_stop_at_random_moments_then_resume_matches_the_uninterrupted_run(kernel, tmp_path):
    seed = random.randrange(1 << 30)
    chooser = random.Random(seed)
    stopped = 0
    for trial in range(TRIALS):
        project, marker = tmp_path / f"run{trial}", tmp_path / f"marker{trial}"
        delay = chooser.uniform(0.0, 0.6)
        out = stop_button(kernel, f"""
notebook_launcher(train, kwargs={{"marker": {str(marker)!r}, "slow": 0.03}}, num_processes=2,
                  on_interrupt="checkpoint", project_dir={str(project)!r}, progress="text")
""", marker, delay)
        where = f"trial {trial} (seed {seed}, stop {delay:.3f}s into training)"
        assert out.error is not None and out.error["ename"] == "KeyboardInterrupt", where
        assert "stopped at step" in out.error["evalue"], (where, out.error["evalue"])
        assert out.stdout.count("stopped (saved)") == 2, "each rank's final row says so"
        assert "Stopped at step" in out.stdout, "the summary says at which step"
        stopped += 1
        resumed = kernel.run(f"""
resumed = notebook_launcher(train, num_processes=2, resume=True, project_dir={str(project)!r},
                            progress="off")
print("bitwise:", same(resumed, reference))
""")
        assert resumed.error is None, (where, resumed.traceback_text)
        assert "bitwise: True" in resumed.stdout, where
    assert stopped == TRIALS
    assert kernel.live_children() == []


def test_a_second_stop_stops_at_once_and_the_previous_checkpoint_resumes(kernel, tmp_path):
    project = tmp_path / "project"
    first = project / "checkpoints" / "checkpoint_0" / "nbtrain_checkpoint.json"
    out = stop_button(kernel, f"""
notebook_launcher(train, kwargs={{"slow": 0.3}}, num_processes=2, on_interrupt="checkpoint",
                  checkpoint_every=2, project_dir={str(project)!r}, progress="text")
""", first, 0.0, presses=2)
    assert out.error is not None and out.error["ename"] == "KeyboardInterrupt"
    assert "every rank was stopped" in out.error["evalue"]
    assert "newest complete checkpoint" in out.error["evalue"]
    deadline = time.monotonic() + 10
    while kernel.live_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert kernel.live_children() == []
    resumed = kernel.run(f"""
print("bitwise:", same(notebook_launcher(train, num_processes=2, resume=True,
                                         project_dir={str(project)!r}, progress="off"), reference))
""")
    assert resumed.error is None, resumed.traceback_text
    assert "bitwise: True" in resumed.stdout


def test_a_killed_kernel_resumes_in_a_fresh_kernel_from_its_periodic_checkpoint(
    tmp_path_factory, tmp_path
):
    project = tmp_path / "project"
    saved = project / "checkpoints" / "checkpoint_1" / "nbtrain_checkpoint.json"
    with running_kernel(tmp_path_factory.mktemp("kernelspec"), SETUP) as doomed:
        doomed.start(f"""
notebook_launcher(train, kwargs={{"slow": 0.1}}, num_processes=2, checkpoint_every=6,
                  project_dir={str(project)!r}, progress="off")
""")
        wait_for(saved)
        ranks = doomed.live_children()
        os.kill(doomed.pid, signal.SIGKILL)  # the browser tab closed, the runtime recycled
        gone = time.monotonic() + 20
        while any(p.is_running() and p.status() != "zombie" for p in ranks):
            assert time.monotonic() < gone, "ranks outlived their kernel"
            time.sleep(0.1)
    with running_kernel(tmp_path_factory.mktemp("kernelspec"), SETUP) as fresh:
        out = fresh.run(f"""
resumed = notebook_launcher(train, num_processes=2, resume=True, project_dir={str(project)!r},
                            progress="off")
print("bitwise:", same(resumed, reference))
""")
        assert out.error is None, out.traceback_text
        assert "bitwise: True" in out.stdout
