"""The launch interface: what each kind of launch implements, and the one place that picks it.

A kind (``Launch``) runs a launch whose options were checked (``options.LaunchOptions``):

    no_stop_resume                  where on_interrupt= / checkpoint_every= / resume= do not
                                    run yet, in the refusal's words ("" where they do)
    check(options)                  what this kind refuses, before anything starts
    run(options, call)              start the ranks, watch them, end: the cell's value
                                    (``call``: the user's function and arguments, checked)

The kinds, each next to its path: ``InProcess`` (inprocess.py: one rank, the kernel itself),
``LocalRanks`` (local.py), ``XlaOrdinals`` (xla.py: torch_xla's host process),
``ElasticAgent`` (elastic/: several nodes, or restarts) and ``RayLaunch`` (cluster/).
``choose`` picks one for ``notebook_launcher``, ``debug_launcher`` and ``nbtrain launch``
alike; each kind feeds one ``run.Run`` (and, with processes, one ``group.RankGroup``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from nbtrain.kernel.cluster import RayLaunch
from nbtrain.kernel.config import LaunchConfig
from nbtrain.kernel.elastic import ElasticAgent
from nbtrain.kernel.inprocess import InProcess
from nbtrain.kernel.local import LocalRanks
from nbtrain.kernel.xla import XlaOrdinals

if TYPE_CHECKING:
    from nbtrain.kernel.options import LaunchOptions


class UserCall(NamedTuple):
    """What a launch runs: ``function(*args, **kwargs)`` (config.check_function checked it);
    a tuple, so ``prepare_call(*call, method)`` takes it as it is."""

    function: Callable[..., Any]
    args: tuple
    kwargs: dict[str, Any]


class Launch(Protocol):
    """One kind of launch (see the module docstring)."""

    @property
    def no_stop_resume(self) -> str:
        """Where stop and resume do not run yet (an error's words), "" where they do."""
        ...

    def check(self, options: LaunchOptions) -> None:
        """Refuse what this kind cannot do with these options, before anything starts."""
        ...

    def run(self, options: LaunchOptions, call: UserCall) -> Any:
        """Run ``call`` on the ranks: the value the launch returns."""
        ...


def choose(config: LaunchConfig, *, cluster: bool, elastic: bool = False) -> Launch:
    """The kind a checked configuration needs; ``elastic``: through torch's elastic agent even
    on one node without restarts (``nbtrain launch`` does)."""
    if cluster:
        return RayLaunch()
    if config.xla_device:  # torch_xla runs the ordinals in a host process of their own
        return XlaOrdinals()
    if elastic or config.multi_node or config.max_restarts:
        return ElasticAgent()
    if config.num_processes == 1 and config.gpu_ids is None:
        return InProcess()
    # gpu_ids= limits the ranks to those GPUs (CUDA_VISIBLE_DEVICES), which only a process of
    # their own can be: the kernel sees every GPU, so even one rank then runs apart from it.
    return LocalRanks()


__all__ = ["Launch", "UserCall", "choose"]
