"""How a rank's failure is reported: the Failed event, its traceback and exit code, and whether
the exception only echoes a peer's death (collateral, never the root cause).

Rank side; also used by the kernel's in-process path, where the kernel is rank 0.
"""

from __future__ import annotations

import os
import re
import traceback
from types import TracebackType

from nbtrain.shared.events import Failed
from nbtrain.shared.serialization import pack_exception

# Frames of nbtrain's rank side (the worker calling the user's function) are not the user's.
_RANK_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


# Errors a rank raises only because a *peer* vanished: such a rank is never the root cause
# (Accelerate blames these ranks today). torch.distributed's own error types always qualify; a
# RuntimeError must read like a lost connection *and* come from the collectives' transport
# (gloo / NCCL / c10d, which name the peer's address), so that a user's own "timed out" or
# "connection refused" (an HTTP client, a database) is still a root cause.
_PEER_LOSS = re.compile(
    r"connection (closed|reset) by peer|broken pipe|econnreset|epipe|socket (is )?closed|"
    r"communicator was aborted|connection refused|read error|recv(?:ing)? .* failed|"
    r"connection closed|timed out",
    re.IGNORECASE,
)
_TRANSPORT = re.compile(
    r"gloo|nccl|c10d|processgroup|tcpstore|\[[0-9a-f.:]+\]:\d+", re.IGNORECASE
)
_DIST_ERRORS = {"DistBackendError", "DistNetworkError", "DistStoreError", "DistError"}


def is_collateral(exc: BaseException) -> bool:
    if type(exc).__name__ in _DIST_ERRORS:
        return True
    text = str(exc)
    return (
        isinstance(exc, RuntimeError)
        and bool(_PEER_LOSS.search(text))
        and bool(_TRANSPORT.search(text))
    )


# torch.distributed used before any process group exists (a first %%ranks cell, a function
# that never made an Accelerator): what to do, said where the error is.
_NO_GROUP = "Default process group has not been initialized"
NO_GROUP_HINT = (
    "nbtrain: no process group exists in this rank yet. Make one first: nbtrain.Accelerator() "
    "(it forms the group), or torch.distributed.init_process_group('gloo') (or 'nccl'); in "
    "warm ranks, once in a %%ranks cell."
)


def failure_event(rank: int, exc: BaseException, exitcode: int) -> Failed:
    if _NO_GROUP in str(exc) and hasattr(exc, "add_note"):
        exc.add_note(NO_GROUP_HINT)
    # Bad input (e.g. a return value that cannot travel): the message says it all.
    bad_input = getattr(exc, "nbtrain_bad_input", False)
    tb = None if bad_input else users_traceback(exc.__traceback__)
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return Failed(
        rank=rank,
        type_name=type(exc).__qualname__,
        message=str(exc),
        traceback=text,
        exception=pack_exception(exc),
        exitcode=exitcode,
        collateral=is_collateral(exc),
    )


def users_traceback(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the first frame that is not nbtrain's rank side: the rank's traceback
    starts where the user's function does (when nothing of theirs ran, it stays whole)."""
    first = tb
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_RANK_DIR):
        tb = tb.tb_next
    return _without_signal_handler(tb) if tb is not None else first


# The rank's handlers that raise KeyboardInterrupt (session.py, interrupts.py): an interrupt's
# traceback ends in one of them, but the user's frame it interrupted is where pdb must open.
_SIGNAL_HANDLERS = ("_on_sigint", "_on_signal")


def _without_signal_handler(tb: TracebackType) -> TracebackType:
    frames: list[TracebackType] = []
    entry: TracebackType | None = tb
    while entry is not None:
        frames.append(entry)
        entry = entry.tb_next
    last = frames[-1].tb_frame.f_code
    if len(frames) < 2 or not (
        last.co_filename.startswith(_RANK_DIR) and last.co_name in _SIGNAL_HANDLERS
    ):
        return tb
    chain: TracebackType | None = None
    for kept in reversed(frames[:-1]):
        chain = TracebackType(chain, kept.tb_frame, kept.tb_lasti, kept.tb_lineno)
    assert chain is not None
    return chain


def exit_code_of(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1  # sys.exit("message") exits with 1 after printing the message
