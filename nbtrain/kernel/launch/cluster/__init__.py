"""Ranks on a cluster (``notebook_launcher(..., cluster=...)``): a new way to place ranks and
move their bytes behind the rank group's Backend seam, not a new lifecycle.

- here: ``RayLaunch``, the launch kind (options/interface.py), and ``resolve``: ``cluster=`` checked
  against the other options and the connected Ray cluster (also for warm ranks);
- ``spec``: ``RayCluster`` (what ``cluster=`` says) and the checks made before anything starts;
- ``ray_backend``: the Backend (placement group, one actor per rank, env as torchrun sets it)
  and the one-shot launch path;
- ``ray_node``: the actor on each node that runs the real rank as its child;
- ``relay``: the kernel side of the channel (Ray calls -> local pipes the Supervisor reads).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, ClassVar

from nbtrain.kernel.launch.cluster.spec import RayCluster, as_cluster, check_room, connected_ray
from nbtrain.kernel.options.config import LaunchConfig
from nbtrain.kernel.specs.payload import prepare_call, released
from nbtrain.shared.options import StartMethod

if TYPE_CHECKING:
    from nbtrain.kernel.options.interface import LaunchOptions, UserCall
    from nbtrain.kernel.options.requested import Requested

# The options a cluster does not take (yet), as the launcher's defaults: given otherwise, an
# error names them (checked in this order).
_DEFAULTS: dict[str, Any] = {
    "start_method": "auto",
    "gpu_ids": None,
    "num_nodes": 1,
    "node_rank": 0,
    "rdzv_endpoint": None,
}


class RayLaunch:
    """The launch kind (options/interface.py) of ranks placed by Ray (``cluster=``)."""

    no_stop_resume: ClassVar[str] = ""  # (cluster/checks.py: every node must see the folder)
    no_background: ClassVar[str] = ""  # the watch loop in the run's thread, as for local ranks

    def __init__(self, options: LaunchOptions) -> None:
        requested = options.requested
        self.cluster = resolve(requested.cluster, options.config, requested)
        self.options = options

    def run(self, call: UserCall) -> Any:
        """Run the ranks there: after a failure, placed again up to ``max_restarts`` times."""
        __tracebackhide__ = True
        from nbtrain.kernel.launch.cluster.ray_backend import run_on_ray

        # all in the pickle, no segment: this machine's /dev/shm is not the nodes'
        prepared = prepare_call(*call, StartMethod.SPAWN, local=False)
        return released(prepared, functools.partial(run_on_ray, self.options.config, self.cluster))


def resolve(cluster: object, config: LaunchConfig, requested: Requested) -> RayCluster:
    """``cluster=`` checked against the other options (``requested``: as the user gave them)
    and against the Ray cluster this kernel is connected to, before anything starts."""
    chosen = as_cluster(cluster)
    if requested.num_processes is None:  # one per local GPU means nothing on a cluster
        raise ValueError(
            f"cluster={cluster!r} needs num_processes=: how many ranks Ray should place."
        )
    for name, default in _DEFAULTS.items():
        value = getattr(requested, name)
        if value != default:
            raise ValueError(
                f"{name}={value!r} does not apply to cluster={cluster!r}: Ray places the ranks "
                f"(leave {name} out; see notebooks/guides/cluster.md for what works on a "
                "cluster so far)."
            )
    ray = connected_ray()  # before Ray's import, where there can be no connection
    check_room(chosen, config.num_processes, ray.cluster_resources())
    return chosen


__all__ = ["RayCluster", "RayLaunch", "resolve"]
