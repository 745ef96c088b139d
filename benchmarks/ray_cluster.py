"""Ranks on a Ray cluster: a two-node ``ray.cluster_utils.Cluster`` on this machine (two raylets,
2 CPUs each), one rank per node (SPREAD). Alternated in one run:

    nbtrain notebook_launcher(cluster=RayCluster(placement="spread"))
    Ray Train TorchTrainer(ScalingConfig(num_workers=2, placement_strategy="SPREAD")).fit()

both running the same DDP training (gloo, a linear model, STEPS steps), each launch from the
placement of its ranks to the value back in this process; and a warm cell on warm ranks across
the two nodes (``start_ranks(2, cluster=...)``: one all_reduce through ``run_cell``).

    python benchmarks/ray_cluster.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time

import cloudpickle
import torch
import torch.distributed as dist
from common import alternate, ray_head_args, table

import nbtrain

STEPS = 50


def training() -> float:
    """The training both launchers run, in a process group already formed."""
    torch.manual_seed(dist.get_rank())
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(STEPS):
        loss = model(torch.randn(16, 32)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(loss.item())


def nbtrain_rank() -> float:
    dist.init_process_group("gloo")  # from torchrun's variables, which nbtrain sets
    try:
        return training()
    finally:
        dist.destroy_process_group()


def ray_train_worker(config: dict) -> None:
    import ray.train

    ray.train.report({"loss": training()})  # Ray Train formed the process group


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    import ray
    from ray.cluster_utils import Cluster
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the nodes lack benchmarks/
    began = time.perf_counter()
    cluster = Cluster()
    head = ray_head_args()
    cluster.add_node(num_cpus=2, **head)
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    print(f"two-node cluster up in {time.perf_counter() - began:.1f}s")
    storage = tempfile.mkdtemp(prefix="nbtrain-bench-ray-")
    spread = nbtrain.RayCluster(placement="spread")
    try:
        def nbtrain_launch() -> None:
            nbtrain.notebook_launcher(nbtrain_rank, num_processes=2, cluster=spread,
                                      progress="off", output="none")

        def ray_train_fit() -> None:
            TorchTrainer(
                ray_train_worker,
                scaling_config=ScalingConfig(num_workers=2, placement_strategy="SPREAD"),
                run_config=RunConfig(storage_path=storage),
            ).fit()

        samples = alternate(
            {"Ray Train TorchTrainer.fit()": ray_train_fit,
             "nbtrain notebook_launcher(cluster=)": nbtrain_launch},
            options.rounds,
        )
        print(f"\nLaunch round trip, 2 ranks on 2 nodes, {STEPS} DDP steps, "
              f"{options.rounds} alternated rounds\n")
        print(table(samples, baseline="Ray Train TorchTrainer.fit()"))
        began = time.perf_counter()
        ranks = nbtrain.start_ranks(2, cluster=spread, progress="off")
        started = time.perf_counter() - began
        try:
            ranks.run_cell("import torch, torch.distributed as dist\n"
                           "dist.init_process_group('gloo')")
            cells = []
            for _ in range(max(5, options.rounds)):
                began = time.perf_counter()
                ranks.run_cell("t = torch.ones(1)\ndist.all_reduce(t)")
                cells.append(time.perf_counter() - began)
        finally:
            ranks.stop()
        print(f"\nWarm ranks on 2 nodes: started in {started:.1f}s; a cell with one "
              f"all_reduce: median {statistics.median(cells):.3f}s, min {min(cells):.3f}s "
              f"over {len(cells)} cells")
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(str(head["temp_dir"]), ignore_errors=True)


if __name__ == "__main__":
    main()
