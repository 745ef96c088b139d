"""The one place that picks the kind of a launch, and checks every option for it.

A kind implements ``options.interface.Launch``. The kinds, each next to its path: ``InProcess``
(inprocess.py: one rank, the kernel itself), ``LocalRanks`` (local.py), ``XlaOrdinals``
(xla.py: torch_xla's host process), ``ElasticAgent`` (elastic/: several nodes, or restarts)
and ``RayLaunch`` (cluster/). ``choose`` picks one for ``notebook_launcher``,
``debug_launcher`` and ``nbtrain launch`` alike, and ``build_launch`` checks every option for
it and builds it (the kind's own checks in its constructor), before anything starts: the
caller then runs it, ``launch.run(call)``. Each kind feeds one ``run.Run`` (and, with
processes, one ``group.RankGroup``).
"""

from __future__ import annotations

import dataclasses

from nbtrain.kernel.launch.cluster import RayLaunch
from nbtrain.kernel.launch.elastic import ElasticAgent
from nbtrain.kernel.launch.inprocess import InProcess
from nbtrain.kernel.launch.local import LocalRanks
from nbtrain.kernel.launch.xla import XlaOrdinals
from nbtrain.kernel.options.config import LaunchConfig
from nbtrain.kernel.options.debug import check_debug
from nbtrain.kernel.options.interface import Launch, LaunchKind, LaunchOptions
from nbtrain.kernel.options.requested import Requested
from nbtrain.kernel.options.stopping import build_policy


def choose(
    config: LaunchConfig, *, cluster: bool, elastic: bool = False, background: bool = False
) -> LaunchKind:
    """The kind a checked configuration needs (its class: what it cannot do is read before it
    is built); ``elastic``: through torch's elastic agent even on one node without restarts
    (``nbtrain launch`` does); ``background``: a launch with ``block=False``."""
    if cluster:
        return RayLaunch
    if config.xla_device:  # torch_xla runs the ordinals in a host process of their own
        return XlaOrdinals
    if elastic or config.multi_node or config.max_restarts:
        return ElasticAgent
    # One rank in the background gets a process of its own: in a thread of the kernel it would
    # share os.environ (RANK, ...), sys.stdout and the kernel's signals with the cells that run
    # meanwhile, and nothing could stop it short of its own stop points.
    if config.num_processes == 1 and config.gpu_ids is None and not background:
        return InProcess
    # gpu_ids= limits the ranks to those GPUs (CUDA_VISIBLE_DEVICES), which only a process of
    # their own can be: the kernel sees every GPU, so even one rank then runs apart from it.
    return LocalRanks


def build_launch(
    requested: Requested,
    function_name: str,
    *,
    allow_xla: bool = True,
    elastic: bool = False,
    background: bool = False,
) -> Launch:
    """The kind this launch needs, built with its options: every option checked (the kind's
    own checks in its constructor), before anything starts. ``function_name`` names the
    default project_dir; ``allow_xla`` False: CPU ranks even on an XLA host (debug_launcher);
    ``elastic``: through torch's agent (``nbtrain launch``); ``background``: ``block=False``."""
    __tracebackhide__ = True
    config = requested.config(allow_xla=allow_xla)
    kind = choose(
        config, cluster=requested.cluster is not None, elastic=elastic, background=background
    )
    policy = build_policy(
        function_name, config.world_size, requested.stop, refused=kind.no_stop_resume
    )
    debug = check_debug(requested.debug, cluster=requested.cluster, xla=bool(config.xla_device))
    config = dataclasses.replace(config, stopping=policy, debug=debug)
    return kind(LaunchOptions(requested, config))


__all__ = ["build_launch", "choose"]
