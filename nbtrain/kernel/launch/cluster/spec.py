"""``cluster=``: which cluster a launch places its ranks on, checked before anything starts.

``RayCluster`` is the public description (``cluster="ray"`` is ``RayCluster()``); ``resolve``
checks it against the launch and against the Ray cluster the kernel is connected to.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from nbtrain.kernel.host import environment
from nbtrain.shared.frontend import Frontend, frontend

PLACEMENTS = {"pack": "PACK", "spread": "SPREAD"}
PLACEMENT_WAIT = 10.0  # seconds a launch waits for the cluster to have room for its ranks


@dataclass(frozen=True)
class RayCluster:
    """Ranks placed by Ray: one placement group, a bundle of ``cpus_per_rank`` CPUs and
    ``gpus_per_rank`` GPUs per rank; ``placement="pack"`` fills a node before the next,
    ``"spread"`` puts ranks on as many nodes as it can. ``placement_wait``: seconds to wait for
    room before the launch fails, naming what is free. ``runtime_env``: Ray's runtime
    environment for the rank actors (and so their ranks): ``{"pip": [...]}``,
    ``{"env_vars": {...}}``, ``{"working_dir": ...}``, as Ray documents it."""

    cpus_per_rank: float = 1
    gpus_per_rank: float = 0
    placement: str = "pack"
    placement_wait: float = PLACEMENT_WAIT
    runtime_env: dict[str, Any] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        for name in ("cpus_per_rank", "gpus_per_rank", "placement_wait"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"RayCluster({name}={value!r}): give a number >= 0.")
        if self.cpus_per_rank == 0 and self.gpus_per_rank == 0:
            raise ValueError(
                "RayCluster(cpus_per_rank=0, gpus_per_rank=0): a rank needs a CPU or a GPU; "
                "give cpus_per_rank >= 1 (the default) or gpus_per_rank >= 1."
            )
        if self.runtime_env is not None and not isinstance(self.runtime_env, dict):
            raise TypeError(
                f"RayCluster(runtime_env={self.runtime_env!r}): give a dict, as ray.init's "
                "runtime_env, e.g. {'pip': ['transformers'], 'env_vars': {'HF_HOME': '/data'}}."
            )
        if self.placement not in PLACEMENTS:
            raise ValueError(
                f"RayCluster(placement={self.placement!r}) is not a valid choice: pass "
                + " or ".join(repr(name) for name in PLACEMENTS)
                + "."
            )

    @property
    def bundle(self) -> dict[str, float]:
        """What one rank reserves on its node."""
        bundle = {"CPU": float(self.cpus_per_rank)}
        if self.gpus_per_rank:
            bundle["GPU"] = float(self.gpus_per_rank)
        return {name: amount for name, amount in bundle.items() if amount}


def as_cluster(cluster: object) -> RayCluster:
    """``cluster=`` as given to the launcher (bad input: an error naming it)."""
    if isinstance(cluster, RayCluster):
        return cluster
    if cluster == "ray":
        return RayCluster()
    raise ValueError(
        f"cluster={cluster!r} is not a cluster nbtrain knows: pass cluster='ray' or "
        "cluster=nbtrain.RayCluster(...) (or leave it out for ranks on this machine)."
    )


def connected_ray() -> ModuleType:
    """Ray, connected (``ray.init`` called in this process), or an error saying how to connect.

    Decided without importing Ray where it cannot be connected: ``ray.init`` imports it, so
    with no ``ray`` module loaded there is no connection, and the error comes in milliseconds
    instead of after Ray's import (4-11 s on a loaded machine)."""
    ray = sys.modules.get("ray")
    if ray is None:
        if importlib.util.find_spec("ray") is None:  # None too when sys.modules["ray"] is None
            raise ImportError(
                f"cluster='ray' needs Ray in {_here()}: pip install 'nbtrain[ray]' (from a "
                "clone of nbtrain: pip install -e '.[ray]'), then connect with ray.init(...)."
            )
        raise _not_connected()
    if not ray.is_initialized():
        raise _not_connected()
    return ray


def _not_connected() -> RuntimeError:
    return RuntimeError(
        f"cluster='ray' found no Ray connection in {_here()}: connect first with "
        "ray.init(address='auto') on a machine of the cluster, or "
        f"ray.init('ray://<head>:10001') from outside it{_address_hint()} (start a cluster "
        "with `ray start --head`; see the guide notebooks/guides/cluster.md)."
    )


def _here() -> str:
    """Where the user is, in words that fit it: a notebook's kernel, IPython, or a script."""
    where = frontend()
    if where is Frontend.JUPYTER:
        return "this kernel (call it in a cell before the launch)"
    if where is Frontend.IPYTHON:
        return "this IPython session"
    return "this Python process (call it in your script before the launch)"


def _address_hint() -> str:
    """A cluster this machine knows of, read cheaply (no Ray import): RAY_ADDRESS, or the
    address file ``ray start`` writes (ray_current_cluster in Ray's temp folder)."""
    address = environment.variables().get("RAY_ADDRESS", "").strip()
    if address:
        return f"; RAY_ADDRESS is set ({address!r}): ray.init() connects to it"
    try:
        found = (Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster").read_text().strip()
    except OSError:
        return ""
    return f"; a cluster started on this machine is at {found!r}: ray.init() connects to it"


def check_room(cluster: RayCluster, ranks: int, total: dict[str, Any]) -> None:
    """The cluster must have, in all, what ``ranks`` ranks reserve (free or not)."""
    for name, per_rank in cluster.bundle.items():
        have = float(total.get(name, 0))
        if per_rank * ranks <= have:
            continue
        option = "gpus_per_rank" if name == "GPU" else "cpus_per_rank"
        if name == "GPU" and not have:
            raise ValueError(
                f"gpus_per_rank={per_rank:g}: the Ray cluster has no GPUs "
                "(ray.cluster_resources() lists none): leave gpus_per_rank out for CPU ranks, "
                "or connect to a cluster whose nodes have GPUs (Ray counts a node's GPUs when "
                "`ray start` runs there)."
            )
        raise ValueError(
            f"num_processes={ranks} with {option}={per_rank:g} needs {per_rank * ranks:g} "
            f"{name}s, but the Ray cluster has {have:g} in all: lower num_processes or "
            f"{option}, or add nodes to the cluster."
        )
