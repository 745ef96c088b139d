"""The channel from ranks to the kernel accepts only the launch's own ranks.

What carries events, output and results: three pipes per rank, created by the kernel for its own
child. The kernel unpickles what arrives on them (events, results, exceptions), so nothing else
may be able to write there. What a launch exposes otherwise: the TCPStore the ranks meet at.

- The kernel listens on one socket during a launch: the store, on the loopback only (TCPStore on
  its own listens on every interface: nbtrain hands it a loopback socket). Under forkserver,
  Python's forkserver listens on a Unix socket private to this user.
- The store keeps bytes and nothing unpickles what is in it: an outside process that writes a
  malicious pickle under every key it finds (and plausible others) while ranks run executes
  nothing, and the launch completes normally.
- Each rank's pipes are held by the kernel (reading) and that rank (writing) only: not by other
  ranks, the forkserver, or any other process on the machine.
- Another user cannot reach the kernel's pipes through /proc (open fails). A process of the
  *same* user can (it could equally ptrace the kernel): the channel's boundary is the user.

Multi-node is different by design: node 0's rendezvous endpoint must be reachable from the other
machines, and torch's c10d rendezvous backend (used as-is by kernel/launch/elastic/) keeps its state
in that store as a pickle, as under torchrun: keep the endpoint on a network only the cluster
can reach. (See the report for details.)
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import rankfaults
import rankprobes
from rankprobes import listening

from nbtrain import notebook_launcher

pytestmark = pytest.mark.timeout(180)

QUIET = {"progress": "off", "output": "none"}
NOBODY = 65534


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_the_store_on_the_loopback_is_the_only_socket_a_launch_opens(method):
    before = set(listening(os.getpid()))
    seen = notebook_launcher(
        rankprobes.kernel_sockets_during_launch,
        (os.getpid(),),
        num_processes=2,
        start_method=method,
        **QUIET,
    )
    opened = set(map(tuple, seen["listening"])) - before
    assert opened == {("inet", "127.0.0.1", seen["store_port"])}
    assert set(listening(os.getpid())) == before, "the store still listens after the launch"


def test_the_forkserver_socket_is_private_to_this_user():
    notebook_launcher(rankfaults.echo, ("x",), num_processes=2, start_method="forkserver", **QUIET)
    servers = [
        child for child in psutil.Process().children() if "forkserver" in " ".join(child.cmdline())
    ]
    assert len(servers) == 1
    paths = [path for kind, path, _ in listening(servers[0].pid) if kind == "unix"]
    assert paths, "the forkserver listens on no Unix socket?"
    for path in paths:
        if path.startswith("\0") or not path:  # abstract namespace: no file to guard
            pytest.fail(f"forkserver socket in the abstract namespace: {path!r}")
        mode = os.stat(path).st_mode
        folder = os.stat(os.path.dirname(path)).st_mode
        assert stat.S_IMODE(mode) & 0o077 == 0, oct(mode)
        assert stat.S_IMODE(folder) & 0o077 == 0, oct(folder)


def test_a_malicious_pickle_written_into_the_store_is_never_unpickled(tmp_path):
    marker = tmp_path / "unpickled"
    outsider = tmp_path / "outsider.py"
    outsider.write_text(
        "import sys, time, pathlib\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import rankprobes\n"
        f"marks = pathlib.Path({str(tmp_path)!r})\n"
        "while not (marks / 'port').exists(): time.sleep(0.02)\n"
        "keys = rankprobes.poison_store('127.0.0.1', int((marks / 'port').read_text()),\n"
        f"    {str(marker)!r}, EXTRA)\n"
        "(marks / 'keys').write_text('\\n'.join(keys))\n"
        "(marks / 'poisoned').write_text('1')\n".replace("EXTRA", repr(PLAUSIBLE_KEYS))
    )
    process = subprocess.Popen([sys.executable, str(outsider)])
    try:
        total = notebook_launcher(
            rankprobes.wait_until_poisoned, (str(tmp_path),), num_processes=2, **QUIET
        )
    finally:
        process.wait(timeout=60)
    assert process.returncode == 0
    written = (tmp_path / "keys").read_text().splitlines()
    assert len(written) > len(PLAUSIBLE_KEYS), "the outsider found none of the launch's keys"
    assert total == 2, "the launch did not complete normally"
    assert not marker.exists(), "something unpickled a value from the store"


# Keys a store-reading kernel or rank might plausibly look up (nbtrain's multi-node keys, torch
# elastic's, results and events by rank): none of them may ever be unpickled.
PLAUSIBLE_KEYS = [
    "nbtrain/news",
    "nbtrain/master_port",
    "nbtrain/node/0",
    "nbtrain/done",
    "result/0",
    "result/1",
    "events/0",
    "events/1",
    "torch.rendezvous.nbtrain",
    "torchelastic/agent",
]


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_each_ranks_pipes_are_held_by_the_kernel_and_that_rank_only(method, tmp_path):
    report = notebook_launcher(
        rankprobes.channel_holders,
        (str(tmp_path),),
        num_processes=3,
        start_method=method,
        **QUIET,
    )
    kernel = os.getpid()
    assert sorted(report["channels"]) == [0, 1, 2]
    for rank, (pid, pipes) in report["channels"].items():
        assert all(pipes.values()), f"rank {rank} lacks a pipe to the kernel: {pipes}"
        for name, inode in pipes.items():
            holding = sorted({(holder, access) for holder, _, access in report["holders"][inode]})
            assert holding == sorted([(kernel, "read"), (pid, "write")]), (
                f"rank {rank}'s {name} pipe is held by {holding}; only the kernel (reading) "
                f"and the rank (pid {pid}, writing) may hold it"
            )


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")
def test_another_user_cannot_open_the_kernels_pipes():
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python another user may run")
    result = notebook_launcher(
        rankprobes.kernel_pipes_seen_by_outsider,
        (os.getpid(), NOBODY, python),
        num_processes=2,
        **QUIET,
    )
    assert len(result["kernel_fds"]) == 3  # rank 0's stdout, stderr and events, read ends
    outsider = result["outsider"]
    assert outsider.pop("list") == "PermissionError"
    assert outsider == {str(fd): "PermissionError" for fd in result["kernel_fds"]}
