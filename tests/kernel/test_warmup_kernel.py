"""The warm-up in a real kernel (nbtrain/kernel/procs/warmup.py): ``import nbtrain`` makes the first
launch's imports and the forkserver ready while the kernel is idle, never holding up a cell
for more than one step; ``NBTRAIN_WARM_UP=0`` turns it off and ``nbtrain.warm_up()`` back on.
(The suite turns it off for every other kernel: tests/conftest.py.)"""

from __future__ import annotations

import time

import psutil
from kernelutil import Kernel

POLL = "from nbtrain.kernel.procs import warmup\nprint(warmup.running())"


def forkservers(kernel: Kernel) -> list[int]:
    return [child.pid for child in psutil.Process(kernel.pid).children()
            if "forkserver import main" in " ".join(child.cmdline())]


# Does the warm-up start the forkserver here (warmup.py's rule)?
SERVES = "from nbtrain.kernel.procs import warmup\nprint(warmup._forkserver_serves())"


def ask(kernel: Kernel, code: str) -> str:
    out = kernel.run(code)
    assert out.error is None, out.traceback_text
    return out.stdout.strip()


def wait_for_the_warm_up(kernel: Kernel, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while ask(kernel, POLL) == "True":
        assert time.monotonic() < deadline, "the warm-up did not end"
        time.sleep(0.1)


def test_import_warms_up_while_the_kernel_is_idle(tmp_path):
    kernel, servers = Kernel(tmp_path), []
    try:
        # Nothing happens inside the import cell: the steps begin once it has ended.
        imported = "import os, sys\nos.environ.pop('NBTRAIN_WARM_UP')\nimport nbtrain\n"
        assert ask(kernel, imported + "print('torch' in sys.modules)") == "False"
        # A cell sent at once runs between two steps: it does not wait for the warm-up.
        assert ask(kernel, POLL) == "True"
        wait_for_the_warm_up(kernel)
        needed = ["torch._dynamo", "nbtrain.rank.worker", "nbtrain.kernel.entry"]
        imports = ask(kernel, f"print(all(name in sys.modules for name in {needed!r}))")
        assert imports == "True", "the warm-up did not import what a first launch needs"
        # The forkserver only where launches use it (CUDA, torch_xla); on a CPU machine they
        # fork, and the first warm ranks start it (issue 44: ~290 MB otherwise for nothing).
        serves = ask(kernel, SERVES) == "True"
        servers = forkservers(kernel)
        assert len(servers) == (1 if serves else 0), "the warm-up's forkserver: wrong rule"
        assert ask(kernel, "print(nbtrain.notebook_launcher(lambda: 'ran', num_processes=2, "
                           "progress='off'))") == "ran"
        assert forkservers(kernel) == servers, "a default launch started a forkserver"
        out = ask(kernel, "ranks = nbtrain.start_ranks(2, progress='off')\n"
                          "print(ranks.pull('1 + 1'))\nranks.stop()")
        assert out == "[2, 2]" and len(forkservers(kernel)) == 1
        assert not servers or forkservers(kernel) == servers, "the warm forkserver was not used"
        servers = forkservers(kernel)
    finally:
        kernel.shutdown()
    deadline = time.monotonic() + 15
    while any(alive(pid) for pid in servers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in servers), "the forkserver outlived its kernel"


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_launch_right_after_the_import_imports_torch_dynamo_once_for_every_launch(tmp_path):
    # A launch before the warm-up's last step ("Run All"; here in the import cell itself, so
    # that it surely comes first): the kernel imports torch._dynamo before it forks, so its
    # ranks inherit it, and so do the next launch's (benchmarks/runall.py: leaving it to the
    # ranks made each launch pay it again).
    kernel = Kernel(tmp_path)
    try:
        launch = "print(nbtrain.notebook_launcher(train, num_processes=2, progress='off'))"
        first = ask(kernel, (
            "import os, sys\nos.environ.pop('NBTRAIN_WARM_UP')\nimport nbtrain, torch\n"
            "def train():\n"
            "    inherited = 'torch._dynamo' in sys.modules\n"
            "    torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1).step()\n"
            "    return inherited\n"
        ) + launch)
        assert first == "True"
        assert ask(kernel, launch) == "True"
    finally:
        kernel.shutdown()


def test_warm_up_off_starts_nothing_until_asked(tmp_path):
    kernel = Kernel(tmp_path)  # NBTRAIN_WARM_UP=0, as the suite sets it
    try:
        ask(kernel, "import sys, time, nbtrain")
        idle = ask(kernel, "time.sleep(1)\n" + POLL + "\nprint('torch' in sys.modules)")
        assert idle.split() == ["False", "False"] and forkservers(kernel) == []
        ask(kernel, "nbtrain.warm_up()")  # asked for: it runs even so
        wait_for_the_warm_up(kernel)
        assert ask(kernel, "print('torch._dynamo' in sys.modules)") == "True"
        assert len(forkservers(kernel)) == (1 if ask(kernel, SERVES) == "True" else 0)
    finally:
        kernel.shutdown()


def test_a_launch_sent_while_a_step_runs_says_so_at_once_then_shows_its_view(tmp_path):
    # A long step of the warm-up (a module that takes 4 s to import, put first) is under way
    # when a launch cell starts: the kernel's loop is free (the step runs in the warm-up's
    # thread), so within ~0.5 s the cell says what it waits for; the line goes once the step
    # is done, and the launch's own view follows. Before: the cell stayed empty for the step.
    (tmp_path / "slow_warm_step.py").write_text("import time\ntime.sleep(4)\n")
    kernel = Kernel(tmp_path)
    try:
        ask(kernel, (
            "import os, sys\nos.environ.pop('NBTRAIN_WARM_UP')\n"
            f"sys.path.insert(0, {str(tmp_path)!r})\n"
            "import nbtrain\nfrom nbtrain.kernel.procs import warmup\n"
            "warmup._steps.appendleft('slow_warm_step')\n"
        ))
        time.sleep(1.0)  # the slow step is under way
        client = kernel.client
        cell = client.execute("print(nbtrain.notebook_launcher(lambda: 'ran', num_processes=2))")
        began, said_at, said, cleared, later, stdout = None, None, "", False, [], ""
        deadline = time.monotonic() + 120
        while True:
            assert time.monotonic() < deadline
            msg = client.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") != cell:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status" and content["execution_state"] == "busy":
                began = time.monotonic()
            elif kind == "status":
                break
            elif kind in ("display_data", "update_display_data") and said_at is None:
                said_at, said = time.monotonic(), str(content["data"].get("text/plain"))
            elif kind == "clear_output":
                cleared = True
            elif kind in ("display_data", "comm_open") and cleared:
                later.append(kind)
            elif kind == "stream" and content["name"] == "stdout":
                stdout += content["text"]
        assert began is not None and said_at is not None
        assert said_at - began < 1.0, f"the cell stayed empty for {said_at - began:.1f}s"
        assert "waiting for the warm-up to finish importing slow_warm_step" in said, said
        assert cleared and later, "the line did not give way to the launch's view"
        assert stdout.strip() == "ran"
    finally:
        kernel.shutdown()
