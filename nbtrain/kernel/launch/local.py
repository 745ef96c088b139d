"""Ranks on this machine: the plain launch kind (``num_processes >= 2``, or ``gpu_ids=``; one
node, no restarts).

``LocalRanks`` (a ``Launch``, options/interface.py) opens the local rendezvous, describes each
rank (``rank_specs``, also used by the elastic agent and the warm ranks) and gives a ``run.Run``
a ``RankGroup`` of local processes to start and watch.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, ClassVar

from nbtrain.kernel.group import LocalProcesses, RankGroup
from nbtrain.kernel.options.config import LaunchConfig
from nbtrain.kernel.run.lifecycle import Run
from nbtrain.kernel.specs.payload import PreparedCall, prepare_call, released
from nbtrain.kernel.specs.rankspec import rank_specs
from nbtrain.kernel.specs.rendezvous import open_local
from nbtrain.rank import rank_entry

if TYPE_CHECKING:
    from nbtrain.kernel.options.interface import LaunchOptions, UserCall


class LocalRanks:
    """The launch kind of ranks in processes of this machine."""

    no_stop_resume: ClassVar[str] = ""
    no_background: ClassVar[str] = ""

    def __init__(self, options: LaunchOptions) -> None:
        self.options = options  # (config.py checked all it needs)

    def run(self, call: UserCall) -> Any:
        __tracebackhide__ = True  # IPython shows the cell and the rank's traceback, not ours
        config = self.options.config
        prepared = prepare_call(*call, config.start.method)
        return released(prepared, functools.partial(_run_ranks, config))


def _run_ranks(config: LaunchConfig, call: PreparedCall) -> Any:
    __tracebackhide__ = True
    rendezvous = open_local(config.world_size)
    specs = rank_specs(config, rendezvous)
    ranks = list(specs)
    title = f"{len(ranks)} ranks, {config.start.method.value}"
    if config.start.note:  # auto avoided fork: say why (and where CUDA was initialised)
        title += f" ({config.start.note})"
    run = Run(config, ranks, title=title)
    backend = LocalProcesses(
        config.start.method,
        rank_entry,
        specs,
        data=lambda rank: call.data,
        # big data into shared memory, said if it takes time
        before=lambda: call.commit(run.say, len(ranks)),
        release=rendezvous.close,
        debuggable=True,  # breakpoint() in a rank: a pdb prompt in the cell
        say=run.starting,
    )
    return run.finish(run.supervise(RankGroup(backend)))
