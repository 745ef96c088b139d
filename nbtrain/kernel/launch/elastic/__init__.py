"""How the nodes of one launch meet and agree: torch's elastic rendezvous, plus a verdict.

torch's elastic agent (``agent.py``; the verdict every node agrees on: ``verdicts.py``) runs
the attempt loop; this package gives it a rendezvous handler and what nbtrain adds on top of
it, all kept in the store of torch's own rendezvous round (so nothing here is a cluster layer
of its own):

1. Node 0 hosts the c10d rendezvous store on ``rdzv_endpoint``'s port; the other nodes wait
   until it answers ("waiting for node 0 at HOST:PORT"). Every node counts itself in (the
   "waiting for nodes (k of N joined)" status) while torch's ``DynamicRendezvousHandler`` forms
   the round (join, last call, heartbeats).
2. In the round's store each node publishes its launch options, and all nodes check them: node
   ranks 0..N-1 each taken once, the same num_processes, num_nodes and max_restarts everywhere.
   torch orders nodes by its own descriptors; nbtrain keeps the user's ``node_rank``, so node k
   always runs global ranks k*P .. k*P+P-1.
3. Node 0 opens a fresh worker store for the attempt on a port the OS picks and publishes the
   port; every rank gets MASTER_ADDR = the endpoint's host (reachable from every node by
   definition), MASTER_PORT = that port, and connects as a client (TORCHELASTIC_USE_AGENT_STORE,
   as under torchrun), so plain ``init_process_group`` works and a restart never reads keys left
   by the failed attempt.
4. The news: the first failure or stop of an attempt is written to the round's ``news`` key
   with compare-and-set. The first writer wins, so every node reaches the same verdict and
   reports the same root cause with its traceback; torch's agent alone would leave each node to
   find out from broken connections.
5. Every node counts its ranks' success in ``done``; the agent reports success once all nodes
   did, so a failure on a slower node still restarts or fails every node. Nodes bump a beat
   counter while they supervise, so a node whose kernel died after its ranks finished is noticed.

One node with ``max_restarts > 0`` uses the same agent with a ``LocalCoordinator``: an
in-process rendezvous handler and store, and a fresh loopback worker store per attempt.

``ElasticAgent`` is the launch kind (options/interface.py); it imports the agent (agent.py, and
with it torch's elastic package) only when a launch runs through it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from nbtrain.kernel.specs.payload import prepare_call

if TYPE_CHECKING:
    from nbtrain.kernel.options.interface import LaunchOptions, UserCall


class ElasticAgent:
    """The launch kind of several nodes, restarts, or ``nbtrain launch``: torch's agent."""

    no_stop_resume: ClassVar[str] = (
        "through torch's elastic agent (num_nodes > 1 or max_restarts > 0)"
    )
    no_background: ClassVar[str] = ""

    def __init__(self, options: LaunchOptions) -> None:
        # (config.py checked the nodes; elastic/news.py checks them across nodes)
        self.options = options

    def run(self, call: UserCall) -> Any:
        __tracebackhide__ = True
        from nbtrain.kernel.launch.elastic.agent import run_elastic  # torch's agent and rendezvous

        config = self.options.config
        return run_elastic(config, prepare_call(*call, config.start.method))


__all__ = ["ElasticAgent"]
