"""The first steps of every rank process, in one order: a launch's rank (worker.py), a warm
rank (session.py) and torch_xla's host process (xla_host.py)."""

from __future__ import annotations

from multiprocessing.connection import Connection

from nbtrain.rank import accelerate_state, inherited, notebook, process, rankenv, teardown
from nbtrain.shared.specs import HostSpec, RankSpec


def set_up(spec: RankSpec | HostSpec, stdout: Connection, stderr: Connection) -> None:
    """Own process group, output to the kernel's pipes, the kernel's environment, detached from
    ipykernel. A rank also forks its DataLoader workers, takes its share of the cores and guards
    its process groups' teardown; the XLA host leaves those to torch_xla's ordinals."""
    process.prepare(spec.close_fds, stdout, stderr)
    if isinstance(spec, RankSpec):
        process.fork_children_on_linux()
    rankenv.adopt_environment(spec.kernel_env, spec.env)
    inherited.forget_accelerate_states()  # a fork's copy of the kernel's (see inherited.py)
    accelerate_state.install()  # Accelerate's bare PartialState() sees the launch's world
    if isinstance(spec, RankSpec):
        process.set_threads(spec.torch_threads)
    notebook.install()  # no message from this fork over the kernel's sockets, ever
    if isinstance(spec, RankSpec):
        teardown.install()
