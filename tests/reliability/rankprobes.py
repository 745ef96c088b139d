"""Rank-side probes for the closed-channel tests: they look at the launching process (the
"kernel") from inside a running launch, while the kernel is busy supervising.

Imported by ranks under every start method: keep it light (no pytest).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import time
from pathlib import Path


def listening(pid: int) -> list[tuple[str, str, int]]:
    """(kind, address, port) of every listening socket of process ``pid``."""
    import psutil

    found = []
    for conn in psutil.Process(pid).net_connections("all"):
        if conn.type != 1:  # SOCK_STREAM only
            continue
        if isinstance(conn.laddr, str):
            # AF_UNIX: psutil reports no state; a bound, unconnected socket is a listener
            if conn.laddr and not conn.raddr:
                found.append(("unix", conn.laddr, 0))
        elif conn.status == "LISTEN":
            found.append(("inet", conn.laddr.ip, conn.laddr.port))
    return found


def kernel_sockets_during_launch(kernel: int) -> dict:
    """Rank 0 reports the kernel's listening sockets; every rank waits for it (so the launch
    is surely still running while we look)."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    seen = listening(kernel) if dist.get_rank() == 0 else []
    dist.barrier()
    dist.destroy_process_group()
    return {"listening": seen, "store_port": int(os.environ["MASTER_PORT"])}


# ---------------------------------------------------------------------------------------------
# The store


class Planted:
    """Unpickling this makes a directory: proof that someone called pickle.loads on it."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def poison_store(host: str, port: int, marker: str, extra_keys: list[str]) -> list[str]:
    """An outside process: connect to the store as a client, overwrite every key with a
    malicious pickle, add plausible ones. Returns the keys written."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=30))
    payload = pickle.dumps(Planted(marker))
    keys = sorted(set(store.list_keys()) | set(extra_keys))
    for key in keys:
        store.set(key, payload)
    return keys


def wait_until_poisoned(marks: str) -> int:
    """Ranks: set up, announce it, wait until the outsider poisoned the store, then go on
    using the process group (and end normally)."""
    import torch
    import torch.distributed as dist

    directory = Path(marks)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0:
        (directory / "port").write_text(os.environ["MASTER_PORT"])
    deadline = time.monotonic() + 120
    while not (directory / "poisoned").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the outsider never wrote to the store")
        time.sleep(0.02)
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.barrier()
    dist.destroy_process_group()
    return int(t.item())


# ---------------------------------------------------------------------------------------------
# Pipes


def pipe_inode(pid: int | str, fd: int) -> int | None:
    try:
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None
    return int(target[6:-1]) if target.startswith("pipe:[") else None


def holders(inodes: set[int]) -> dict[int, list[tuple[int, int, str]]]:
    """Every (pid, fd, access) on this machine that holds one of these pipes."""
    found: dict[int, list[tuple[int, int, str]]] = {inode: [] for inode in inodes}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for name in fds:
            inode = pipe_inode(entry, int(name))
            if inode in found:
                found[inode].append((int(entry), int(name), _access(entry, name)))
    return found


def _access(pid: str, fd: str) -> str:
    try:
        flags = Path(f"/proc/{pid}/fdinfo/{fd}").read_text().split("flags:")[1].split()[0]
    except (OSError, IndexError):
        return "?"
    return {0: "read", 1: "write", 2: "read+write"}[int(flags, 8) & 3]


def my_channel() -> dict[str, int | None]:
    """This rank's three pipes to the kernel: stdout (fd 1), stderr (fd 2), events."""
    from nbtrain.rank import runtime

    current = runtime.current()
    assert current is not None
    events_fd = current.sink._fd  # type: ignore[attr-defined] - test-only introspection
    return {
        "stdout": pipe_inode("self", 1),
        "stderr": pipe_inode("self", 2),
        "events": pipe_inode("self", events_fd),
    }


def channel_holders(marks: str) -> dict:
    """Every rank reports its pipes; rank 0 then lists who holds them while all ranks live."""
    import torch.distributed as dist

    directory = Path(marks)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mine = my_channel()
    (directory / f"channel-{rank}").write_text(repr((os.getpid(), mine)))
    dist.barrier()
    report = None
    if rank == 0:
        channels = {}
        for path in directory.glob("channel-*"):
            pid, pipes = eval(path.read_text())  # written just above by our own ranks
            channels[int(path.name.split("-")[1])] = (pid, pipes)
        inodes = {inode for _, pipes in channels.values() for inode in pipes.values() if inode}
        report = {"channels": channels, "holders": holders(inodes)}
    dist.barrier()
    dist.destroy_process_group()
    return report


def outsider_cannot_open(kernel: int, fds: list[int], uid: int, python: str) -> dict:
    """Run as another user: try to list the kernel's fds and to open its pipes for writing."""
    script = f"""
import os, json
out = {{}}
try:
    os.listdir("/proc/{kernel}/fd"); out["list"] = "allowed"
except OSError as exc:
    out["list"] = type(exc).__name__
for fd in {fds!r}:
    try:
        os.close(os.open("/proc/{kernel}/fd/%d" % fd, os.O_WRONLY | os.O_NONBLOCK))
        out[str(fd)] = "allowed"
    except OSError as exc:
        out[str(fd)] = type(exc).__name__
print(json.dumps(out))
"""
    done = subprocess.run(
        [python, "-I", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        user=uid,
        group=uid,
        extra_groups=[],
        cwd="/",
    )
    import json

    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def kernel_pipes_seen_by_outsider(kernel: int, uid: int, python: str) -> dict:
    """Rank 0 finds the kernel's ends of the launch's pipes, then an outsider tries them."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    result = None
    if dist.get_rank() == 0:
        mine = set(filter(None, my_channel().values()))
        kernel_fds = [
            int(fd)
            for fd in os.listdir(f"/proc/{kernel}/fd")
            if pipe_inode(kernel, int(fd)) in mine
        ]
        outsider = outsider_cannot_open(kernel, kernel_fds, uid, python)
        result = {"kernel_fds": kernel_fds, "outsider": outsider}
    dist.barrier()
    dist.destroy_process_group()
    return result
