"""Background runs (``block=False``) in real Jupyter kernels: other cells answer while the ranks
train; the value, the failure, the stop (with and without a checkpoint, then resume), the
timeout and the output are what a blocking launch gives; nothing lands in other cells; two runs
on the same GPUs are refused; the kernel's shutdown leaves nothing behind."""

from __future__ import annotations

import glob
import time
from pathlib import Path

import psutil
import pytest
from kernelutil import Kernel, Result, running_kernel
from test_debugger_kernel import converse  # stdin requests answered as a frontend does

pytestmark = pytest.mark.timeout(600)

LINES = 30  # lines each rank prints in the output test

DEFINITIONS = """
import os, time, torch
from pathlib import Path
import nbtrain
from nbtrain import Accelerator, notebook_launcher, set_seed

def train(marker=None, slow=0.0, epochs=2):
    set_seed(0)
    accelerator = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(128, 8, generator=gen),
                                          torch.randint(0, 2, (128,), generator=gen))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(loader.iteration, epochs):
        for step, (x, y) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step(); optimizer.zero_grad()
            nbtrain.log({"loss": loss.item()})
            if marker and accelerator.is_main_process and not os.path.exists(marker):
                Path(marker).write_text("training")
            time.sleep(slow)
    return {k: v.clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}

def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

def chatty(n):
    import sys
    rank = int(os.environ["RANK"])
    for i in range(n):
        print(f"line {i}", flush=True)
        if i % 7 == 0:
            print(f"err {i}", file=sys.stderr, flush=True)
        time.sleep(0.01)
    return rank

def fails(after):
    time.sleep(after)
    if int(os.environ["RANK"]) == 1:
        raise ValueError("rank 1 broke")
    time.sleep(30)
"""
SETUP = DEFINITIONS + 'reference = notebook_launcher(train, num_processes=2, progress="off")\n'


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    with running_kernel(tmp_path_factory.mktemp("kernelspec"), SETUP) as k:
        yield k


def ok(kernel: Kernel, code: str, timeout: float = 120) -> Result:
    out = kernel.run(code, timeout)
    assert out.error is None, out.traceback_text
    return out


def rank_lines(out: Result) -> str:
    return "\n".join(line for line in (out.stdout + out.stderr).splitlines() if "[rank" in line)


def test_cells_answer_while_the_run_trains_and_its_value_is_the_blocking_one(kernel, tmp_path):
    marker = tmp_path / "training"
    launched = ok(kernel, f"run = notebook_launcher(train, args=({str(marker)!r}, 0.2), "
                          "num_processes=2, block=False)")
    assert not rank_lines(launched)
    ids = [d.get("transient", {}).get("display_id", "") for d in launched.displays]
    assert any(i.startswith("nbtrain-run-") for i in ids), launched.displays
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    times = []
    for _ in range(5):  # while the ranks train: each cell answers at once, with no rank line
        started = time.monotonic()
        out = ok(kernel, "x = 1 + 1; print(run.status)")
        times.append(time.monotonic() - started)
        assert out.stdout.strip() == "running"
        assert not rank_lines(out)
    assert max(times) < 2.0, times  # (2 shared cores; the benchmark measures it properly)
    assert kernel.value("same(run.wait(), reference)") is True
    assert kernel.value("run.status") == "done"
    assert kernel.value("len(run.metrics)") == 2 * 2 * 8  # 2 ranks, 2 epochs of 8 batches each
    assert kernel.value("sorted(run.metrics.to_pandas().columns)") == [
        "name", "rank", "step", "value"
    ]
    assert kernel.value("nbtrain.runs()[-1] is run") is True


def test_output_in_order_exactly_once_and_in_no_other_cell(kernel):
    ok(kernel, f"run = notebook_launcher(chatty, args=({LINES},), num_processes=2, block=False)")
    out = ok(kernel, "print('cell'); time.sleep(1.0); print('cell end')")
    assert out.stdout == "cell\ncell end\n" and not out.stderr
    assert kernel.value("run.wait()") == 0
    for rank in (0, 1):
        expected = []
        for i in range(LINES):
            expected.append(f"[rank {rank}] line {i}")
            if i % 7 == 0:
                expected.append(f"[rank {rank}] err {i}")
        got = kernel.value(f"run.output({rank})")
        # each stream is in order; stdout and stderr of one rank arrive through two pipes
        assert [g for g in got if " line " in g] == [e for e in expected if " line " in e]
        assert [g for g in got if " err " in g] == [e for e in expected if " err " in e]
    assert kernel.value("len(run.output())") == 2 * (LINES + (LINES + 6) // 7)
    folder = Path(kernel.value("run.log_folder"))
    assert (folder / "rank-1.log").read_text().count("line ") == LINES
    shown = ok(kernel, "run")  # displayed after the end: the static dashboard and lines
    html = "".join(str(d["data"].get("text/html", "")) for d in shown.displays)
    assert "[rank 1] line 29" in html
    assert "application/vnd.jupyter.widget-view+json" not in str(shown.displays)
    # the ended view's widgets stay open (a page reloaded mid-run draws the final view from
    # them) until nbtrain.runs() lets the run go: then no widget (comm) is left
    widgets = "len(__import__('ipywidgets').widgets.widget._instances)"
    assert kernel.value(widgets) > 0
    ok(kernel, "nbtrain.runs().clear()")
    assert kernel.value(widgets) == 0


def test_a_failure_is_raised_by_wait(kernel):
    ok(kernel, "run = notebook_launcher(fails, args=(1.0,), num_processes=2, block=False)")
    out = kernel.run("run.wait()")
    assert out.error is not None and out.error["ename"] == "WorkerError"
    assert "rank 1 broke" in out.traceback_text
    assert kernel.value("run.status") == "failed"


def test_timeouts(kernel):
    ok(kernel, "run = notebook_launcher(time.sleep, args=(60,), num_processes=2, "
               "timeout=4, block=False)")
    waiting = kernel.run("run.wait(timeout=0.5)")  # the wait times out; the run goes on
    assert waiting.error is not None and waiting.error["ename"] == "TimeoutError"
    assert "still running" in waiting.error["evalue"]
    assert kernel.value("run.status") == "running"
    ended = kernel.run("run.wait()")  # the launch's own timeout=: what a blocking one raises
    assert ended.error is not None and ended.error["ename"] == "TimeoutError"
    assert "timeout=4" in ended.error["evalue"]
    assert kernel.value("run.status") == "timed out"


def test_stop_at_once_and_with_a_checkpoint_then_resume(kernel, tmp_path):
    marker = tmp_path / "training"
    ok(kernel, f"run = notebook_launcher(train, args=({str(marker)!r}, 0.3), "
               "num_processes=2, block=False)")
    while not marker.exists():
        time.sleep(0.05)
    assert kernel.value("sorted(run.where().ranks)") == [0, 1]  # each rank's stack, now
    refused = kernel.run("run.stop(checkpoint=True)")  # launched without on_interrupt=
    assert refused.error is not None and "on_interrupt='checkpoint'" in refused.error["evalue"]
    ok(kernel, "run.stop()")
    out = kernel.run("run.wait()")
    assert out.error is not None and out.error["ename"] == "KeyboardInterrupt"
    assert kernel.value("run.status") == "stopped"

    marker.unlink()
    project = tmp_path / "project"
    options = f"num_processes=2, on_interrupt='checkpoint', project_dir={str(project)!r}"
    ok(kernel, f"run = notebook_launcher(train, args=({str(marker)!r}, 0.3), {options}, "
               "block=False)")
    while not marker.exists():
        time.sleep(0.05)
    ok(kernel, "run.stop(checkpoint=True)")
    out = kernel.run("run.wait()")
    assert out.error is not None and out.error["ename"] == "KeyboardInterrupt"
    assert "stopped at step" in out.error["evalue"]
    assert kernel.value("run.status") == "stopped"
    resumed = f"notebook_launcher(train, {options}, resume=True, block=False).wait()"
    assert kernel.value(f"same({resumed}, reference)") is True


def test_two_runs_on_the_same_gpus_are_refused(kernel):
    # Two GPUs, mocked: the runs claim GPU 0 and 1 (their ranks still run on this CPU).
    ok(kernel, "from nbtrain.kernel.run import registry; real = registry.gpu_count; "
               "registry.gpu_count = lambda: 2")
    try:
        ok(kernel, "first = notebook_launcher(time.sleep, args=(60,), num_processes=2, "
                   "block=False)")
        out = kernel.run("notebook_launcher(time.sleep, args=(1,), num_processes=2, "
                         "block=False)")
        assert out.error is not None and out.error["ename"] == "RuntimeError"
        assert "<nbtrain.Run sleep: running>" in out.error["evalue"]
        assert "GPU 0, GPU 1" in out.error["evalue"]
        ok(kernel, "first.stop()")
        assert kernel.run("first.wait()").error["ename"] == "KeyboardInterrupt"
        # CPU ranks (no GPU) run side by side
        ok(kernel, "registry.gpu_count = lambda: 0")
        ok(kernel, "a = notebook_launcher(time.sleep, args=(2,), num_processes=2, block=False)"
                   "; b = notebook_launcher(time.sleep, args=(2,), num_processes=2, "
                   "block=False)")
        assert kernel.value("(a.wait(), b.wait(), a.status, b.status)") == (
            None, None, "done", "done"
        )
    finally:
        ok(kernel, "registry.gpu_count = real")


def test_runs_keep_their_value_until_cleared(kernel):
    ok(kernel, "nbtrain.runs().clear(); "
               "run = notebook_launcher(chatty, args=(3,), num_processes=2, block=False); "
               "run.wait()")
    assert kernel.value("[r.status for r in nbtrain.runs()]") == ["done"]
    assert kernel.value("run.result") == 0
    assert kernel.value("len(nbtrain.runs()) == 1 and nbtrain.runs()[0]._lifecycle is None")
    ok(kernel, "nbtrain.runs().clear()")
    assert kernel.value("len(nbtrain.runs())") == 0


def test_a_kernel_shutdown_stops_a_background_run(tmp_path):
    kernel = Kernel(tmp_path)
    try:
        marker = tmp_path / "training"
        ok(kernel, DEFINITIONS)
        ok(kernel, f"run = notebook_launcher(train, args=({str(marker)!r}, 0.5, 50), "
                   "num_processes=2, block=False)")
        while not marker.exists():
            time.sleep(0.05)
        assert kernel.live_children()  # the ranks train
        pid = kernel.pid
        kernel.client.stop_channels()
        kernel.manager.shutdown_kernel(now=False)  # as the frontend's shutdown or restart
        deadline = time.monotonic() + 30
        while kernel.live_children() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not kernel.live_children()
        assert not psutil.pid_exists(pid)
        assert not glob.glob(f"/dev/shm/nbtrain_{pid}_*")
    finally:
        if kernel.manager.is_alive():
            kernel.shutdown()


def test_the_stop_button_on_an_idle_kernel_leaves_the_run_alone(kernel):
    ok(kernel, "run = notebook_launcher(chatty, args=(200,), num_processes=2, block=False)")
    time.sleep(1.0)
    kernel.manager.interrupt_kernel()  # the kernel is idle: nothing of the run may stop
    time.sleep(0.5)
    assert kernel.value("run.status") == "running"
    assert kernel.value("run.wait()") == 0
    assert kernel.value("len(run.output(1))") == 200 + 29


def test_warm_ranks_run_in_the_background(kernel):
    ok(kernel, "ranks = nbtrain.start_ranks(2, progress='off')")
    try:
        ok(kernel, "run = ranks.run(chatty, 40, block=False)")
        busy = kernel.run("ranks.run(chatty, 1)")  # the ranks take no other command meanwhile
        assert busy.error is not None and "in the background" in busy.error["evalue"]
        assert kernel.value("run.wait()") == 0
        assert kernel.value("len(run.output(0))") == 40 + 6
        ok(kernel, "run = ranks.run(chatty, 1000, block=False)")
        time.sleep(2.0)
        ok(kernel, "run.stop()")  # the command is interrupted; the ranks stay
        out = kernel.run("run.wait()")
        assert out.error is not None and out.error["ename"] == "KeyboardInterrupt"
        ok(kernel, "again = ranks.run(chatty, 1)")
        assert kernel.value("again") == 0
    finally:
        ok(kernel, "ranks.stop()")


def test_restarts_through_the_elastic_agent_in_the_background(kernel, tmp_path):
    marker = tmp_path / "failed-once"
    ok(kernel, f"""
def flaky():
    time.sleep(0.5)
    if int(os.environ["RANK"]) == 1 and not os.path.exists({str(marker)!r}):
        Path({str(marker)!r}).write_text("x")
        raise ValueError("the first attempt fails")
    print("attempt ok", flush=True)
    return 7
run = notebook_launcher(flaky, num_processes=2, max_restarts=1, block=False)""")
    assert kernel.value("run.wait()") == 7
    assert marker.exists()  # rank 1 failed once, and the run went on after a restart
    assert kernel.value("run.output(1)") == ["[rank 1] attempt ok"]


def test_one_rank_in_the_background_runs_in_a_process_of_its_own(kernel):
    """Blocking, num_processes=1 runs in the kernel's own process; in the background its one
    rank has a process of its own (its lines in run.output(), none in the cells meanwhile)."""
    ok(kernel, "one = notebook_launcher(chatty, args=(30,), num_processes=1, block=False)")
    meanwhile = ok(kernel, "print('kernel', os.getpid())")
    assert "[rank" not in meanwhile.stdout + meanwhile.stderr
    out = ok(kernel, "print(one.wait(timeout=60), one.status, len(one.output(0)))\n"
                     "pid = lambda: os.getpid()\n"
                     "apart = notebook_launcher(pid, num_processes=1, block=False).wait(60)\n"
                     "here = notebook_launcher(pid, num_processes=1)\n"
                     "print(apart != os.getpid(), here == os.getpid())")
    assert "0 done 35" in out.stdout and "True True" in out.stdout, out.stdout


def test_block_must_be_true_or_false(kernel):
    out = kernel.run("notebook_launcher(chatty, args=(1,), num_processes=2, block='no')")
    assert out.error is not None and out.error["ename"] == "TypeError"


def test_ctrl_c_while_waiting_stops_the_waiting_not_the_run(kernel):
    ok(kernel, "run = notebook_launcher(time.sleep, args=(6,), num_processes=2, block=False)")
    msg_id = kernel.start("run.wait()")
    time.sleep(1.5)
    kernel.manager.interrupt_kernel()
    out = kernel.collect(msg_id)
    assert out.error is not None and out.error["ename"] == "KeyboardInterrupt"
    assert "stopped waiting" in out.error["evalue"] and "run.stop()" in out.error["evalue"]
    assert kernel.value("run.status") == "running"
    assert kernel.value("run.wait()") is None and kernel.value("run.status") == "done"


def test_a_breakpoint_in_a_background_rank_waits_for_run_wait_and_is_debugged_there(kernel):
    ok(kernel, """
def stops_in_pdb():
    x = 40 + int(os.environ["RANK"])
    breakpoint()
    return x + 1
run = notebook_launcher(stops_in_pdb, num_processes=2, block=False, return_all=True)""")
    other = ok(kernel, "time.sleep(3); print('other cell')")
    assert other.stdout == "other cell\n" and not other.stderr  # no prompt, no pdb text here
    assert kernel.value("run.status") == "running"  # the ranks wait at their breakpoints
    talk = converse(kernel, "result = run.wait()", ["p x", "c", "p x", "c"])
    assert talk.error is None, talk
    assert sorted(talk.prompts) == ["(Pdb) rank 0> "] * 2 + ["(Pdb) rank 1> "] * 2
    assert "40" in talk.stdout and "41" in talk.stdout  # each rank's own x, in this cell
    assert kernel.value("result") == [41, 42]
    shown = ok(kernel, "run")  # the view said where the prompt was, while nobody waited
    html = "".join(str(d["data"].get("text/html", "")) for d in shown.displays)
    assert "stopped at a breakpoint: call run.wait() to debug it" in html, html
    # debug=True: a failed rank's post-mortem, at run.wait() too; then the error
    ok(kernel, """
def fails_in_rank_1():
    lr = 0.5 + int(os.environ["RANK"])
    if lr > 1:
        raise ValueError("lr too high")
    time.sleep(30)
run = notebook_launcher(fails_in_rank_1, num_processes=2, block=False, debug=True)""")
    talk = converse(kernel, "run.wait()", ["p lr", "c"])
    assert talk.prompts == ["(Pdb) rank 1> ", "(Pdb) rank 1> "], talk
    assert "1.5" in talk.stdout
    assert talk.error is not None and talk.error["ename"] == "WorkerError"
    # run.stop() at a prompt nobody answers: every rank stops
    ok(kernel, "run = notebook_launcher(stops_in_pdb, num_processes=2, block=False)")
    deadline = time.monotonic() + 60
    while kernel.value("run.desk._asked") is None:  # a rank waits at its prompt
        assert time.monotonic() < deadline
        time.sleep(0.1)
    out = kernel.run("run.stop(); run.wait(timeout=30)")
    assert out.error is not None and out.error["ename"] == "KeyboardInterrupt"
    assert kernel.value("run.status") == "stopped"
