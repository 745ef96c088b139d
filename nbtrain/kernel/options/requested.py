"""A launch's options as passed (``Requested``); checked once before anything starts, they become
a ``LaunchOptions`` (interface.py), with which their kind of launch is built.

``notebook_launcher``'s parameters go into a ``Requested`` once (its defaults are the
launcher's; test_launch_options pins that); ``launch/choose.py``'s ``build_launch``
validates them in a fixed order, each error naming the argument, its value and the fix:

1. Accelerate's launcher parameters (accelerate.py) and the launch's own (config.py);
2. the launch kind they need (launch/choose.py), then the stop and resume options
   (stopping.py), refused where that kind cannot stop and resume yet;
3. ``debug=`` (debug.py), then what the chosen kind itself refuses (its constructor).

``debug_launcher``, ``nbtrain launch`` and ``start_ranks`` make a ``Requested`` too; warm ranks
use its configuration, stop options and ``cluster=`` (warm/), not a launch kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from nbtrain.kernel.options import accelerate
from nbtrain.kernel.options.config import LaunchConfig, build_config
from nbtrain.kernel.options.stopping import StopOptions


@dataclass(frozen=True)
class Requested:
    """The options as passed, unchecked (defaults: notebook_launcher's). Errors quote these
    values; a kind checks against them the options it does not take (cluster/)."""

    num_processes: object = None
    start_method: object = "auto"
    mixed_precision: object = None
    gpu_ids: object = None
    num_nodes: object = 1
    node_rank: object = 0
    rdzv_endpoint: object = None
    max_restarts: object = 0
    timeout: object = None
    hang_after: object = 300.0
    output: object = "all"
    progress: object = "auto"
    return_all: object = False
    rdzv_timeout: object = 900.0
    stop: StopOptions = field(default_factory=StopOptions)  # on_interrupt, resume, ...
    cluster: object = None
    debug: object = False
    # Accelerate's other parameters (accelerate.py)
    use_port: object = None
    master_addr: object = None
    rdzv_backend: object = "static"
    rdzv_conf: object = None
    rdzv_id: object = "none"
    monitor_interval: object = 0.1
    log_line_prefix_template: object = None

    @classmethod
    def of(cls, given: Mapping[str, object]) -> Requested:
        """The options from the entry points' parameters by name (the public signatures of
        notebook_launcher, start_ranks and ``nbtrain launch`` list them; this is the one place
        they become a ``Requested``): stop and resume options go into ``stop``."""
        stop_names = {f.name for f in fields(StopOptions)}
        own = {f.name for f in fields(cls)} - {"stop"}
        unknown = set(given) - stop_names - own
        if unknown:  # a parameter added to an entry point but not here: a bug, said at once
            raise TypeError(f"Requested has no option {sorted(unknown)}")
        stop = StopOptions(**{k: v for k, v in given.items() if k in stop_names})
        return cls(**{k: v for k, v in given.items() if k in own}, stop=stop)

    def config(self, *, allow_xla: bool = True) -> LaunchConfig:
        """The processes' configuration (without stop policy and debug), checked."""
        rendezvous = accelerate.resolve(
            num_nodes=self.num_nodes,
            node_rank=self.node_rank,
            rdzv_endpoint=self.rdzv_endpoint,
            rdzv_timeout=self.rdzv_timeout,
            use_port=self.use_port,
            master_addr=self.master_addr,
            rdzv_backend=self.rdzv_backend,
            rdzv_conf=self.rdzv_conf,
            rdzv_id=self.rdzv_id,
            monitor_interval=self.monitor_interval,
            log_line_prefix_template=self.log_line_prefix_template,
        )
        return build_config(
            num_processes=self.num_processes,
            start_method=self.start_method,
            mixed_precision=self.mixed_precision,
            gpu_ids=self.gpu_ids,
            num_nodes=self.num_nodes,
            node_rank=self.node_rank,
            rdzv_endpoint=rendezvous.endpoint,
            max_restarts=self.max_restarts,
            timeout=self.timeout,
            output=self.output,
            progress=self.progress,
            return_all=self.return_all,
            rdzv_timeout=rendezvous.timeout,
            allow_xla=allow_xla,
            hang_after=self.hang_after,
        )


__all__ = ["Requested"]
