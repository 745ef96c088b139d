"""The rank side: code that runs in each rank process (and in torch_xla's host process).

- ``worker``: the rank's entry: set up the process, run the user's function, report the outcome.
- ``process``: process set-up (process group, output pipes, signals), shared with ``xla_host``.
- ``failures``: how a failure is reported, and whether it only echoes a peer's death.
- ``runtime``: the launch context a rank runs in; ``reporting``: ``progress()`` and ``log()``;
  ``textbar``: their text fallback outside a launch.
- ``rankenv``: the rank side's one reader of the environment; ``teardown``: ending cleanly.
- ``xla_host``: torch_xla's host process, which runs the XLA ordinals.
- ``session``: a warm rank (``nbtrain.start_ranks``): serves cells and calls until stopped.

This package's ``__init__`` holds only the process targets the kernel starts ranks with: the
kernel names them without importing any rank logic, and the child imports it when it starts.
Nothing here imports the kernel side or widgets.
"""

from __future__ import annotations

from typing import Any


def _say_importing_torch(spec: Any, events: Any) -> None:
    """A fresh Python (spawn) imports torch before it can report anything else: say so first,
    over the event pipe (args: spec, data, stdout, stderr, events, ...), with nothing heavier
    than the event's own module."""
    import contextlib
    import sys

    if "torch" in sys.modules:  # fork and forkserver ranks have it already
        return
    from nbtrain.shared.events import PipeWriter, Status

    with contextlib.suppress(OSError):  # the kernel is gone: the rank finds out next
        PipeWriter(events.fileno()).send(Status(spec.info.rank, "importing torch"))


def rank_entry(*args: Any) -> None:
    """Process target of a rank (see worker.rank_main)."""
    _say_importing_torch(args[0], args[4])
    from nbtrain.rank.worker import rank_main

    rank_main(*args)


def session_entry(*args: Any) -> None:
    """Process target of a warm rank (see session.session_main)."""
    _say_importing_torch(args[0], args[4])
    from nbtrain.rank.session import session_main

    session_main(*args)


def host_entry(*args: Any) -> None:
    """Process target of torch_xla's host process (see xla_host.host_main)."""
    from nbtrain.rank.xla_host import host_main

    host_main(*args)
