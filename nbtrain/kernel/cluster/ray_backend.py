"""Ranks on a Ray cluster: a rank group backend (placement and transport), and the launch path.

``RayRanks.start``: one placement group (a bundle per rank, PACK or SPREAD), one ``RankHost``
actor per bundle (ray_node.py), ranks numbered node by node (the ranks of a node are
consecutive, NODE_RANK in order of the nodes' first bundle), MASTER_ADDR = rank 0's node IP and
MASTER_PORT picked free there, as torchrun does; the payload is put once in Ray's object store
and read by every actor from its node's store. Each rank then starts on its node and its bytes
come back through the relay (relay.py) into local pipes: the RankGroup's Supervisor, Ctrl-C
policy and teardown are the ones every launch uses. ``close`` kills every actor (their ranks die
with them) and removes the placement group, whatever the outcome.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from nbtrain.kernel import processes
from nbtrain.kernel.cluster.relay import Node, Relay, RemoteRank, local_pipes
from nbtrain.kernel.cluster.spec import PLACEMENTS, RayCluster
from nbtrain.kernel.config import LaunchConfig
from nbtrain.kernel.group import RankGroup
from nbtrain.kernel.rankspec import rank_spec
from nbtrain.kernel.run import Run
from nbtrain.shared import sharedmem
from nbtrain.shared.errors import WorkerError
from nbtrain.shared.serialization import describe_payload_error
from nbtrain.shared.specs import RankInfo, RankSpec


def run_on_ray(
    config: LaunchConfig,
    cluster: RayCluster,
    function: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
) -> Any:
    """A one-shot launch of ``config.num_processes`` ranks placed by Ray (checked already)."""
    __tracebackhide__ = True
    call = (function, args, kwargs)
    try:  # no segment: /dev/shm of this machine is not the nodes'
        payload = sharedmem.dumps(sharedmem.Envelope(call, None))
    except Exception as exc:
        raise describe_payload_error(function, args, kwargs, exc) from None
    ranks = list(range(config.num_processes))
    run = Run(config, ranks, title=f"{len(ranks)} ranks on a Ray cluster")
    backend = RayRanks(config, cluster, payload, say=run.say)
    try:
        return run.finish(run.supervise(RankGroup(backend)))
    except WorkerError as error:  # the root cause's node, by name
        node = backend.nodes.get(error.rank)
        if node is not None:
            error.node, error.host = backend.node_rank(error.rank), node.describe()
            error.args = (str(error),)
        raise


class RayRanks:
    """The Backend (group/backend.py) of ranks placed on a Ray cluster."""

    def __init__(
        self,
        config: LaunchConfig,
        cluster: RayCluster,
        payload: bytes,
        say: Callable[[str], None],
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.payload = payload
        self.say = say
        self.group: Any = None  # the placement group
        self.actors: list[Any] = []
        self.nodes: dict[int, Node] = {}  # rank -> where it runs
        self._node_ranks: dict[str, int] = {}  # Ray node id -> NODE_RANK
        self.relay: Relay | None = None

    def node_rank(self, rank: int) -> int:
        return self._node_ranks[self.nodes[rank].node_id]

    def start(self) -> list[processes.RankProcess]:
        import ray

        count = self.config.num_processes
        self.group = self._place(ray, count)
        host_class: Any = ray.remote(_host_class())
        strategy = ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy
        self.actors = [
            host_class.options(
                num_cpus=self.cluster.cpus_per_rank,
                num_gpus=self.cluster.gpus_per_rank,
                scheduling_strategy=strategy(self.group, placement_group_bundle_index=index),
            ).remote()
            for index in range(count)
        ]
        places = [Node(*where) for where in self._ask(ray, [a.where.remote() for a in self.actors])]
        # Ranks node by node (nodes in the order of their first bundle): a node's ranks are
        # consecutive, as torchrun numbers them.
        order = list(dict.fromkeys(place.node_id for place in places))
        self._node_ranks = {node_id: index for index, node_id in enumerate(order)}
        bundles = sorted(range(count), key=lambda i: (self._node_ranks[places[i].node_id], i))
        hosts = {rank: self.actors[bundle] for rank, bundle in enumerate(bundles)}
        self.nodes = {rank: places[bundle] for rank, bundle in enumerate(bundles)}
        self.say(f"{count} ranks placed on {len(order)} node(s); starting them")
        port = ray.get(hosts[0].free_port.remote())
        data = ray.put(self.payload)  # once: each node's store serves its ranks
        specs = self._specs(self.nodes[0].ip, port)
        handles = {rank: RemoteRank(hosts[rank], self.nodes[rank]) for rank in hosts}
        pids = ray.get([hosts[rank].start.remote(specs[rank], data) for rank in range(count)])
        started = []
        for rank, pid in enumerate(pids):
            handles[rank].pid = pid
            started.append(processes.RankProcess(rank, handles[rank], local_pipes()))
        self.relay = Relay(started, handles)
        self.relay.start()
        return started

    def _ask(self, ray: Any, calls: list[Any]) -> list[Any]:
        """The actors' first answers; an actor that could not start says why, in words."""
        try:
            return list(ray.get(calls))
        except ray.exceptions.RayActorError as exc:
            raise RuntimeError(
                "nbtrain's rank actors could not start on the Ray cluster: check that the "
                "nodes have the same Python, torch and nbtrain as this kernel (pip install "
                f"nbtrain[ray] there). Ray said: {str(exc).strip().splitlines()[0]}"
            ) from None

    def _place(self, ray: Any, count: int) -> Any:
        """The placement group, ready; a clear error (naming what is free) after a short wait."""
        from ray.util.placement_group import placement_group

        group = placement_group(
            [dict(self.cluster.bundle) for _ in range(count)],
            strategy=PLACEMENTS[self.cluster.placement],
        )
        self.group = group  # removed by close() even if the wait below is interrupted
        wait = self.cluster.placement_wait
        self.say(f"waiting for Ray to place {count} ranks")
        if group.wait(timeout_seconds=wait):
            return group
        free = ", ".join(
            f"{amount:g} {name}" for name, amount in sorted(ray.available_resources().items())
            if name in ("CPU", "GPU")
        )
        raise RuntimeError(
            f"the Ray cluster found no room for num_processes={count} ranks of "
            f"{self.cluster.bundle} each within {wait:g}s (placement="
            f"{self.cluster.placement!r}); free now: {free or 'nothing'}. Lower "
            "num_processes or cpus_per_rank/gpus_per_rank, wait for other jobs to end, or add "
            "nodes (RayCluster(placement_wait=...) waits longer)."
        )

    def _specs(self, master_addr: str, master_port: int) -> dict[int, RankSpec]:
        count = self.config.num_processes
        per_node: dict[str, list[int]] = {}
        for rank in range(count):
            per_node.setdefault(self.nodes[rank].node_id, []).append(rank)
        threads = max(1, int(self.cluster.cpus_per_rank))
        rendezvous = {"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)}
        specs = {}
        for rank in range(count):
            node_id = self.nodes[rank].node_id
            local, node_rank = per_node[node_id], self._node_ranks[node_id]
            info = RankInfo(
                rank, local.index(rank), count, len(local), node_rank, len(self._node_ranks)
            )
            specs[rank] = rank_spec(
                self.config,
                info,
                rendezvous=rendezvous,
                # Ray sets the actor's CUDA_VISIBLE_DEVICES to its own GPU(s): the rank's cuda:0.
                device="cuda:0" if self.cluster.gpus_per_rank else "cpu",
                threads=threads,
                finalizes=True,  # spawned
                extra_env={"NODE_RANK": str(node_rank), "NBTRAIN_RAY_NODE_ID": node_id},
            )
        return specs

    def close(self) -> None:
        """Kill every actor (its rank dies with it) and remove the placement group."""
        import ray

        if self.relay is not None:
            self.relay.close()
        for actor in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        if self.group is not None:
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(self.group)
        self.actors, self.group = [], None


def _host_class() -> type:
    from nbtrain.kernel.cluster.ray_node import RankHost

    return RankHost


__all__ = ["RayRanks", "run_on_ray"]
