"""breakpoint() in a rank, in a real Jupyter kernel: the (Pdb) prompt is the kernel's stdin
request, answered here the way a frontend answers it (client.input)."""

from __future__ import annotations

import json
import queue
import re
import time
from dataclasses import dataclass, field

import pytest
from kernelutil import Kernel, running_kernel

pytestmark = pytest.mark.timeout(300)

SETUP = """
import os, time, torch
import torch, torch.distributed as dist
import nbtrain
from nbtrain import notebook_launcher
%load_ext nbtrain
"""


@dataclass
class Conversation:
    prompts: list[str] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    error: dict | None = None
    # stdout as it was when each prompt came (what the human saw before typing)
    seen: list[str] = field(default_factory=list)
    view: str = ""  # what the widget view was sent (its widgets' states), all of it
    views: list[str] = field(default_factory=list)  # ... when each prompt came


def converse(kernel: Kernel, code: str, answers: list[str], timeout: float = 120) -> Conversation:
    """Run ``code`` with stdin allowed; answer each input request with the next answer."""
    client = kernel.client
    msg_id = client.execute(code, allow_stdin=True)
    talk = Conversation()
    pending = list(answers)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            request = client.get_stdin_msg(timeout=0.05)
        except queue.Empty:
            pass
        else:
            if request["msg_type"] == "input_request":
                time.sleep(0.2)  # let iopub catch up: what the human saw
                _drain_iopub(client, msg_id, talk)
                talk.prompts.append(request["content"]["prompt"])
                talk.seen.append(talk.stdout)
                talk.views.append(talk.view)
                client.input(pending.pop(0) if pending else "c")
        if _drain_iopub(client, msg_id, talk):
            return talk
    raise TimeoutError(f"kernel still busy after {timeout}s: {talk}")


def _drain_iopub(client, msg_id: str, talk: Conversation) -> bool:
    """Read what iopub holds now; True once the execution is over (idle)."""
    while True:
        try:
            msg = client.get_iopub_msg(timeout=0.01)
        except queue.Empty:
            return False
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            text = re.sub(r"\x1b\[[0-9;]*m", "", content["text"])  # IPython's pdb colours
            if content["name"] == "stdout":
                talk.stdout += text
            else:
                talk.stderr += text
        elif kind == "error":
            talk.error = content
        elif kind == "comm_msg":
            talk.view += json.dumps(content.get("data", {}).get("state", {}))
        elif kind == "status" and content["execution_state"] == "idle":
            return True


def assert_users_frames_only(where: str, outermost: str, *, named: bool = True) -> None:
    """pdb's ``where`` output: its first frame is ``outermost``, and no frame above it; the
    cell's frames named as the notebook names them ('Cell In[3], line 4, in f()')."""
    places = ("Cell In[", "/", "<")
    frames = [line for line in where.splitlines() if line.lstrip("> ").startswith(places)]
    assert frames and frames[0].lstrip("> ").endswith(outermost), where
    assert not named or all(frame.lstrip("> ").startswith("Cell In[") for frame in frames), where
    for other in ("multiprocessing/", "nbtrain/", "ipykernel", "IPython/", "<string>"):
        assert other not in where, (other, where)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    with running_kernel(tmp_path_factory.mktemp("kernelspec"), SETUP) as k:
        yield k


def test_breakpoint_in_rank_1_while_rank_0_waits_in_all_reduce(kernel):
    talk = converse(
        kernel,
        """
def train():
    dist.init_process_group("gloo")
    x = torch.tensor([dist.get_rank() + 1.0])
    if dist.get_rank() == 1:
        y = 41
        breakpoint()
        x = x * 2
    dist.all_reduce(x)
    return float(x)

result = notebook_launcher(train, num_processes=2, progress="widgets", return_all=True,
                           timeout=8)
""",
        ["p y + 1", "p x", "n", "p x", "w", "up", "c"],
    )
    assert talk.error is None, talk
    assert talk.prompts == ["(Pdb) rank 1> "] * 7
    # Where it stopped, then the answers, each before the next prompt.
    assert re.search(r"-+> 7 +x = x \* 2", talk.seen[0])
    # ... the cell's code named as the kernel's tracebacks name it, not by its temporary file
    assert re.search(r"^> Cell In\[\d+\], line 7, in train\(\)$", talk.seen[0], re.M), talk.seen[0]
    assert "ipykernel_" not in talk.stdout, talk.stdout
    assert "42" in talk.seen[1]
    assert "tensor([2.])" in talk.seen[2]
    assert "tensor([4.])" in talk.seen[4]
    # where: the user's frames only, from the launched function down (not multiprocessing's,
    # nbtrain's or the kernel's frames above it, forked with the rank); up stops there.
    assert_users_frames_only(talk.seen[5][len(talk.seen[4]):], "train()")
    assert "Oldest frame" in talk.seen[6][len(talk.seen[5]):]
    assert "paused in pdb (line 7)" in talk.views[0], talk.views[0]
    # The run went on: rank 0's all_reduce got rank 1's doubled value. The prompts took
    # longer than no time at all, and the 8 s timeout did not count them (see below).
    assert kernel.value("result") == [5.0, 5.0]
    assert kernel.live_children() == []


def test_the_timeout_does_not_count_a_human_at_the_prompt(kernel):
    msg_id = kernel.client.execute(
        """
def train():
    if int(os.environ["RANK"]) == 1:
        breakpoint()
    return 1

result = notebook_launcher(train, num_processes=2, progress="text", timeout=3)
""",
        allow_stdin=True,
    )
    request = kernel.client.get_stdin_msg(timeout=60)
    assert request["content"]["prompt"] == "(Pdb) rank 1> "
    time.sleep(5)  # the human reads the code: longer than the timeout
    kernel.client.input("c")
    out = kernel.collect(msg_id)
    assert out.error is None, out.traceback_text


def test_two_ranks_hit_breakpoints_in_turn(kernel):
    talk = converse(
        kernel,
        """
def train():
    rank = int(os.environ["RANK"])
    mine = f"value of rank {rank}"
    breakpoint()
    return rank

notebook_launcher(train, num_processes=2, progress="text")
""",
        ["p mine", "c", "p mine", "c"],
    )
    assert talk.error is None, talk
    first, second = talk.prompts[0], talk.prompts[2]
    assert {first, second} == {"(Pdb) rank 0> ", "(Pdb) rank 1> "}
    assert talk.prompts == [first, first, second, second]
    holder = int(first.split()[2].rstrip(">"))
    # The holder's answers are its own; the other rank waited its turn, and was told so.
    assert f"value of rank {holder}" in talk.seen[1]
    assert f"value of rank {1 - holder}" in talk.seen[3]
    assert "waiting their turn: rank" in talk.seen[0] + talk.seen[1]


def test_q_ends_the_debugging_and_the_rank_continues(kernel):
    talk = converse(
        kernel,
        """
def train():
    for i in range(3):
        breakpoint()
    return "done"

result = notebook_launcher(train, num_processes=2, progress="text", return_all=True)
""",
        ["q", "q"],
    )
    assert talk.error is None, talk
    assert sorted(talk.prompts) == ["(Pdb) rank 0> ", "(Pdb) rank 1> "]  # once each
    assert kernel.value("result") == ["done", "done"]


def test_without_stdin_the_rank_continues_with_a_message(kernel):
    code = """
def train():
    breakpoint()
    return "went on"

result = notebook_launcher(train, num_processes=2, progress="text", return_all=True)
"""
    out = kernel.collect(kernel.client.execute(code, allow_stdin=False))  # as nbclient runs it
    assert out.error is None, out.traceback_text
    text = re.sub(r"\s+", " ", out.stdout + out.stderr)
    assert text.count("stopped at breakpoint()") == 2  # each rank, never a prompt
    assert "stopped at breakpoint()" in text and "the rank continues" in text
    assert kernel.value("result") == ["went on", "went on"]


def test_breakpoint_in_a_ranks_cell(kernel):
    out = kernel.run("ranks = nbtrain.start_ranks(2, progress='text')")
    assert out.error is None, out.traceback_text
    try:
        talk = converse(
            kernel,
            """%%ranks
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
if dist.get_rank() == 1:
    breakpoint()
    t += 10
dist.all_reduce(t)
float(t)
""",
            ["p t", "c"],
        )
        assert talk.error is None, talk
        assert talk.prompts == ["(Pdb) rank 1> "] * 2
        assert "tensor([2.])" in talk.seen[1]
        assert kernel.value("ranks.pull('float(t)')") == [13.0, 13.0]
        # q in one cell does not silence the next cell's breakpoints
        talk = converse(kernel, "%%ranks 0\nbreakpoint()\nz = 1", ["q"])
        assert talk.error is None, talk
        talk = converse(kernel, "%%ranks 0\nbreakpoint()\nz = 2", ["p z", "c"])
        assert talk.prompts == ["(Pdb) rank 0> "] * 2 and "1" in talk.seen[1]
    finally:
        kernel.run("ranks.stop()")


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_the_prompt_under_other_start_methods(kernel, method):
    # (the debug pipe travels as a process argument; a spawned rank's pdb is plain pdb)
    talk = converse(
        kernel,
        f"""
def train():
    value = int(os.environ["RANK"]) * 100
    if value:
        breakpoint()
    return value

result = notebook_launcher(train, num_processes=2, progress="text", return_all=True,
                           start_method="{method}")
""",
        ["p value + 1", "w", "l", "c"],
    )
    assert talk.error is None, talk
    assert talk.prompts == ["(Pdb) rank 1> "] * 4
    assert "101" in talk.seen[1]
    # a function pickled by value keeps its cell's file name (shared/sharedmem.py's pickler)
    assert_users_frames_only(talk.seen[2][len(talk.seen[1]):], "train()")
    listing = talk.seen[3][len(talk.seen[2]):]  # and its lines, which only the kernel had
    assert "->" in listing and "breakpoint()" in listing, listing
    assert kernel.value("result") == [0, 100]


def test_interrupting_the_kernel_at_the_prompt_stops_a_one_shot_launch(kernel):
    msg_id = kernel.client.execute(
        """
def train():
    if int(os.environ["RANK"]) == 1:
        breakpoint()
    time.sleep(60)

notebook_launcher(train, num_processes=2, progress="text")
""",
        allow_stdin=True,
    )
    request = kernel.client.get_stdin_msg(timeout=60)
    assert request["content"]["prompt"] == "(Pdb) rank 1> "
    kernel.manager.interrupt_kernel()
    out = kernel.collect(msg_id, timeout=60)
    assert out.error is not None and out.error["ename"] == "KeyboardInterrupt", out
    assert kernel.live_children() == []
