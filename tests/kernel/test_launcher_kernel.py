"""The launcher inside a real Jupyter kernel: where the product lives."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from kernelutil import running_kernel

pytestmark = pytest.mark.timeout(300)

SETUP = """
import os, sys, signal, time, torch
import torch.distributed as dist
from nbtrain import Accelerator, notebook_launcher, WorkerError
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    with running_kernel(tmp_path_factory.mktemp("kernelspec"), SETUP) as k:
        yield k


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_notebook_defined_code_returns_results(kernel, method):
    out = kernel.run(f"""
class Scaler:
    def __init__(self, k): self.k = k
    def __call__(self, t): return t * self.k

def train(scaler):
    dist.init_process_group("gloo")
    t = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return scaler(t)

result = notebook_launcher(train, args=(Scaler(10),), num_processes=2, start_method="{method}",
                           return_all=True, progress="text")
""")
    assert out.error is None, out.traceback_text
    assert kernel.value("[float(t) for t in result]") == [30.0, 30.0]


def test_root_cause_while_the_peer_waits_in_all_reduce(kernel):
    out = kernel.run("""
def train():
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        time.sleep(0.3)
        raise ValueError("boom on rank 1")
    t = torch.ones(1)
    dist.all_reduce(t)

notebook_launcher(train, num_processes=2, progress="text")
""")
    assert out.error is not None
    assert out.error["ename"] == "WorkerError"
    assert "rank 1" in out.error["evalue"] and "boom on rank 1" in out.error["evalue"]
    assert "rank 0 failed" not in out.error["evalue"]
    # The rank's own traceback is shown in the cell, pointing at the user's line.
    assert 'raise ValueError("boom on rank 1")' in out.traceback_text
    assert kernel.live_children() == []


@pytest.mark.parametrize(
    ("statement", "expected"),
    [
        ("os._exit(3)", "exited with code 3"),
        ("os.kill(os.getpid(), signal.SIGKILL)", "SIGKILL"),
        ("import ctypes; ctypes.string_at(0)", "SIGSEGV"),
    ],
)
def test_hard_exits_and_signals(kernel, statement, expected):
    out = kernel.run(f"""
def train():
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        {statement}
    dist.barrier()

try:
    notebook_launcher(train, num_processes=2, progress="off")
except WorkerError as e:
    caught = (e.rank, e.exitcode, e.signal, str(e))
""")
    assert out.error is None, out.traceback_text
    rank, _exitcode, _signal_name, text = kernel.value("caught")
    assert rank == 1 and expected in text
    assert kernel.live_children() == []


def test_interrupt_stops_every_rank_and_relaunch_works(kernel):
    msg_id = kernel.start("""
def train():
    print("rank started", flush=True)
    time.sleep(600)

notebook_launcher(train, num_processes=2, progress="text")
""")
    kernel.collect(msg_id, timeout=60, until="rank started")
    assert len(kernel.live_children()) >= 2
    time.sleep(0.5)
    kernel.manager.interrupt_kernel()
    out = kernel.collect(msg_id, timeout=60)
    assert out.error is not None and out.error["ename"] == "KeyboardInterrupt"
    deadline = time.monotonic() + 10
    while kernel.live_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert kernel.live_children() == []
    again = kernel.run('print(notebook_launcher(lambda: "again", num_processes=2, progress="off"))')
    assert again.error is None and "again" in again.stdout


def test_whole_prefixed_lines_without_interleaving(kernel):
    out = kernel.run("""
def chatter():
    r = int(os.environ["RANK"])
    for i in range(200):
        print(f"r{r}-{i:03d}-" + "y" * 100)
    return r

notebook_launcher(chatter, num_processes=2, progress="off")
""")
    assert out.error is None, out.traceback_text
    lines = out.stdout.splitlines()
    for rank in (0, 1):
        mine = [line for line in lines if line.startswith(f"[rank {rank}] r{rank}-")]
        assert len(mine) == 200
        assert all(line.endswith("y" * 100) for line in mine)
    assert all(line.startswith("[rank ") or line.startswith("Done") for line in lines if line)


def test_relaunch_loop_does_not_grow_the_kernel(kernel):
    out = kernel.run(
        """
import psutil, sys, threading
sys.path.insert(0, TESTS_DIR)
from procguard import ProcessWatch
me = psutil.Process()
watch = ProcessWatch()  # forkserver ranks count, the kernel's forkserver itself not

def work(kind):
    if kind == "fail" and os.environ["RANK"] == "1":
        raise RuntimeError("planned")
    if kind == "hang":
        time.sleep(600)
    return kind

def snapshot():
    return len(watch.alive()), me.num_fds(), threading.active_count()

notebook_launcher(work, ("ok",), num_processes=2, progress="off")
from nbtrain.kernel.procs import warmup
warmup.finish()  # (where it runs: the forkserver it starts holds fds)
before = snapshot()
for i in range(5):
    assert notebook_launcher(work, ("ok",), num_processes=2, progress="off") == "ok"
    try:
        notebook_launcher(work, ("fail",), num_processes=2, progress="off")
    except WorkerError:
        pass
    try:
        notebook_launcher(work, ("hang",), num_processes=2, progress="off", timeout=0.5)
    except TimeoutError:
        pass
after = snapshot()
""".replace("TESTS_DIR", repr(str(Path(__file__).resolve().parent.parent))),
        timeout=240,
    )
    assert out.error is None, out.traceback_text
    before, after = kernel.value("before"), kernel.value("after")
    # (not grown: with the warm-up's forkserver in the kernel, one fd open at `before` is
    # closed during the loop; not yet understood, see issue 34's notes)
    assert all(a <= b for a, b in zip(after, before, strict=True)), (
        f"(children, fds, threads) grew from {before} to {after}"
    )


def test_single_process_runs_inside_the_kernel(kernel):
    out = kernel.run("""
pid_inside = notebook_launcher(lambda: os.getpid(), num_processes=1, progress="off")
""")
    assert out.error is None, out.traceback_text
    assert kernel.value("pid_inside == os.getpid()") is True


def _nbtrain_frames(traceback_text: str) -> list[str]:
    plain = re.sub(r"\x1b\[[0-9;]*m", "", traceback_text)
    return [line for line in plain.splitlines() if "/nbtrain/" in line or "skipping hidden" in line]


def test_the_cell_shows_the_users_frames_for_a_failure_and_a_timeout(kernel):
    failed = kernel.run("""
def fails():
    if os.environ["RANK"] == "1":
        raise ValueError("boom in user code")
notebook_launcher(fails, num_processes=2, progress="off")
""")
    assert failed.error["ename"] == "WorkerError"
    text = re.sub(r"\x1b\[[0-9;]*m", "", failed.traceback_text)
    assert 'raise ValueError("boom in user code")' in text
    assert _nbtrain_frames(failed.traceback_text) == []
    # The rank's frames are named as the notebook names its cells, under one header naming
    # the rank (not a second, empty "RemoteTraceback").
    assert f"Cell In[{failed.execution_count}], line 3, in fails" in text, text
    assert "ValueError in rank 1" in text
    assert "RemoteTraceback" not in text and "ipykernel_" not in text
    timed_out = kernel.run("""
def hangs():
    accelerator = Accelerator()
    if accelerator.is_main_process:
        time.sleep(600)
    accelerator.wait_for_everyone()
notebook_launcher(hangs, num_processes=2, progress="off", timeout=5)
""")
    assert timed_out.error["ename"] == "TimeoutError"
    assert _nbtrain_frames(timed_out.traceback_text) == []
    text = re.sub(r"\x1b\[[0-9;]*m", "", timed_out.traceback_text)
    assert "notebook_launcher(hangs" in text
    # Where each rank was: the user's lines, and the nbtrain call waited in (not its insides).
    cell = f"Cell In[{timed_out.execution_count}]"
    assert f"rank 0 was in {cell}, line 4 in hangs" in text
    assert (
        f"rank 1 was waiting in wait_for_everyone(), called from {cell}, line 5 in hangs" in text
    )
    assert "nbtrain/" not in text and "ipykernel_" not in text


def test_an_interrupt_shows_the_cell_line_and_one_line_saying_every_rank_stopped(kernel):
    msg_id = kernel.start("""
def sleeper():
    print("rank started", flush=True)
    time.sleep(600)
notebook_launcher(sleeper, num_processes=2, progress="off")
""")
    kernel.collect(msg_id, timeout=60, until="rank started")
    time.sleep(0.5)
    kernel.manager.interrupt_kernel()
    out = kernel.collect(msg_id, timeout=60)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out.traceback_text)
    assert out.error["ename"] == "KeyboardInterrupt"
    assert _nbtrain_frames(out.traceback_text) == []
    assert "multiprocessing" not in plain and "selectors" not in plain
    assert plain.rstrip().endswith("KeyboardInterrupt: every rank was stopped")


def test_exceptions_that_never_went_through_nbtrain_keep_their_traceback(kernel):
    out = kernel.run("""
def plain():
    raise TimeoutError("not ours")
plain()
""")
    plain_text = re.sub(r"\x1b\[[0-9;]*m", "", out.traceback_text)
    assert out.error["ename"] == "TimeoutError" and "in plain" in plain_text


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_big_notebook_global_is_shared_not_copied(kernel, method):
    """A 128 MiB tensor from one cell, read by the function of the next: each rank's private
    memory exceeds a small global's launch by at most 64 MiB; a notebook class comes back as
    the kernel's own class; nothing stays in /dev/shm."""
    out = kernel.run(f"""
import glob, psutil
big, small = torch.ones(128 * 2**20 // 4), torch.ones(2**20)

class Box:
    def __init__(self, value): self.value = value

def measure(data):
    dist.init_process_group("gloo")
    total = float(data.sum())
    dist.barrier()
    uss = psutil.Process().memory_full_info().uss
    dist.destroy_process_group()
    return uss, Box(total)

def read_big(): return measure(big)
def read_small(): return measure(small)

run = dict(num_processes=2, start_method="{method}", return_all=True, progress="off")
base, measured = notebook_launcher(read_small, **run), notebook_launcher(read_big, **run)
growth = max(m[0] - b[0] for m, b in zip(measured, base)) // 2**20
same_class = all(isinstance(box, Box) for _, box in measured)
totals = [box.value for _, box in measured]
left = glob.glob(f"/dev/shm/nbtrain_{{os.getpid()}}_*")
del big
""")
    assert out.error is None, out.traceback_text
    assert kernel.value("totals") == [128 * 2**20 / 4] * 2
    assert kernel.value("growth") <= 64
    assert kernel.value("same_class") is True
    assert kernel.value("left") == []


def test_the_where_button_works_while_the_cell_is_busy(kernel):
    # Rank 0 waits in an all_reduce that rank 1 joins only after a while. A click on the live
    # dashboard's "where?" button, sent as a frontend sends it while the cell is busy, shows
    # where each rank is in that cell before the launch ends; a cell queued meanwhile runs
    # after it, as without the button. A page reloaded meanwhile asks for the widgets' state
    # (ipywidgets' control comm): answered while the cell is busy too, with the dashboard's;
    # from then on the dashboard copies the cell's lines (the where? picture too) into a widget
    # that page draws, and at the end keeps its final view there (display/reloaded.py).
    client = kernel.client
    cell = client.execute("""
def late_peer():
    dist.init_process_group("gloo")
    print("ready", flush=True)
    if dist.get_rank() == 1:
        time.sleep(6)
    dist.all_reduce(torch.ones(1))
    dist.destroy_process_group()
    return "joined"

print(notebook_launcher(late_peer, num_processes=2, progress="widgets", hang_after=None))
""")
    button, stdout, stderr, clicked_at = None, "", "", None
    queued, shown_early, states, control = None, None, None, "reloaded-page-control"
    html_values, closed = [], set()
    deadline = time.monotonic() + 120
    while True:
        assert time.monotonic() < deadline, stdout + stderr
        msg = client.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != cell:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "comm_open":
            state = content["data"].get("state", {})
            if state.get("_model_name") == "ButtonModel" and state.get("description") == "where?":
                button = content["comm_id"]
        elif kind == "comm_msg" and content["comm_id"] == control:
            assert content["data"]["method"] == "update_states", content
            states = (content["data"]["states"], "joined" not in stdout)
        if kind in ("comm_open", "comm_msg") and "value" in content["data"].get("state", {}):
            html_values.append(str(content["data"]["state"]["value"]))
        if kind == "comm_close":
            closed.add(content["comm_id"])
        elif kind == "stream":
            if content["name"] == "stdout":
                stdout += content["text"]
            else:
                stderr += content["text"]
        elif kind == "status" and content["execution_state"] == "idle":
            break
        if button and clicked_at is None and stdout.count("ready") == 2:
            time.sleep(1.0)  # rank 0 is inside the all_reduce by now
            click = {"method": "custom", "content": {"event": "click"}}
            client.shell_channel.send(
                client.session.msg("comm_msg", {"comm_id": button, "data": click})
            )
            queued = client.execute("print('queued cell ran')")
            for kind, content, metadata in (  # as a reloaded page's widget manager asks
                ("comm_open", {"target_name": "jupyter.widget.control", "data": {}},
                 {"version": "1.0.0"}),
                ("comm_msg", {"data": {"method": "request_states"}}, {}),
                ("comm_close", {"data": {}}, {}),
            ):
                client.shell_channel.send(client.session.msg(
                    kind, {"comm_id": control, **content}, metadata=metadata))
            clicked_at = time.monotonic()
        if shown_early is None and "[nbtrain] where each rank is:" in stderr:
            shown_early = "joined" not in stdout  # while the launch still ran
    assert button is not None, "no where? button in the live dashboard"
    assert "[nbtrain] where each rank is:" in stderr, stderr
    assert shown_early, "shown only once the launch had ended"
    assert "rank 0 waits in all_reduce; rank 1 has not entered it" in stderr, stderr
    assert "in late_peer" in stderr
    assert "joined" in stdout
    assert states is not None, "the widgets' state request was not answered"
    assert button in states[0] and states[1], "not answered while the launch ran"
    copies = [v for v in html_values if "nbtrain-run-output" in v]
    assert any("where each rank is:" in v and "[rank 0] ready" in v for v in copies), copies
    assert "Done in" in copies[-1], copies[-1]  # the final view, kept for that page
    boxes = [i for i, s in states[0].items() if s["state"].get("_model_name") == "VBoxModel"]
    assert len(boxes) == 1, states[0]
    (box,) = boxes
    assert box not in closed, "the dashboard's box was closed: the reloaded page loses it"
    assert queued is not None
    after = kernel.collect(queued)
    assert after.stdout.strip() == "queued cell ran", after


def test_cluster_ray_without_a_connection_speaks_of_the_kernel_and_imports_no_ray(kernel):
    """The same check as in a script (tests/unit/test_ray_connection.py), in a notebook's words."""
    out = kernel.run('notebook_launcher(lambda: 1, num_processes=2, cluster="ray")')
    assert out.error is not None and out.error["ename"] == "RuntimeError", out
    message = out.error["evalue"]
    assert message.startswith("cluster='ray' found no Ray connection in this kernel (call it "
                              "in a cell before the launch)"), message
    assert "script" not in message
    assert kernel.value("'ray' in sys.modules") is False


def test_a_hang_at_the_accelerators_barrier_names_and_marks_the_late_rank(kernel):
    # Rank 1 sleeps before acc.wait_for_everyone(): the Accelerator's own transport (a polled
    # handshake, no torch collective on the stack) is recognised as the barrier rank 0 waits
    # in, the picture names rank 1, and rank 1's live row says the others wait for it.
    cell = kernel.start("""
def late_barrier():
    acc = Accelerator()
    if acc.process_index == 1:
        time.sleep(9)
    acc.wait_for_everyone()
    return "joined"

print(notebook_launcher(late_barrier, num_processes=2, progress="widgets", hang_after=3))
""")
    out = kernel.collect(cell, timeout=120)
    stdout, stderr, updates = out.stdout, out.stderr, out.widget_states
    assert "no rank has made progress for 3s (hang_after=3)" in stderr, stderr
    assert "rank 0 is waiting in wait_for_everyone(), called from Cell In[" in stderr, stderr
    assert "rank 0 waits in wait_for_everyone; rank 1 has not entered it" in stderr, stderr
    assert "No rank waits in a collective" not in stderr, stderr
    assert "joined" in stdout
    values = [str(state.get("value", "")) for state in updates]
    held = [v for v in values if "the others wait for it (Cell In[" in v]
    assert held and "#ef6c00" in held[0], values
    assert any("waiting in wait_for_everyone() for rank 1" in v for v in values), values
    held_rows = [v for v in values if "the others wait for it" in v and "nbtrain-row" in v]
    assert held_rows and 'data-style="warning"' in held_rows[0], values  # its bar orange


def test_an_argument_mistake_shows_its_message_under_the_cell_without_nbtrains_frames(kernel):
    # args that do not fit, resume=True with no checkpoint: nbtrain's checks say what is wrong;
    # the frames of config.py / stopping.py above that say nothing to the user, and are left
    # out as a rank failure's are. A TypeError of the user's own keeps its whole traceback.
    for code, message in [
        ("def two(a, b): pass\nnotebook_launcher(two, args=(1,), num_processes=2)",
         "do not fit two(a, b)"),
        ("import tempfile\nnotebook_launcher(lambda: 1, num_processes=2, resume=True, "
         "project_dir=tempfile.mkdtemp())", "resume=True: there is no complete checkpoint"),
    ]:
        out = kernel.run(code)
        assert out.error is not None and message in out.error["evalue"], out
        text = re.sub(r"\x1b\[[0-9;]*m", "", out.traceback_text)
        assert "Cell In[" in text and message in text, text
        assert "nbtrain" not in text.replace("from nbtrain", ""), text
    own = kernel.run("def mine():\n    raise TypeError('mine')\nmine()")
    assert "in mine" in re.sub(r"\x1b\[[0-9;]*m", "", own.traceback_text)
