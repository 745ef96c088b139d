"""The fault matrix: every way a rank can die, at every point of a run, under every start method.

{raise, sys.exit(3), os._exit(3), SIGKILL, SIGSEGV, hang (timeout=)} x {rank 0, last rank}
x {fork, forkserver, spawn} x {before the process group exists, inside a collective, while
DataLoader workers iterate, during save_state} = 144 cases. For each one:

- the root cause is exact: the victim's rank, its exit code or signal, its traceback (a Python
  one, or faulthandler's dump for SIGSEGV), never the peer that lost its connection;
- control comes back promptly: the launcher's SIGTERM-to-SIGKILL grace is raised to
  STOP_GRACE here, and control must be back well before it, so a stop that only SIGKILL ends
  fails (the bound is still generous for a loaded machine; the figures are in the summary table
  and benchmarks/reliability.py); a hang's TimeoutError names where the victim was stuck;
- no process survives: every rank and every DataLoader worker recorded its pid (with its start
  time, against pid reuse) and psutil must find each of them gone;
- the next launch in the same process works.

Two ranks; the victim is rank 0 or rank 1. The phases, from the victim's side:
- before_group: it fails before init_process_group; its peer is blocked inside it;
- collective: both ranks are blocked inside an all_reduce the other never joins (two groups
  over the same ranks); os._exit / SIGKILL / SIGSEGV strike from a helper thread while the
  victim's main thread is in there (faulthandler's dump shows it), raise / sys.exit just before;
- dataloader: every rank iterates a DataLoader with two forked workers, all four running;
- save_state: right after the victim wrote its first checkpoint file; the peer waits inside
  save_state. The interrupted save must leave no checkpoint behind.
A SIGSEGV happens 60 frames deep, as in a model's forward under a Trainer.
"""

from __future__ import annotations

import os

import pytest
from faultmatrix import all_cases, run_case

pytestmark = [pytest.mark.fault_matrix, pytest.mark.timeout(180)]

STOP_GRACE = 30.0  # the launcher's grace before SIGKILL, for the matrix (2 s by default)
CONTROL_BACK_WITHIN = 15.0  # seconds from the fault (a hang: from the timeout's expiry)


@pytest.fixture(autouse=True)
def stops_must_not_need_sigkill(monkeypatch):
    from nbtrain.kernel.group import rankgroup

    monkeypatch.setattr(rankgroup, "GRACE", STOP_GRACE)


class TracebackLost(AssertionError):
    """The rank's own account of its death did not reach the kernel."""


def _cases() -> list:
    return [
        pytest.param(*case, id="-".join(case))
        for case in all_cases()
    ]


@pytest.mark.parametrize(("method", "phase", "fault", "victim"), _cases())
def test_fault(method, phase, fault, victim, tmp_path):
    result = run_case(method, phase, fault, victim, tmp_path)
    assert result.problems() == [], repr(result.error)
    assert result.seconds < CONTROL_BACK_WITHIN, (
        f"control came back after {result.seconds:.1f}s: did the stop wait for SIGKILL?"
    )
    lost = result.traceback_problems()
    if lost:
        raise TracebackLost(lost)


class ShmLeak(AssertionError):
    """A failed launch left entries in /dev/shm."""


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_dataloader_workers_started_like_their_rank(method, tmp_path):
    """Outside the matrix (slow: each worker is a fresh interpreter): the workers a DataLoader
    starts in its rank's own way (nested forkserver, spawned children) all go too."""
    before = set(os.listdir("/dev/shm"))
    result = run_case(method, "dataloader_default_context", "SIGKILL", "first", tmp_path,
                      record=False)
    assert result.problems() == [], repr(result.error)
    left = sorted(set(os.listdir("/dev/shm")) - before)
    if left:
        raise ShmLeak(f"{len(left)} entries left in /dev/shm: {left[:5]}")
