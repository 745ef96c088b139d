"""What a launch ended with: every rank's result, or the root-cause failure.

Pure bookkeeping over events, so the root-cause rule is unit-testable with explicit ranks.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from nbtrain.shared.errors import ResultError, WorkerError
from nbtrain.shared.events import Event, Exited, Failed, Finished, Output, Stopped
from nbtrain.shared.serialization import unloadable_global, unpack

_STDERR_TAIL = 60  # last stderr lines kept per rank: the account of a death without exception
_FATAL_HEADER = "Fatal Python error"
_FATAL_LINES = 2000  # a faulthandler dump (every thread's stack) is kept whole up to this size


@dataclass
class RankRecord:
    result: bytes | None = None
    finished: bool = False
    stopped: Stopped | None = None  # a graceful stop: the rank saved its checkpoint and left
    failure: Failed | None = None
    exit: Exited | None = None
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=_STDERR_TAIL))
    # From the last "Fatal Python error" line on: a deep stack (or, under fork, the kernel's own
    # frames in other threads) must not push the header and the crashing frames out of a tail.
    fatal_dump: list[str] = field(default_factory=list)


class Outcome:
    def __init__(self, ranks: list[int]) -> None:
        self.records = {rank: RankRecord() for rank in ranks}
        # Kept as events arrive: the watch loop asks has_failure() every pass, and a scan of
        # every record made each pass cost more with every rank (issue 44).
        self._failing: set[int] = set()
        self._exited = 0

    def apply(self, event: Event) -> None:
        record = self.records.get(event.rank)
        if record is None:
            return
        if isinstance(event, Output):
            if event.stream == "stderr":
                _keep_stderr(record, event.line)
            return
        if isinstance(event, Exited) and record.exit is None:
            self._exited += 1
        _record(record, event)
        if _failed(record):
            self._failing.add(event.rank)
        else:
            self._failing.discard(event.rank)

    @property
    def all_exited(self) -> bool:
        return self._exited == len(self.records)

    def failed_ranks(self) -> list[int]:
        """Ranks that failed on their own (not ones the launcher stopped)."""
        return [rank for rank in self.records if rank in self._failing]

    def has_failure(self) -> bool:
        return bool(self._failing)

    def stops(self) -> list[Stopped]:
        """The graceful stops reported, by rank."""
        return [r.stopped for _, r in sorted(self.records.items()) if r.stopped is not None]

    def root_cause(self) -> int | None:
        """The first rank to fail on its own account.

        Ranks that only lost a peer (collateral) lose to any other failure, whatever their
        timestamps; within a class, the earliest wins.
        """
        candidates = [
            (_is_collateral(record), _failure_time(record), rank)
            for rank, record in self.records.items()
            if _failed(record)
        ]
        return min(candidates)[2] if candidates else None

    def error(self, node: int = 0) -> WorkerError:
        rank = self.root_cause()
        assert rank is not None, "error() called without a failure"
        record = self.records[rank]
        others, lost_peer, stopped = self._the_others(rank)
        exit_event = record.exit
        signal_name = exit_event.signal if exit_event else None
        exitcode = exit_event.exitcode if exit_event else None
        failure = record.failure
        if failure is not None:
            if exit_event is not None and exit_event.stopped_by_launcher:
                # Killed by us after it had reported: its own exit code is the truthful one.
                exitcode, signal_name = failure.exitcode, None
            return WorkerError(
                rank,
                type_name=failure.type_name,
                message=failure.message,
                exitcode=failure.exitcode if exitcode is None else exitcode,
                signal=signal_name,
                original=_try_unpack(failure.exception),
                remote_traceback=failure.traceback,
                node=node,
                other_failures=others,
                stopped=stopped,
                lost_peer=lost_peer,
            )
        message = "" if signal_name else _exit_hint(exitcode)
        return WorkerError(
            rank,
            exitcode=exitcode,
            signal=signal_name,
            message=message,
            remote_traceback="\n".join(record.fatal_dump) or _tail(record.stderr_tail),
            node=node,
            other_failures=others,
            stopped=stopped,
            lost_peer=lost_peer,
        )

    def _the_others(self, rank: int) -> tuple[dict[int, str], dict[int, str], int]:
        """Besides root cause ``rank``: the others' own failures, those that only lost their
        connection to it, and how many ended because of it (those, and the ones stopped)."""
        failed = {o: rec for o, rec in self.records.items() if o != rank and _failed(rec)}
        others = {o: _one_line(rec) for o, rec in failed.items() if not _is_collateral(rec)}
        # A rank that only lost its connection to the root cause ended because of it, as one the
        # launcher stopped did: which of the two came first is a race, not news (counted alike).
        lost_peer = {o: _one_line(rec) for o, rec in failed.items() if _is_collateral(rec)}
        stopped = sum(  # still running when it failed: the launcher stopped them
            1 for o, rec in self.records.items()
            if o != rank and o not in failed and not rec.finished and rec.stopped is None
        )
        return others, lost_peer, stopped + len(lost_peer)

    def results(self) -> dict[int, object]:
        """Every returned value; ResultError names the rank whose value the kernel cannot load."""
        return {
            rank: _load_result(rank, record.result)
            for rank, record in self.records.items()
            if record.result is not None
        }


def _record(record: RankRecord, event: Event) -> None:
    if isinstance(event, Finished):
        record.finished, record.result = True, event.result
    elif isinstance(event, Failed):
        record.failure = event
    elif isinstance(event, Stopped):
        record.stopped = event
    elif isinstance(event, Exited):
        record.exit = event


def _keep_stderr(record: RankRecord, line: str) -> None:
    record.stderr_tail.append(line)
    if line.startswith(_FATAL_HEADER):
        record.fatal_dump = [line]
    elif record.fatal_dump and len(record.fatal_dump) < _FATAL_LINES:
        record.fatal_dump.append(line)


def _load_result(rank: int, data: bytes) -> object:
    try:
        return unpack(data)
    except Exception as exc:
        # Its class lives in a module only the rank imported (a file on the rank's sys.path, a
        # package installed since the kernel started, ...): the value cannot be rebuilt here.
        raise ResultError(rank, unloadable_global(data), exc) from exc


def _failed(record: RankRecord) -> bool:
    # Any reported exception is a failure, even a mere lost connection: if every rank only lost
    # a peer (gloo could not connect at all, say), the launch failed all the same. Collateral
    # failures just lose to real ones when the root cause is chosen. One raised after the
    # launcher signalled the rank to stop (its SIGTERM handler raised) is the stop's doing.
    if record.failure is not None:
        return not record.failure.after_stop
    exit_event = record.exit
    if exit_event is None or exit_event.stopped_by_launcher:
        return False
    ended_well = record.finished or record.stopped is not None
    return not (ended_well and exit_event.exitcode == 0)


def _is_collateral(record: RankRecord) -> bool:
    return record.failure is not None and record.failure.collateral


def _failure_time(record: RankRecord) -> float:
    if record.failure is not None:
        return record.failure.time
    assert record.exit is not None
    return record.exit.time


def _one_line(record: RankRecord) -> str:
    if record.failure is not None:
        text = f"{record.failure.type_name}: {record.failure.message}".strip()
        return text if len(text) <= 200 else text[:199] + "…"
    if record.exit is not None and record.exit.signal:
        return f"killed by {record.exit.signal}"
    return f"exit code {record.exit.exitcode if record.exit else '?'}"


def _exit_hint(exitcode: int | None) -> str:
    if exitcode == 0:
        return "the process ended before the function returned, e.g. os._exit(0)"
    return (
        "the process ended without raising a Python exception, e.g. os._exit() or a crash in C code"
    )


def _tail(lines: deque[str], count: int = 25) -> str:
    """Without a Python exception, the last stderr lines are the best account of what happened."""
    text = list(lines)[-count:]
    return ("(last lines the rank wrote to stderr)\n" + "\n".join(text)) if text else ""


def _try_unpack(data: bytes | None) -> BaseException | None:
    if data is None:
        return None
    try:
        value = unpack(data)
    except Exception:  # the class may not exist in the kernel: text and traceback still arrive
        return None
    return value if isinstance(value, BaseException) else None
