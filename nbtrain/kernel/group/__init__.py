"""The rank group: the one owner of a set of rank processes, whatever the launch kind.

``RankGroup`` (rankgroup.py) starts the ranks through a backend, opens the channel (the
``Supervisor`` that reads their pipes; ``CellSupervisor``, cell.py, for warm ranks), runs the one
watch loop under the one Ctrl-C policy (interrupts.py) and returns how it ended (``Ending``,
ending.py), answers where each rank is (stacks; whereabouts.py), stops them (terminate, grace,
kill) and closes them. A backend (backend.py) says only where ranks are placed and how their
bytes travel: ``LocalProcesses`` (processes of this machine, pipes and /dev/shm) serves the plain
local launch, torch_xla's host process and the warm ranks; a cluster backend implements the same
two methods.

Users: ``run.Run.supervise`` (one-shot local, XLA and Ray launches), the warm ranks (warm/:
one command at a time on the same group) and the elastic agent (elastic/agent.py: one group per
attempt, stepped from torch's own monitor loop). The in-process path (inprocess.py) has no
processes; it ends through the same ``Run.finish`` (an ``Ending`` of the same kind).
"""

from nbtrain.kernel.group.backend import Backend, LocalProcesses
from nbtrain.kernel.group.ending import Ending, How
from nbtrain.kernel.group.interrupts import STOPPING, Interrupts, sigint_deferred
from nbtrain.kernel.group.rankgroup import EXIT_WAIT, GRACE, RankGroup

__all__ = [
    "EXIT_WAIT",
    "GRACE",
    "STOPPING",
    "Backend",
    "Ending",
    "How",
    "Interrupts",
    "LocalProcesses",
    "RankGroup",
    "sigint_deferred",
]
