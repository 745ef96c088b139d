"""Test "nodes": separate Python processes each running notebook_launcher(num_nodes=...)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).parent
NODE_SCRIPT = HERE / "node.py"


def free_port() -> int:
    """A port the OS just handed out (bound to port 0, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Node:
    rank: int
    process: subprocess.Popen
    result_path: Path
    out_path: Path
    err_path: Path

    def wait(self, timeout: float) -> list[dict]:
        self.process.wait(timeout=timeout)
        return json.loads(self.result_path.read_text())

    @property
    def stdout(self) -> str:
        return self.out_path.read_text()

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def describe(self) -> str:
        return f"--- node {self.rank} stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"


class Cluster:
    """Starts nodes; kills whatever is still running when the test ends."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.nodes: list[Node] = []

    def start(
        self,
        node_rank: int,
        specs: list[dict],
        *,
        prefix: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> Node:
        tag = f"node{node_rank}-{len(self.nodes)}"
        result = self.tmp_path / f"{tag}.json"
        out, err = self.tmp_path / f"{tag}.out", self.tmp_path / f"{tag}.err"
        command = [
            *(prefix or []),
            sys.executable,
            str(NODE_SCRIPT),
            json.dumps(specs),
            str(result),
        ]
        child_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        with open(out, "w") as stdout, open(err, "w") as stderr:
            process = subprocess.Popen(
                command, stdout=stdout, stderr=stderr, cwd=HERE, env=child_env
            )
        node = Node(node_rank, process, result, out, err)
        self.nodes.append(node)
        return node

    def wait_all(self, timeout: float) -> list[list[dict]]:
        deadline = time.monotonic() + timeout
        results = []
        for node in self.nodes:
            try:
                results.append(node.wait(max(1.0, deadline - time.monotonic())))
            except (subprocess.TimeoutExpired, FileNotFoundError, json.JSONDecodeError):
                pytest.fail("a node did not finish cleanly:\n" + self.describe())
        return results

    def describe(self) -> str:
        return "\n".join(node.describe() for node in self.nodes)

    def close(self) -> None:
        for node in self.nodes:
            if node.process.poll() is None:
                node.process.kill()
                node.process.wait()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    nodes = Cluster(tmp_path)
    try:
        yield nodes
    finally:
        nodes.close()


@pytest.fixture
def endpoint() -> str:
    return f"127.0.0.1:{free_port()}"


def launch(
    function: str,
    endpoint: str,
    node_rank: int,
    *,
    args: tuple = (),
    num_nodes: int = 2,
    num_processes: int = 2,
    **keywords: object,
) -> dict:
    """One launch spec for node.py."""
    options = {
        "num_processes": num_processes,
        "num_nodes": num_nodes,
        "node_rank": node_rank,
        "rdzv_endpoint": endpoint,
        "progress": "text",
        "return_all": True,
        **keywords,
    }
    return {"function": function, "args": list(args), "launch": options}


def wait_for_text(node: Node, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in node.stderr or text in node.stdout:
            return
        if node.process.poll() is not None:
            break
        time.sleep(0.2)
    pytest.fail(f"node {node.rank} never printed {text!r}:\n{node.describe()}")
