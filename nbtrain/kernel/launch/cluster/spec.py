"""``cluster=``: which cluster a launch places its ranks on, checked before anything starts.

``RayCluster`` is the public description (``cluster="ray"`` is ``RayCluster()``); ``resolve``
checks it against the launch and against the Ray cluster the kernel is connected to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

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


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise ImportError(
            "cluster='ray' needs Ray in this kernel: pip install nbtrain[ray] (then "
            "ray.init(address=...) to connect to your cluster)."
        ) from None
    return ray


def check_connected(ray: ModuleType) -> None:
    if not ray.is_initialized():
        raise RuntimeError(
            "cluster='ray' found no Ray connection in this kernel: connect first with "
            "ray.init(address='auto') on a machine of the cluster, or "
            "ray.init('ray://<head>:10001') from outside it (start a cluster with "
            "`ray start --head`; see the guide notebooks/guides/cluster.md)."
        )


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
