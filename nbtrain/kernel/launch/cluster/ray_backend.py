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
import dataclasses
from collections.abc import Callable
from typing import Any

from nbtrain.kernel.group import RankGroup
from nbtrain.kernel.group.ending import How
from nbtrain.kernel.launch.cluster.checks import check_shared, check_versions, shared_paths
from nbtrain.kernel.launch.cluster.ray_node import installed
from nbtrain.kernel.launch.cluster.relay import Node, Relay, RemoteRank, local_pipes
from nbtrain.kernel.launch.cluster.spec import PLACEMENTS, RayCluster
from nbtrain.kernel.options.config import LaunchConfig
from nbtrain.kernel.options.stopping import resumed
from nbtrain.kernel.procs.handles import RankProcess
from nbtrain.kernel.run.lifecycle import Run
from nbtrain.kernel.specs.payload import PreparedCall
from nbtrain.kernel.specs.rankspec import rank_spec
from nbtrain.shared.errors import WorkerError
from nbtrain.shared.specs import RankInfo, RankSpec


def run_on_ray(config: LaunchConfig, cluster: RayCluster, call: PreparedCall) -> Any:
    """A one-shot launch of ``config.num_processes`` ranks placed by Ray (checked already),
    each running ``call`` (prepared with ``local=False``: all in its bytes). After a failure
    (a rank's error, a lost node), every rank is placed again and restarted, from the newest
    checkpoint where the launch saves them, up to ``config.max_restarts`` times."""
    __tracebackhide__ = True
    max_restarts = config.max_restarts
    ranks = list(range(config.num_processes))
    run = Run(config, ranks, title=f"{len(ranks)} ranks on a Ray cluster")
    for attempt in range(max_restarts + 1):
        backend = RayRanks(config, cluster, call.data, say=run.say, started=_clock(run))
        ending = run.supervise(RankGroup(backend))
        # (restarted: a failure of the ranks' own, not a stop, an interrupt or a timeout)
        if ending.how is not How.FAILED or attempt == max_restarts:
            break
        error = backend.named(run.outcome.error())
        run.say(f"restarting every rank (restart {attempt + 1} of {max_restarts}): "
                f"{str(error).splitlines()[0]}")
        config = dataclasses.replace(config, stopping=resumed(config.stopping))
        run.config = config
        run.new_attempt()
    try:
        return run.finish(ending)
    except WorkerError as error:  # the root cause's node, by name; its traceback kept
        raise backend.named(error) from error.__cause__


def _clock(run: Run) -> Callable[[], None]:
    """``timeout=`` from the ranks' start: Ray's wait for room and the actors' start (seconds
    on a busy cluster) are not the function's time."""

    def restart() -> None:
        run.deadline = None
        run.start_clock()

    return restart


class RayRanks:
    """The Backend (group/backend.py) of ranks placed on a Ray cluster."""

    def __init__(
        self,
        config: LaunchConfig,
        cluster: RayCluster,
        payload: bytes | None,
        say: Callable[[str], None],
        started: Callable[[], None] = lambda: None,
    ) -> None:
        """``payload`` None: warm ranks (kernel/warm/), which get their commands through
        ``senders()``."""
        self.config = config
        self.cluster = cluster
        self.payload = payload
        self.say = say
        self.started = started  # every rank runs: timeout= counts from here, not from placing
        self.group: Any = None  # the placement group
        self.actors: list[Any] = []
        self.nodes: dict[int, Node] = {}  # rank -> where it runs
        self._node_ranks: dict[str, int] = {}  # Ray node id -> NODE_RANK
        self.relay: Relay | None = None
        self.hosts: dict[int, Any] = {}  # rank -> its actor
        self.handles: dict[int, RemoteRank] = {}  # rank -> its process handle (holds the actor)

    def node_rank(self, rank: int) -> int:
        return self._node_ranks[self.nodes[rank].node_id]

    def named(self, error: WorkerError) -> WorkerError:
        """``error`` with its root cause's node: hostname, IP and Ray node id."""
        node = self.nodes.get(error.rank)
        if node is not None:
            error.node, error.host = self.node_rank(error.rank), node.describe()
            error.args = (str(error),)
        return error

    def start(self) -> list[RankProcess]:
        import ray

        count = self.config.num_processes
        self.group = self._place(ray, count)
        host_class = _remote_host(ray)
        strategy = ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy
        self.actors = [
            host_class.options(
                num_cpus=self.cluster.cpus_per_rank,
                num_gpus=self.cluster.gpus_per_rank,
                runtime_env=self.cluster.runtime_env,
                scheduling_strategy=strategy(self.group, placement_group_bundle_index=index),
            ).remote()
            for index in range(count)
        ]
        answers = self._ask(ray, [actor.where.remote() for actor in self.actors])
        places = [Node(*answer[:3]) for answer in answers]
        check_versions(installed(), {Node(*answer[:3]): answer[3] for answer in answers})
        self._check_shared(ray, places)
        # Ranks node by node (nodes in the order of their first bundle): a node's ranks are
        # consecutive, as torchrun numbers them.
        order = list(dict.fromkeys(place.node_id for place in places))
        self._node_ranks = {node_id: index for index, node_id in enumerate(order)}
        bundles = sorted(range(count), key=lambda i: (self._node_ranks[places[i].node_id], i))
        hosts = {rank: self.actors[bundle] for rank, bundle in enumerate(bundles)}
        self.nodes = {rank: places[bundle] for rank, bundle in enumerate(bundles)}
        self.say(f"{count} ranks placed on {len(order)} node(s); starting them")
        port = ray.get(hosts[0].free_port.remote())
        # once: each node's store serves its ranks
        data = None if self.payload is None else ray.put(self.payload)
        specs = self._specs(self.nodes[0].ip, port)
        handles = {rank: RemoteRank(hosts[rank], self.nodes[rank]) for rank in hosts}
        pids = ray.get([hosts[rank].start.remote(specs[rank], data) for rank in range(count)])
        started = []
        for rank, pid in enumerate(pids):
            handles[rank].pid = pid
            started.append(RankProcess(rank, handles[rank], local_pipes()))
        self.hosts, self.handles = hosts, handles
        self.relay = Relay(started, handles)
        self.relay.start()
        self.started()
        return started

    def senders(self) -> dict[int, CommandSender]:
        """Warm ranks: each rank's command channel (a call to its actor)."""
        return {rank: CommandSender(self, rank) for rank in self.hosts}

    def _check_shared(self, ray: Any, places: list[Node]) -> None:
        """Checkpoints on a cluster: every node must see the kernel's checkpoint folder."""
        with shared_paths(self.config.stopping) as paths:
            if not paths:
                return
            first = {place: index for index, place in reversed(list(enumerate(places)))}
            seen = ray.get([self.actors[index].sees.remote(paths) for index in first.values()])
            check_shared(paths, dict(zip(first, seen, strict=True)))

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
        """Kill every actor (its rank dies with it), remove the placement group, and let go of
        every actor handle: a handle kept (by this backend, kept itself by a traceback IPython
        keeps or by stopped warm ranks) stays listed as an object of the kernel's Ray job."""
        import ray

        if self.relay is not None:
            self.relay.close()
        for actor in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        if self.group is not None:
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(self.group)
        for handle in self.handles.values():
            handle.actor = None
        self.actors, self.group, self.hosts, self.handles, self.relay = [], None, {}, {}, None


class CommandSender:
    """A warm rank's command pipe, as the session uses one (send_bytes, close): a call to the
    rank's actor, which writes the bytes into the rank's local pipe on its node. It asks the
    backend for the actor each time: once closed, the backend holds none (nothing to send to)."""

    def __init__(self, ranks: RayRanks, rank: int) -> None:
        self.ranks = ranks
        self.rank = rank

    def send_bytes(self, data: bytes) -> None:
        actor = self.ranks.hosts.get(self.rank)
        if actor is not None:
            actor.command.remote(data)  # not waited for: in order, behind earlier calls

    def close(self) -> None:
        pass  # the actor's end goes with the actor (close() kills it)


def _remote_host(ray: Any) -> Any:
    """The rank actor's class, made remote for this launch. On a Ray Client, by the client's own
    ``remote``: the class ``ray.remote`` makes is converted by the client on its first use and
    kept for the connection's life, with a copy of the class in the object store per launch
    (listed as the kernel's, after every actor is gone); the client's stub goes with the launch
    and its copy with it."""
    from ray.util.client import ray as client

    from nbtrain.kernel.launch.cluster.ray_node import RankHost

    return client.remote(RankHost) if client.is_connected() else ray.remote(RankHost)


__all__ = ["CommandSender", "RayRanks", "run_on_ray"]
