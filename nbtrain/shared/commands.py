"""What the kernel asks a warm rank to do (a distributed session, kernel/warm/): records
sent down each rank's own command pipe, one at a time, each answered by Started then Finished
or Failed on the rank's event pipe.

The pipes are created by the kernel for its own children and reach no one else: the rank
unpickles only what its parent wrote.
"""

from __future__ import annotations

from dataclasses import dataclass

from nbtrain.shared.stopping import StopPolicy


@dataclass(frozen=True)
class Cell:
    """Run a cell's source in the rank's namespace; the last expression's value comes back as a
    display bundle (``show_value``)."""

    code: str
    filename: str  # the cell's own name: tracebacks and stack dumps show its lines
    show_value: bool = True
    results_prefix: str | None = None  # segment names for a large value (None: in the pickle)


@dataclass(frozen=True)
class Call:
    """Run a pickled ``(function, args, kwargs)`` (kernel/specs/payload.py's envelope)."""

    payload: bytes
    send_result: bool
    stopping: StopPolicy | None = None  # run(..., on_interrupt=...): this call's own policy


@dataclass(frozen=True)
class Pull:
    """Evaluate an expression in the rank's namespace and send its value."""

    expression: str
    results_prefix: str | None = None  # segment names for large values (None: in the pickle)


@dataclass(frozen=True)
class Push:
    """Set names in the rank's namespace: a pickled dict (large data in a shared segment)."""

    data: bytes


@dataclass(frozen=True)
class Debug:
    """Open pdb on the frames of the rank's last failure (``%ranks_debug``; rank/debugger.py)."""


@dataclass(frozen=True)
class Stop:
    """End the session: the rank leaves its loop and exits."""


Command = Cell | Call | Pull | Push | Debug | Stop
