"""Exceptions that cross the kernel/rank boundary. All of them survive pickling."""

from __future__ import annotations

import signal as _signal
from typing import Any

# torch elastic's failure types (torch is loaded on both sides already; this adds ~10 ms)
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from nbtrain.shared.rankset import ranks_label


class RemoteTraceback(Exception):
    """Carries a rank's traceback text so the cell shows it as the direct cause."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n\n" + self.text.rstrip()


class WorkerError(RuntimeError, ChildFailedError):
    """A rank failed; every other rank was stopped.

    ``rank`` is the root cause: the first rank that failed on its own account, never a rank that
    merely lost its connection to a peer that had already died.

    Also a torch elastic ``ChildFailedError`` (what Accelerate's ``notebook_launcher`` raises), so
    code written for Accelerate (``except ChildFailedError``) catches it: ``failures`` and
    ``get_first_failure()`` describe the root-cause rank as a ``ProcessFailure``.

    Its attributes, as the kernel builds it from the rank's report:

    :param rank: the root-cause rank.
    :param type_name: the type of the exception it raised (None: it died without one, e.g. a
        signal).
    :param message: that exception's message.
    :param exitcode: the rank's exit code (None while it was still running).
    :param signal: the signal that ended it (``"SIGKILL"``), or None.
    :param original: the exception object itself when it could be unpickled here, else None.
    :param remote_traceback: the rank's traceback, as text (the cell shows it as the cause).
    :param node: the node (machine) number of the root cause in a multi-node launch.
    :param other_failures: other ranks that failed on their own account: rank -> summary.
    :param host: the root cause's machine name, where a cluster placed it.
    :param stopped: how many other ranks ended because of it: stopped by the launcher while
        still running, or stopped by losing their connection to it (a collective's
        "Connection closed by peer"), whichever came first.
    :param lost_peer: those of them that raised such an error: rank -> its one-line summary.
    """

    name = "notebook_launcher"  # ChildFailedError's entrypoint name

    def __init__(
        self,
        rank: int,
        *,
        type_name: str | None = None,
        message: str = "",
        exitcode: int | None = None,
        signal: str | None = None,
        original: BaseException | None = None,
        remote_traceback: str = "",
        node: int = 0,
        other_failures: dict[int, str] | None = None,
        host: str = "",
        stopped: int = 0,
        lost_peer: dict[int, str] | None = None,
    ) -> None:
        self.rank = rank
        self.type_name = type_name
        self.message = message
        self.exitcode = exitcode
        self.signal = signal
        self.original = original
        self.remote_traceback = remote_traceback
        self.node = node
        self.host = host  # the root cause's machine, where a cluster placed it
        self.other_failures = dict(other_failures or {})
        self.stopped = stopped
        self.lost_peer = dict(lost_peer or {})
        # (not ChildFailedError.__init__: ``name`` and ``failures`` are derived, not stored)
        RuntimeError.__init__(self, self._summary())

    def _summary(self) -> str:
        host = getattr(self, "host", "")  # pickled before it existed
        if host:
            where = f"rank {self.rank} (node {self.node}: {host})"
        else:
            where = f"rank {self.rank}" + (f" (node {self.node})" if self.node else "")
        if self.type_name:
            text = f"{where} failed with {self.type_name}: {self.message}".rstrip(": ")
        elif self.signal:
            text = f"{where} was killed by signal {self.signal}"
        else:
            text = f"{where} exited with code {self.exitcode} without returning a result"
        if self.message and not self.type_name:
            text += f" ({self.message})"
        # Ranks that raised the very same error did so on their own account (the same bug on
        # every rank), not as a consequence of this one: said as such.
        own = f"{self.type_name}: {self.message}".strip() if self.type_name else None
        same = sorted(r for r, s in self.other_failures.items() if own and _same(s, own))
        if same:
            names = ", ".join(str(r) for r in same)
            text += f"\n  rank{'s' if len(same) > 1 else ''} {names} raised the same error"
        others = {r: s for r, s in self.other_failures.items() if r not in same}
        if others:
            text += "\n  then, as a consequence: " + _consequences(others)
        stopped = getattr(self, "stopped", 0)  # (pickled before it existed)
        if stopped:  # at width, the one line that stands for every collateral rank
            text += f"\n  {stopped} other rank{'s were' if stopped > 1 else ' was'} stopped"
        return text

    def __str__(self) -> str:
        return self._summary()

    @property  # (computed, so pickling never carries a ProcessFailure)
    def failures(self) -> dict[int, ProcessFailure]:  # type: ignore[override]
        """ChildFailedError's view: the root-cause rank, its exit code (minus the signal number
        for a signal) and, as ``message``, this error's summary."""
        exitcode = self.exitcode
        if exitcode is None:
            exitcode = -_signal.Signals[self.signal].value if self.signal in _SIGNALS else 1
        failure = ProcessFailure(local_rank=self.rank, pid=-1, exitcode=exitcode, error_file="")
        failure.message = self.remote_traceback or self._summary()
        return {self.rank: failure}

    def __reduce__(self) -> tuple[Any, ...]:
        state = dict(self.__dict__)
        return (_rebuild_worker_error, (state,))


_SIGNALS = set(_signal.Signals.__members__)


LISTED = 3  # consequences listed one by one; more are summarised by error type


def _consequences(others: dict[int, str]) -> str:
    """'rank 0: X, rank 1: Y', or for many ranks (a wide run whose ranks all lost their peer)
    '62 other ranks failed: ranks 0-61 with RuntimeError (e.g. rank 0: RuntimeError: ...)'."""
    if len(others) <= LISTED:
        return ", ".join(f"rank {r}: {s}" for r, s in sorted(others.items()))
    kinds: dict[str, list[int]] = {}
    for rank, line in sorted(others.items()):
        kinds.setdefault(line.split(":", 1)[0], []).append(rank)
    parts = [
        f"{ranks_label(ranks)} with {kind} (e.g. rank {ranks[0]}: {others[ranks[0]]})"
        for kind, ranks in kinds.items()
    ]
    return f"{len(others)} other ranks failed: " + "; ".join(parts)


def _same(line: str, own: str) -> bool:
    """Is ``line`` (another rank's one-line failure, maybe cut with "…") the error ``own``?"""
    return line == own or (line.endswith("…") and own.startswith(line[:-1]))


def _rebuild_worker_error(state: dict[str, Any]) -> WorkerError:
    err = WorkerError.__new__(WorkerError)
    RuntimeError.__init__(err, "")
    err.__dict__.update(state)
    err.args = (err._summary(),)
    return err


class SessionError(RuntimeError):
    """Bad use of warm ranks (``nbtrain.start_ranks``): none running, a rank selector naming a
    rank that does not exist, a stopped session. Raised before anything runs."""


class ResultError(RuntimeError):
    """A rank returned a value that the kernel cannot unpickle (the rank itself succeeded).

    :param rank: the rank whose value could not be loaded.
    :param type_name: the value's type, as the rank named it.
    :param cause: the error unpickling raised.
    """

    def __init__(self, rank: int, type_name: str | None, cause: BaseException) -> None:
        self.rank = rank
        self.type_name = type_name
        what = f"an object of type {type_name}" if type_name else "an object"
        super().__init__(
            f"rank {rank} returned {what} that cannot be loaded in this kernel "
            f"({type(cause).__name__}: {cause}): its class exists only in the rank. Return "
            "plain data, tensors or a state_dict (e.g. model.state_dict()) instead, or make "
            "the class importable in the kernel too."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_result_error, (self.__dict__.copy(), self.args))


def _rebuild_result_error(state: dict[str, Any], args: tuple[Any, ...]) -> ResultError:
    err = ResultError.__new__(ResultError)
    RuntimeError.__init__(err, *args)
    err.__dict__.update(state)
    return err


class LaunchError(RuntimeError):
    """The ranks could not be started at all (not a failure inside user code)."""


class EndpointInUseError(LaunchError, ValueError):
    """The rdzv_endpoint port is taken on node 0: a bad argument value (ValueError, as API.md
    promises for bad input) found while opening it, before any rank started."""


def signal_name(number: int) -> str:
    """SIGKILL for 9, or 'signal 42' for numbers without a name."""
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
