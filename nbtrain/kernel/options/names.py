"""Messages name the option the way the user gave it: ``notebook_launcher(timeout=10)`` in a
notebook, ``--timeout 10`` on the command line (``nbtrain launch`` sets ``command_line``)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_COMMAND_LINE = contextvars.ContextVar("nbtrain_command_line", default=False)


@contextlib.contextmanager
def command_line() -> Iterator[None]:
    """Inside: messages name command-line options."""
    token = _COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def given(name: str, value: object = None) -> str:
    """How the user set ``name`` (to ``value``): 'notebook_launcher(timeout=10)' or
    '--timeout 10'; without a value, 'notebook_launcher(timeout=...)' or '--timeout'."""
    if _COMMAND_LINE.get():
        flag = "--" + name.replace("_", "-")
        return flag if value is None else f"{flag} {value}"
    return f"notebook_launcher({name}={'...' if value is None else value})"


def to_raise(name: str) -> str:
    """'timeout=' or '--timeout': what to raise in 'Raise ... if the run needs longer.'"""
    return "--" + name.replace("_", "-") if _COMMAND_LINE.get() else f"{name}="


def setting(name: str, value: object) -> str:
    """A value as the user gave it, for a message: '--num-processes 0' on the command line
    (where ``name`` is an option's name), 'num_processes=0' elsewhere."""
    if _COMMAND_LINE.get() and name.isidentifier():
        return f"--{name.replace('_', '-')} {value}"
    return f"{name}={value!r}"


def hint(in_python: str, on_command_line: str) -> str:
    """The fix a message suggests, in the words of where the option was given: e.g. 'Use None
    for one rank per visible GPU.' in Python, 'Leave --num-processes out ...' on the command
    line, where None cannot be written."""
    return on_command_line if _COMMAND_LINE.get() else in_python
