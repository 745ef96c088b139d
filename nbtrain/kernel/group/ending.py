"""How a watch over rank processes ended: the value ``RankGroup.wait`` returns.

One value instead of flags read on a live Supervisor: what the launch does next (deliver,
raise the root cause, TimeoutError, the graceful stop's message; warm ranks: restart the world)
is decided from it alone. The in-process path (launch/inprocess.py) gives one too.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from nbtrain.shared.stacks import RankStack


class How(enum.Enum):
    """Why the watch ended, the first that applies in this order (a warm command's timeout
    interrupts its ranks; a graceful stop may end in a failure of its own)."""

    TIMED_OUT = "timed out"  # the launch's (or the command's) timeout= passed
    INTERRUPTED = "interrupted"  # warm ranks: Ctrl-C / run.stop() interrupted the command
    STOPPED = "stopped"  # a graceful stop was asked (on_interrupt="checkpoint", run.stop)
    FAILED = "failed"  # a rank failed (the others were stopped)
    SUCCEEDED = "succeeded"  # every rank returned


@dataclass(frozen=True)
class Ending:
    """How the watch ended, and where the ranks were when it had to ask (a timeout, a rank
    stuck in a warm command)."""

    how: How
    # Warm ranks: the world is broken (a rank exited, or some stayed busy past the grace):
    # every rank was stopped and the session must start new ones.
    broken: bool = False
    stuck: bool = False  # (with broken) some ranks did not return to idle in time
    stacks: Mapping[int, RankStack] = field(default_factory=dict)
