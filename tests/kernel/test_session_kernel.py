"""Warm ranks in a real Jupyter kernel: %%ranks cells, values per rank, errors, interrupts, and
ranks that never outlive their kernel (shutdown, restart, SIGKILL)."""

from __future__ import annotations

import os
import re
import signal
import time

import psutil
import pytest
from kernelutil import Kernel, running_kernel

pytestmark = pytest.mark.timeout(300)

SETUP = """
import os, time, torch
import nbtrain
%load_ext nbtrain
"""


def plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def texts(result) -> list[str]:
    return [d["data"].get("text/plain", "") for d in result.displays if "data" in d]


def gone(pids: list[int], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
        if not alive:
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    with running_kernel(tmp_path_factory.mktemp("kernelspec"), SETUP) as k:
        out = k.run("%%ranks\nprint('x')")  # before start_ranks: a clear error, nothing runs
        assert out.error is not None and out.error["ename"] == "SessionError"
        assert "ranks = nbtrain.start_ranks(num_processes=2)" in out.error["evalue"]
        out = k.run("ranks = nbtrain.start_ranks(2, progress='text')")
        assert out.error is None, out.traceback_text
        # (issue 33: the cell says how long the start took instead of staying empty)
        assert re.search(r"nbtrain: 2 warm ranks ready in \d+\.\ds \(", out.stdout), out.stdout
        out = k.run("%%ranks\nimport os, time, torch, torch.distributed as dist\n"
                    "dist.init_process_group('gloo')")
        assert out.error is None, out.traceback_text
        yield k


def rank_pids(kernel: Kernel) -> list[int]:
    return kernel.value("ranks.pull('os.getpid()')")  # type: ignore[return-value]


def test_a_cell_runs_on_every_rank_and_shows_each_ranks_value(kernel):
    out = kernel.run("%%ranks\nr = dist.get_rank()\nprint('hello from', r)\nr * 10 + 5")
    assert out.error is None, out.traceback_text
    assert "[rank 0] hello from 0" in out.stdout and "[rank 1] hello from 1" in out.stdout
    assert "Out[rank 0]: 5" in texts(out) and "Out[rank 1]: 15" in texts(out)
    # state persists into the next cell, and the process group with it
    out = kernel.run("%%ranks\nt = torch.tensor([r + 1.0]); dist.all_reduce(t); t.item()")
    assert "Out[rank 0]: 3.0" in texts(out) and "Out[rank 1]: 3.0" in texts(out)
    out = kernel.run("%%ranks\nx = 1;")  # a trailing ';' shows no value, as in IPython
    assert not any(t.startswith("Out[rank") for t in texts(out))


def test_a_rank_selector_runs_the_cell_on_those_ranks_only(kernel):
    kernel.run("%%ranks\nmark = 'old'")
    out = kernel.run("%%ranks 1\nmark = 'new'\nmark")
    assert [t for t in texts(out) if t.startswith("Out[")] == ["Out[rank 1]: 'new'"]
    assert kernel.value("ranks.pull('mark')") == ["old", "new"]
    out = kernel.run("%%ranks 0-1\nmark")
    assert "Out[rank 0]: 'old'" in texts(out) and "Out[rank 1]: 'new'" in texts(out)


def test_bad_selectors_are_refused_before_anything_runs(kernel):
    pids = rank_pids(kernel)
    for line, expected in [
        ("7", "there is no rank 7; the 2 warm ranks are 0-1"),
        ("0,x", "'x' is not a rank"),
        ("--timeout -1", "seconds above 0"),
    ]:
        out = kernel.run(f"%%ranks {line}\nprint('must not run')")
        assert out.error is not None and out.error["ename"] == "SessionError", line
        assert expected in out.error["evalue"]
        assert "must not run" not in out.stdout
    assert rank_pids(kernel) == pids


def test_a_failing_cell_shows_the_cells_line_and_keeps_state(kernel):
    pids = rank_pids(kernel)
    kernel.run("%%ranks\nkept = r")
    out = kernel.run("%%ranks\nvalue = 1\nif r == 1:\n    raise ValueError('bad rank')\n")
    assert out.error is not None and out.error["ename"] == "WorkerError"
    text = plain(out.traceback_text)
    # The rank's frame is the cell's line as the notebook numbers it; the kernel's frame that
    # only ran the magic (get_ipython().run_cell_magic(...)) is not shown.
    assert "raise ValueError('bad rank')" in text
    assert f"Cell In[{out.execution_count}], line 4, in <module>" in text
    assert "run_cell_magic" not in text and "RemoteTraceback" not in text
    assert "nbtrain/rank" not in text and "ipykernel_" not in text
    assert kernel.value("ranks.pull('kept')") == [0, 1]
    assert rank_pids(kernel) == pids


def test_rich_display_from_a_cell_is_labelled_by_rank(kernel):
    out = kernel.run(
        "%%ranks 0\nfrom IPython.display import HTML, display\ndisplay(HTML('<b>bold</b>'))"
    )
    assert out.error is None, out.traceback_text
    html = [d["data"].get("text/html", "") for d in out.displays if "data" in d]
    assert any("<b>bold</b>" in h and "rank 0" in h for h in html)


def test_interrupt_raises_in_every_rank_and_keeps_state(kernel):
    pids = rank_pids(kernel)
    kernel.run("%%ranks\nbefore = r + 1")
    msg_id = kernel.start("%%ranks\nprint('looping', flush=True)\nwhile True: time.sleep(0.01)")
    kernel.collect(msg_id, timeout=60, until="looping")
    time.sleep(1.0)  # the view shows from 0.5 s on (DeferredView)
    kernel.manager.interrupt_kernel()
    out = kernel.collect(msg_id, timeout=60)
    assert out.error is not None and out.error["ename"] == "KeyboardInterrupt"
    assert "state is kept" in out.error["evalue"]
    # The view says the same: interrupted, state kept; no rank shown as failed.
    shown = plain(out.stdout + out.stderr)
    assert "every rank is idle again, its state kept" in shown, shown
    assert "failed" not in shown and "every rank was stopped" not in shown, shown
    assert kernel.value("ranks.pull('before')") == [1, 2]
    assert rank_pids(kernel) == pids


def test_a_cell_timeout_keeps_state_when_the_ranks_return(kernel):
    out = kernel.run("%%ranks --timeout 1\ntime.sleep(30)")
    assert out.error is not None and out.error["ename"] == "TimeoutError"
    assert "state kept" in out.error["evalue"]
    assert kernel.value("ranks.pull('before')") == [1, 2]


def forkservers(kernel: Kernel) -> list[int]:
    return [child.pid for child in psutil.Process(kernel.pid).children()
            if "forkserver import main" in " ".join(child.cmdline())]


def test_ranks_end_with_the_kernel_even_on_sigkill(tmp_path):
    kernel = Kernel(tmp_path)
    try:
        # The warm-up (kernel/procs/warmup.py; the suite turns it off by default) has the kernel
        # import what a first launch needs, and starts the forkserver where launches use it
        # (CUDA, torch_xla; else start_ranks starts it); both end with the kernel.
        kernel.run("import os, sys\nos.environ.pop('NBTRAIN_WARM_UP')\nimport nbtrain")
        out = kernel.run("from nbtrain.kernel.procs import warmup\nwarmup.finish()\n"
                         "print('torch._dynamo' in sys.modules, warmup._forkserver_serves())")
        assert out.stdout.split()[0] == "True", out
        warm = forkservers(kernel)
        assert len(warm) == (1 if out.stdout.split()[1] == "True" else 0), out
        out = kernel.run("ranks = nbtrain.start_ranks(2, progress='off')")
        assert out.error is None, out.traceback_text
        servers = forkservers(kernel)
        assert len(servers) == 1 and (not warm or servers == warm), "start_ranks: no forkserver"
        pids = kernel.value("ranks.pull('__import__(\"os\").getpid()')")
        assert len(pids) == 2
        os.kill(kernel.pid, signal.SIGKILL)
        assert gone(pids), "warm ranks outlived their SIGKILLed kernel"
        assert gone(servers), "the forkserver outlived its SIGKILLed kernel"
    finally:
        kernel.shutdown()


def test_ranks_end_on_kernel_restart_and_shutdown(tmp_path):
    kernel = Kernel(tmp_path)
    try:
        kernel.run("import os, nbtrain\nranks = nbtrain.start_ranks(2, progress='off')")
        first = kernel.value("ranks.pull('__import__(\"os\").getpid()')")
        kernel.manager.restart_kernel(now=False)
        kernel.client.wait_for_ready(timeout=60)
        assert gone(first), "warm ranks outlived a kernel restart"
        kernel.run("import os, nbtrain\nranks = nbtrain.start_ranks(2, progress='off')")
        second = kernel.value("ranks.pull('__import__(\"os\").getpid()')")
    finally:
        kernel.shutdown()
    assert gone(second), "warm ranks outlived a kernel shutdown"


def test_the_live_view_appears_only_for_a_cell_that_runs_a_while(tmp_path):
    widget = "application/vnd.jupyter.widget-view+json"
    with running_kernel(tmp_path, "import nbtrain\nranks = nbtrain.start_ranks(2)") as kernel:
        quick = kernel.run("%%ranks\nx = 1")
        assert quick.error is None and quick.displays == []
        slow = kernel.run(
            "%%ranks\nimport time, nbtrain\nfor step in nbtrain.progress(range(30)):\n"
            "    time.sleep(0.05)\nstep"
        )
        assert slow.error is None, slow.traceback_text
        assert any(widget in d.get("data", {}) for d in slow.displays)  # the dashboard
        assert "Out[rank 0]: 29" in texts(slow) and "Out[rank 1]: 29" in texts(slow)
        again = kernel.run("%%ranks\nfor step in nbtrain.progress(range(3)): pass\nstep")
        assert "Out[rank 1]: 2" in texts(again)
        kernel.run("ranks.stop()")


def test_ranks_stuck_after_a_failure_are_restarted_and_the_cell_says_so(kernel):
    out = kernel.run(
        "%%ranks\nif dist.get_rank() == 0:\n    raise RuntimeError('rank 0 broke')\ndist.barrier()"
    )
    assert out.error is not None and out.error["ename"] == "WorkerError"
    text = plain(out.traceback_text)
    assert "rank 0 failed with RuntimeError: rank 0 broke" in text
    assert "nbtrain restarted the 2 ranks" in text and "state" in text  # said plainly
    assert "rank 1 was in" in text and "in barrier" in text  # where the stuck rank was
    assert kernel.value("ranks.pull('1 + 1')") == [2, 2]
    kernel.run("ranks.stop()")  # the new ranks are this test's (the leak guard counts them)


def test_ranks_magic_before_start_ranks_says_to_start_them(tmp_path):
    # %%ranks is known from `import nbtrain` on: before start_ranks it says what to do, not
    # IPython's bare "Cell magic `%%ranks` not found".
    from kernelutil import Kernel

    kernel = Kernel(tmp_path)
    try:
        assert kernel.run("import nbtrain").error is None
        out = kernel.run("%%ranks\nprint('hi')")
        assert out.error is not None and out.error["ename"] == "SessionError", out
        assert "start them first with ranks = nbtrain.start_ranks(" in out.error["evalue"]
        debug = kernel.run("%ranks_debug")
        assert debug.error is not None and debug.error["ename"] == "SessionError", debug
    finally:
        kernel.shutdown()
