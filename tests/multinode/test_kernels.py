"""Multi-node from notebooks: two real Jupyter kernels (one per "node") run the same cell.

The function is defined in the notebook (it travels by value), the live view is the widget
view, and each kernel gets its own ranks' results back.
"""

from __future__ import annotations

import json
import queue
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

KERNEL = "nbtrain-multinode-test"

CELL = """
import os, torch, torch.distributed as dist
from nbtrain import notebook_launcher

def where_am_i(scale):
    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    dist.destroy_process_group()
    return int(os.environ["RANK"]), total.item() * scale

result = notebook_launcher(where_am_i, (10,), num_processes=2, num_nodes=2,
                           node_rank=NODE_RANK, rdzv_endpoint=ENDPOINT, return_all=True)
print("RESULT", result)
"""


class Session:
    """A kernel and everything its cell sent back."""

    def __init__(self, specs: KernelSpecManager, cwd: Path) -> None:
        self.manager = KernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)
        self.manager.start_kernel(cwd=str(cwd))
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)
        self.stdout, self.comm_text, self.error = "", "", None
        self.idle = False

    def execute(self, code: str) -> None:
        self.msg_id = self.client.execute(code)

    def pump(self) -> None:
        while True:
            try:
                message = self.client.get_iopub_msg(timeout=0.05)
            except queue.Empty:
                return
            if message["parent_header"].get("msg_id") != self.msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "stream" and content["name"] == "stdout":
                self.stdout += content["text"]
            elif kind in ("comm_open", "comm_msg"):
                self.comm_text += json.dumps(content.get("data", {}))
            elif kind == "error":
                self.error = "\n".join(content["traceback"])
            elif kind == "status" and content["execution_state"] == "idle":
                self.idle = True

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[list[Session]]:
    spec_dir = tmp_path / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "nbtrain multinode test",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
    started: list[Session] = []
    try:
        for _ in range(2):
            started.append(Session(specs, tmp_path))
        yield started
    finally:
        for session in started:
            session.close()


def test_same_cell_in_two_kernels_forms_one_job(sessions: list[Session], endpoint: str):
    node0, node1 = sessions
    node0.execute(f"NODE_RANK, ENDPOINT = 0, {endpoint!r}\n" + CELL)
    deadline = time.monotonic() + 60
    while "waiting for nodes (1 of 2 joined)" not in node0.comm_text:  # the live view says so
        assert time.monotonic() < deadline and not node0.idle, (node0.stdout, node0.error)
        node0.pump()
    node1.execute(f"NODE_RANK, ENDPOINT = 1, {endpoint!r}\n" + CELL)
    deadline = time.monotonic() + 150
    while not (node0.idle and node1.idle):
        assert time.monotonic() < deadline, (node0.stdout, node1.stdout)
        node0.pump()
        node1.pump()
    assert node0.error is None and node1.error is None, (node0.error, node1.error)
    assert "RESULT [(0, 100.0), (1, 100.0)]" in node0.stdout
    assert "RESULT [(2, 100.0), (3, 100.0)]" in node1.stdout
    # Each kernel's dashboard has a row for each of its own ranks, and none for the others'.
    for session, mine, theirs in ((node0, (0, 1), (2, 3)), (node1, (2, 3), (0, 1))):
        for rank in mine:
            assert f"<b>rank {rank}</b>" in session.comm_text
        for rank in theirs:
            assert f"<b>rank {rank}</b>" not in session.comm_text

    # Re-running the cell on both kernels (same endpoint) launches again.
    for session in sessions:
        session.stdout, session.idle = "", False
        session.execute(
            "result = notebook_launcher(where_am_i, (1,), num_processes=2, "
            "num_nodes=2, node_rank=NODE_RANK, rdzv_endpoint=ENDPOINT)\n"
            "print('AGAIN', result)"
        )
    deadline = time.monotonic() + 120
    while not (node0.idle and node1.idle):
        assert time.monotonic() < deadline, (node0.stdout, node1.stdout)
        node0.pump()
        node1.pump()
    assert node0.error is None and node1.error is None, (node0.error, node1.error)
    assert "AGAIN (0, 10.0)" in node0.stdout  # rank 0's value
    assert "AGAIN (2, 10.0)" in node1.stdout  # node 1: its first rank's value


FAILING_CELL = """
import os
from nbtrain import notebook_launcher

def fail_on_rank_three():
    if os.environ["RANK"] == "3":
        raise ValueError("boom on rank 3")
    import time
    time.sleep(30)

notebook_launcher(fail_on_rank_three, num_processes=2, num_nodes=2, node_rank=NODE_RANK,
                  rdzv_endpoint=ENDPOINT, progress="off")
"""


def run_on_both(sessions: list[Session], code: str, timeout: float) -> None:
    for session in sessions:
        session.stdout, session.error, session.idle = "", None, False
        session.execute(code)
    deadline = time.monotonic() + timeout
    while not all(session.idle for session in sessions):
        assert time.monotonic() < deadline, [session.stdout for session in sessions]
        for session in sessions:
            session.pump()


def test_the_cell_runs_again_after_a_failure(sessions: list[Session], endpoint: str):
    """IPython keeps the last exception (and the frames it went through): a failed launch must
    still leave node 0's endpoint free for the next one."""
    for rank, session in enumerate(sessions):
        session.execute(f"NODE_RANK, ENDPOINT = {rank}, {endpoint!r}")
    run_on_both(sessions, FAILING_CELL, timeout=150)
    for session in sessions:
        assert session.error is not None and "boom on rank 3" in session.error
    run_on_both(sessions, CELL, timeout=150)
    node0, node1 = sessions
    assert node0.error is None and node1.error is None, (node0.error, node1.error)
    assert "RESULT [(0, 100.0), (1, 100.0)]" in node0.stdout
    assert "RESULT [(2, 100.0), (3, 100.0)]" in node1.stdout
