"""Ranks on a cluster (``notebook_launcher(..., cluster=...)``): a new way to place ranks and
move their bytes behind the rank group's Backend seam, not a new lifecycle.

- ``spec``: ``RayCluster`` (what ``cluster=`` says) and the checks made before anything starts;
- ``ray_backend``: the Backend (placement group, one actor per rank, env as torchrun sets it)
  and the one-shot launch path;
- ``ray_node``: the actor on each node that runs the real rank as its child;
- ``relay``: the kernel side of the channel (Ray calls -> local pipes the Supervisor reads).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nbtrain.kernel.cluster.spec import RayCluster, as_cluster, check_connected, check_room
from nbtrain.kernel.cluster.spec import import_ray as _import_ray
from nbtrain.kernel.config import LaunchConfig

_DEFAULTS: dict[str, Any] = {
    "start_method": "auto",
    "gpu_ids": None,
    "num_nodes": 1,
    "node_rank": 0,
    "rdzv_endpoint": None,
}


def launch_on_cluster(
    cluster: object,
    config: LaunchConfig,
    function: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    *,
    given: dict[str, Any],
) -> Any:
    """Check ``cluster=`` against the launch and the cluster, then run the ranks there."""
    __tracebackhide__ = True
    max_restarts = given.pop("max_restarts")  # checked by build_config: a whole number >= 0
    chosen = resolve(cluster, config, given)
    from nbtrain.kernel.cluster.ray_backend import run_on_ray

    return run_on_ray(config, chosen, function, args, kwargs, max_restarts=max_restarts)


def resolve(cluster: object, config: LaunchConfig, given: dict[str, Any]) -> RayCluster:
    """``cluster=`` checked against the other options (``given``: as the user gave them) and
    against the Ray cluster this kernel is connected to, before anything starts."""
    chosen = as_cluster(cluster)
    if given.pop("num_processes") is None:  # one per local GPU means nothing on a cluster
        raise ValueError(
            f"cluster={cluster!r} needs num_processes=: how many ranks Ray should place."
        )
    for name, value in given.items():
        if value != _DEFAULTS[name]:
            raise ValueError(
                f"{name}={value!r} does not apply to cluster={cluster!r}: Ray places the ranks "
                f"(leave {name} out; see notebooks/guides/cluster.md for what works on a "
                "cluster so far)."
            )
    ray = _import_ray()
    check_connected(ray)
    check_room(chosen, config.num_processes, ray.cluster_resources())
    return chosen


__all__ = ["RayCluster", "launch_on_cluster", "resolve"]
