"""Drive a real Jupyter kernel (jupyter_client) running this venv's Python."""

from __future__ import annotations

import contextlib
import json
import queue
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager
from procguard import ProcessWatch

KERNEL_NAME = "nbtrain-test"


def write_kernelspec(directory: Path) -> KernelSpecManager:
    """A kernelspec for exactly this interpreter, so a stale user-level spec cannot hijack it."""
    spec_dir = directory / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "nbtrain test kernel",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return KernelSpecManager(kernel_dirs=[str(directory)])


@dataclass
class Result:
    stdout: str = ""
    stderr: str = ""
    error: dict | None = None
    displays: list[dict] = field(default_factory=list)
    execution_count: int | None = None  # the cell's In[n]
    widget_states: list[dict] = field(default_factory=list)  # each comm_msg's state, in order
    wall: float = 0.0  # seconds from collect() to the kernel's idle

    def comm_rate(self, seconds: float | None = None) -> float:
        """Widget updates (comm_msg) the frontend got per second, over ``seconds`` (default:
        the wall time collected)."""
        return len(self.widget_states) / (seconds or self.wall)

    @property
    def traceback_text(self) -> str:
        return "\n".join(self.error["traceback"]) if self.error else ""


class Kernel:
    def __init__(self, spec_dir: Path) -> None:
        self.manager = KernelManager(
            kernel_name=KERNEL_NAME, kernel_spec_manager=write_kernelspec(spec_dir)
        )
        self.manager.start_kernel()
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)
        self._watch = ProcessWatch(self.pid)  # what the kernel has at rest: nothing

    @property
    def pid(self) -> int:
        return self.manager.provisioner.process.pid  # type: ignore[union-attr]

    def run(self, code: str, timeout: float = 120) -> Result:
        msg_id = self.client.execute(code)
        return self.collect(msg_id, timeout)

    def start(self, code: str) -> str:
        return self.client.execute(code)

    def collect(self, msg_id: str, timeout: float = 120, until: str | None = None) -> Result:
        """Gather output of one execution until the kernel is idle (or ``until`` is printed)."""
        result = Result()
        began = time.monotonic()
        deadline = began + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"kernel still busy after {timeout}s; output so far: {result}")
            try:
                msg = self.client.get_iopub_msg(timeout=min(remaining, 1.0))
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    result.stdout += content["text"]
                else:
                    result.stderr += content["text"]
                if until and until in result.stdout:
                    return result
            elif kind == "error":
                result.error = content
            elif kind == "execute_input":
                result.execution_count = content["execution_count"]
            elif kind in ("display_data", "update_display_data", "execute_result"):
                result.displays.append(content)
            elif kind == "comm_msg":
                result.widget_states.append(content["data"].get("state", {}))
            elif kind == "status" and content["execution_state"] == "idle":
                result.wall = time.monotonic() - began
                return result

    def value(self, expression: str) -> object:
        out = self.run(f"print(repr({expression}))")
        assert out.error is None, out.traceback_text
        return eval(out.stdout.strip())

    def live_children(self) -> list[psutil.Process]:
        """The kernel's live descendants and orphans of its session, except its own forkserver
        and resource tracker (its forkserver ranks count: see tests/procguard.py)."""
        return list(self._watch.alive().values())

    def shutdown(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


@contextlib.contextmanager
def running_kernel(directory: Path, setup: str) -> Iterator[Kernel]:
    """A kernel that ran ``setup`` without error; shut down afterwards (also if setup failed)."""
    kernel = Kernel(directory)
    try:
        out = kernel.run(setup)
        assert out.error is None, out.traceback_text
        yield kernel
    finally:
        kernel.shutdown()
