"""Rank-side code of the fault matrix: one function, parametrized by (fault, victim, phase).

Ranks import this module (under spawn too), so it stays light: no pytest, no kernel-side code.
Every process of a launch leaves a trace in the marks directory, so the kernel side can later
prove that each of them is gone:

    proc-rank-<rank>-<pid>     a rank      (content: the process start time, against pid reuse)
    proc-worker-<rank>-<pid>   one of that rank's DataLoader workers
    fault                      written by the victim just before the fault (content: time.time())
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time
from pathlib import Path

FAULTS = ("raise", "sys.exit", "os._exit", "SIGKILL", "SIGSEGV", "hang")
VICTIMS = ("first", "last")
PHASES = ("before_group", "collective", "dataloader", "save_state")
# Faults that need no cooperation of the victim's main thread: delivered from a helper thread
# while the main thread is blocked inside a collective.
ASYNC_FAULTS = ("os._exit", "SIGKILL", "SIGSEGV")
EXIT_CODE = 3
SEGV_DEPTH = 60  # frames between the fault and the crash (nn.Module calls nest 3 frames each)
WAIT_LIMIT = 120.0  # seconds a rank waits for its peers' traces before giving up (hang guard)


class PlannedFault(Exception):
    """The exception the 'raise' fault raises (importable, so it unpickles in the kernel)."""


# ---------------------------------------------------------------------------------------------
# Traces


def start_time(pid: int) -> float:
    import psutil

    return psutil.Process(pid).create_time()


def record_process(marks: Path, kind: str, rank: int) -> None:
    pid = os.getpid()
    path = marks / f"proc-{kind}-{rank}-{pid}"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(repr(start_time(pid)))
    tmp.rename(path)  # readers never see a half-written file


def traces(marks: Path, kind: str = "") -> list[tuple[str, int, int, float]]:
    """(kind, rank, pid, start time) of every process that recorded itself."""
    found = []
    for path in marks.glob(f"proc-{kind}*"):
        if path.name.endswith(".tmp"):
            continue
        _, what, rank, pid = path.name.split("-")
        found.append((what, int(rank), int(pid), float(path.read_text())))
    return found


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_LIMIT
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.01)


# ---------------------------------------------------------------------------------------------
# Faults


def inject(fault: str, marks: Path, rank: int) -> None:
    """Make this rank fail in the way ``fault`` names. Returns only for no fault at all."""
    (marks / "fault").write_text(repr(time.time()))
    if fault == "raise":
        raise PlannedFault(f"planned fault on rank {rank}")
    if fault == "sys.exit":
        sys.exit(EXIT_CODE)
    if fault == "os._exit":
        os._exit(EXIT_CODE)
    if fault == "SIGKILL":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "SIGSEGV":
        crash_deep(SEGV_DEPTH)
    if fault == "hang":
        while True:
            time.sleep(60)
    time.sleep(5)  # a signal may take a moment to land; never fall through to "success"
    raise AssertionError(f"fault {fault!r} did not end the process")


def crash_deep(depth: int) -> None:
    """A real invalid read (not a signal sent by hand), ``depth`` frames down: a crash deep in
    a model's forward, as in a Trainer inside a kernel, whose dump runs long."""
    if depth:
        crash_deep(depth - 1)
        return
    import ctypes

    ctypes.string_at(0)


def inject_soon(fault: str, marks: Path, rank: int, delay: float = 0.3) -> None:
    """Fire an asynchronous fault from a helper thread while the main thread is blocked."""
    assert fault in ASYNC_FAULTS
    timer = threading.Timer(delay, inject, (fault, marks, rank))
    timer.daemon = True
    timer.start()


# ---------------------------------------------------------------------------------------------
# The rank function


def echo(value: object) -> object:
    return value


def rank_fn(fault: str, victim: str, phase: str, marks: str) -> str:
    import torch.distributed as dist

    directory = Path(marks)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    record_process(directory, "rank", rank)
    # No fault before every rank has left its trace: the kernel side must be able to check
    # that each of them is gone afterwards.
    wait_for(lambda: len(traces(directory, "rank")) == world, "every rank's trace")
    is_victim = rank == (0 if victim == "first" else world - 1)
    if phase == "before_group":
        if is_victim:
            inject(fault, directory, rank)
        dist.init_process_group("gloo")  # the peers block in here, waiting for the victim
        dist.barrier()
    elif phase == "collective":
        _collective(fault, is_victim, directory, rank)
    elif phase == "dataloader":
        _dataloader(fault, is_victim, directory, rank, world, "fork")
    elif phase == "dataloader_default_context":  # workers started as the rank was
        _dataloader(fault, is_victim, directory, rank, world, None)
    elif phase == "save_state":
        _save_state(fault, is_victim, directory, rank)
    else:
        raise ValueError(phase)
    return "survived"  # only reached when no fault was injected anywhere


def _collective(fault: str, is_victim: bool, marks: Path, rank: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    # Two groups over the same ranks: each rank blocks in an all_reduce on "its" group, which
    # the other never joins, so every rank is inside a collective when the fault strikes.
    groups = [dist.new_group(), dist.new_group()]
    t = torch.ones(1000)
    for _ in range(3):  # a few healthy steps first
        dist.all_reduce(t)
    if is_victim:
        if fault in ASYNC_FAULTS:
            inject_soon(fault, marks, rank)  # while this thread is blocked just below
        elif fault != "hang":
            inject(fault, marks, rank)  # the peer is already blocked in its all_reduce
        else:
            (marks / "fault").write_text(repr(time.time()))  # hangs inside the collective
    dist.all_reduce(t, group=groups[0] if is_victim else groups[1])
    raise AssertionError("a collective that can never complete returned")


class SlowRange:
    """A long dataset, slow enough that the workers are still busy when the fault comes."""

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int):
        import torch

        time.sleep(0.002)
        return torch.tensor([float(index)])


def _record_worker(marks: str, rank: int, worker_id: int) -> None:
    record_process(Path(marks), "worker", rank)


def _dataloader(
    fault: str, is_victim: bool, marks: Path, rank: int, world: int, context: str | None
) -> None:
    from torch.utils.data import DataLoader

    loader = DataLoader(
        SlowRange(),
        batch_size=2,
        num_workers=2,
        # The matrix forks workers under every start method: spawn/forkserver ranks would
        # otherwise start them the way they were started themselves, ~6 s each on two busy
        # cores (test_dataloader_workers_started_like_their_rank covers that tree).
        multiprocessing_context=context,
        worker_init_fn=functools.partial(_record_worker, str(marks), rank),
    )
    for step, _batch in enumerate(loader):
        if is_victim and step == 3:
            # Every rank's two workers exist and are iterating: now fail.
            wait_for(lambda: len(traces(marks, "worker")) == 2 * world, "every rank's workers")
            inject(fault, marks, rank)


def _save_state(fault: str, is_victim: bool, marks: Path, rank: int) -> None:
    import torch

    from nbtrain import Accelerator

    acc = Accelerator()
    # Registered rather than prepared with an optimizer: creating a torch optimizer (and DDP)
    # imports torch._dynamo, 2-5 s per fresh rank on two busy cores; the save path is the same.
    acc.register_for_checkpointing(torch.nn.Linear(64, 64))
    if is_victim:
        # Strike right after the victim wrote its first file of the checkpoint (torch.save is
        # what save_state writes optimizer and per-rank state with): the save is half done, and
        # the peer waits for it inside save_state.
        original = torch.save

        def save_then_fail(*args, **kwargs):
            original(*args, **kwargs)
            torch.save = original
            inject(fault, marks, rank)

        torch.save = save_then_fail
    acc.save_state(str(marks / "checkpoint"))


class Tag:
    """A small object registered for checkpointing: which save a checkpoint came from."""

    def __init__(self, value: int) -> None:
        self.value = value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]
