"""Kernel side of the fault matrix: run one case, and judge what came back.

Shared by tests/reliability/test_fault_matrix.py (which asserts) and benchmarks/reliability.py
(which counts and times). One case = one launch of ``rankfaults.rank_fn`` on two ranks, a check
that every process the launch created (ranks and their DataLoader workers) is gone, and one
more launch that must work.
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import rankfaults
import torch._dynamo  # noqa: F401 - as in a notebook that built an optimizer: forked ranks inherit it
from rankfaults import EXIT_CODE, FAULTS, PHASES, VICTIMS, PlannedFault

from nbtrain import WorkerError, notebook_launcher

METHODS = ("fork", "forkserver", "spawn")
WORLD = 2
GONE_WITHIN = 10.0  # seconds: a generous bound that only catches survivors, not slowness
# The hang timeout must outlast start-up; if the victim has not reached its hang by then the
# case is re-run with a doubled timeout (a loaded machine is slow, not wrong).
HANG_TIMEOUT = {"fork": 2.0, "forkserver": 2.0, "spawn": 6.0}
HANG_ATTEMPTS = 3
SIGNALS = {"SIGKILL": -9, "SIGSEGV": -11}
# Where each phase's code runs in the rank: a Python traceback must show it.
PHASE_FRAMES = {
    "before_group": "rank_fn",
    "collective": "_collective",
    "dataloader": "_dataloader",
    "dataloader_default_context": "_dataloader",
    "save_state": "save_state",
}

RESULTS: list[CaseResult] = []  # every case run in this process, for the summary table


def all_cases() -> list[tuple[str, str, str, str]]:
    return list(itertools.product(METHODS, PHASES, FAULTS, VICTIMS))


@dataclass
class CaseResult:
    method: str
    phase: str
    fault: str
    victim: str
    error: BaseException | None
    seconds: float  # from the fault (or, for a hang, the timeout's expiry) to control back
    marks: Path
    survivors: list[str] = field(default_factory=list)
    processes: int = 0  # how many processes the launch created (ranks + workers)
    attempts: int = 1
    next_launch: str = "not tried"  # "ok", or what the launch after this one raised

    @property
    def victim_rank(self) -> int:
        return 0 if self.victim == "first" else WORLD - 1

    def problems(self) -> list[str]:
        """Broken promises, except the traceback's (see traceback_problems)."""
        found = [f"survivor: {s}" for s in self.survivors]
        found += self.root_cause_problems()
        if self.next_launch != "ok":
            found.append(f"the next launch: {self.next_launch}")
        expected = WORLD + (2 * WORLD if self.phase.startswith("dataloader") else 0)
        if self.processes != expected:
            found.append(f"{self.processes} processes recorded themselves, expected {expected}")
        if self.phase == "save_state" and (self.marks / "checkpoint").exists():
            found.append("a save_state that never finished left a checkpoint directory")
        return found

    def root_cause_problems(self) -> list[str]:
        err = self.error
        if self.fault == "hang":
            if not isinstance(err, TimeoutError) or "timeout=" not in str(err):
                return [f"expected TimeoutError naming timeout=, got {err!r}"]
            if f"rank {self.victim_rank} was in " not in str(err):
                return [f"the TimeoutError does not say where rank {self.victim_rank} was: {err}"]
            return []
        if not isinstance(err, WorkerError):
            return [f"expected WorkerError, got {err!r}"]
        found = []
        if err.rank != self.victim_rank:
            found.append(f"root cause rank {err.rank}, expected {self.victim_rank}: {err}")
        exitcode, signal = expected_exit(self.fault)
        if (err.exitcode, err.signal) != (exitcode, signal):
            found.append(f"exit {(err.exitcode, err.signal)}, expected {(exitcode, signal)}")
        text = str(err)
        if signal and signal not in text:
            found.append(f"{signal} not named in {text!r}")
        if self.fault == "raise":
            if not isinstance(err.original, PlannedFault):
                found.append(f"original is {err.original!r}, not the PlannedFault")
            if f"planned fault on rank {self.victim_rank}" not in text:
                found.append(f"message lost: {text!r}")
        if self.fault == "sys.exit" and err.type_name != "SystemExit":
            found.append(f"sys.exit not reported as SystemExit: {text!r}")
        if self.fault == "os._exit" and f"exited with code {EXIT_CODE}" not in text:
            found.append(f"os._exit not reported as an exit code: {text!r}")
        return found

    def traceback_problems(self) -> list[str]:
        """The rank's own account reaches the kernel: its Python traceback, or faulthandler's
        dump (with the crashing frame) after SIGSEGV. Nothing to show for the other faults."""
        err = self.error
        if not isinstance(err, WorkerError):
            return []
        text = err.remote_traceback
        if self.fault in ("raise", "sys.exit"):
            expected = [
                "raise PlannedFault" if self.fault == "raise" else "sys.exit(EXIT_CODE)",
                PHASE_FRAMES[self.phase],
            ]
        elif self.fault == "SIGSEGV":
            expected = ["Fatal Python error: Segmentation fault", "crash_deep"]
        else:
            return []
        missing = [piece for piece in expected if piece not in text]
        return [f"remote_traceback lacks {missing}: {text[-600:]!r}"] if missing else []


def expected_exit(fault: str) -> tuple[int, str | None]:
    if fault in SIGNALS:
        return SIGNALS[fault], fault
    if fault == "raise":
        return 1, None
    return EXIT_CODE, None


def run_case(
    method: str, phase: str, fault: str, victim: str, marks: Path, *, record: bool = True
) -> CaseResult:
    """Inject the fault, check that nothing survives, then launch again."""
    timeout = HANG_TIMEOUT[method] if fault == "hang" else None
    for attempt in range(1, HANG_ATTEMPTS + 1):
        directory = marks / f"attempt{attempt}"
        directory.mkdir(parents=True)
        result = _launch(method, phase, fault, victim, directory, timeout)
        result.attempts = attempt
        if fault != "hang" or (directory / "fault").exists():
            break
        assert timeout is not None
        timeout *= 2  # the timeout came before the victim reached its hang: allow more time
    result.next_launch = next_launch(method)
    if record:
        RESULTS.append(result)
    return result


def _launch(
    method: str, phase: str, fault: str, victim: str, marks: Path, timeout: float | None
) -> CaseResult:
    error: BaseException | None = None
    started = time.time()
    try:
        notebook_launcher(
            rankfaults.rank_fn,
            (fault, victim, phase, str(marks)),
            num_processes=WORLD,
            start_method=method,
            timeout=timeout,
            progress="off",
            output="none",
        )
    except (WorkerError, TimeoutError) as exc:
        error = exc
    back = time.time()
    if timeout is not None:
        since = started + timeout
    else:
        fault_file = marks / "fault"
        since = float(fault_file.read_text()) if fault_file.exists() else back
    recorded = rankfaults.traces(marks)
    return CaseResult(
        method,
        phase,
        fault,
        victim,
        error,
        back - since,
        marks,
        survivors=survivors(recorded),
        processes=len(recorded),
    )


def survivors(
    recorded: list[tuple[str, int, int, float]], within: float = GONE_WITHIN
) -> list[str]:
    """Processes (by their recorded pid and start time) still running after ``within`` s."""
    deadline = time.monotonic() + within
    alive = [entry for entry in recorded if _running(entry)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [entry for entry in alive if _running(entry)]
    described = []
    for kind, rank, pid, _ in alive:
        described.append(f"{kind} of rank {rank} (pid {pid})")
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()  # do not poison the cases that follow
    return described


def _running(entry: tuple[str, int, int, float]) -> bool:
    _, _, pid, started = entry
    try:
        process = psutil.Process(pid)
        return process.create_time() == started and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def next_launch(method: str) -> str:
    """'ok' if a plain launch right after the fault returns its value.

    Spawn cases check with fork: what a fault could break lives in the launching process (its
    store, pipes, signal handlers), the same for every method, and a spawn launch costs seconds
    on two busy cores; consecutive spawn cases are themselves spawn launches after a fault.
    """
    follow = "fork" if method == "spawn" else method
    try:
        value = notebook_launcher(
            rankfaults.echo,
            ("next",),
            num_processes=WORLD,
            start_method=follow,
            progress="off",
            output="none",
            timeout=120,
        )
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok" if value == "next" else f"returned {value!r}"


# ---------------------------------------------------------------------------------------------
# Figures


def summary(results: list[CaseResult]) -> str:
    """Markdown table: per start method, faults injected, how they were handled, time to
    control back, surviving processes."""
    rows = [
        "| start method | faults injected | root cause exact | rank's traceback shown "
        "| surviving processes | next launch worked | control back: median (s) | max (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method in (*METHODS, "all"):
        mine = [r for r in results if method in ("all", r.method)]
        if not mine:
            continue
        exact = sum(1 for r in mine if not r.root_cause_problems())
        shown = sum(1 for r in mine if not r.traceback_problems())
        leaks = sum(len(r.survivors) for r in mine)
        relaunched = sum(1 for r in mine if r.next_launch == "ok")
        times = [r.seconds for r in mine]
        rows.append(
            f"| {method} | {len(mine)} | {exact} | {shown} | {leaks} | {relaunched} "
            f"| {statistics.median(times):.2f} | {max(times):.2f} |"
        )
    return "\n".join(rows)
