"""Test-only support for several XLA:CPU replicas (threads of one process), torch_xla 2.9.0.

The maintainers call cross-replica collectives on XLA:CPU unsupported (pytorch/xla #5005, #9089):
unpatched, every collective aborts after ~20 s ("Expected N threads to join the rendezvous").
What makes them work here (see /work/shared/notes/xla-cpu.md), used by tests only:

- environment: PJRT_CPU_ASYNC_CLIENT=false, XLA_THREAD_POOL_SIZE=16 (set before the host starts);
- ``locked_sync`` replaces ``torch_xla.sync`` (which ``xm.mark_step`` and nbtrain call by
  attribute): (1) the step marker is issued under a process-wide lock, so every replica compiles
  the same executable with the same collective op ids; (2) it waits for this replica's device ops;
  (3) runs step closures; (4) clears the all-reduce token, as torch_xla.sync does.

It calls private ``torch_xla._XLAC`` functions whose names and signatures are those of 2.9.0, so
it refuses any other version rather than misbehave. Not product code: real TPUs need none of it.
"""

from __future__ import annotations

import threading

PINNED = "2.9.0"
ENV = {"PJRT_CPU_ASYNC_CLIENT": "false", "XLA_THREAD_POOL_SIZE": "16"}

_lock = threading.Lock()


def locked_sync(wait: bool = False, reset_scope: bool = True) -> None:
    import torch_xla
    import torch_xla.core.xla_model as xm

    device = torch_xla._XLAC._xla_get_default_device()
    with _lock:
        torch_xla._XLAC._xla_step_marker(device, [], wait=False, reset_scope=reset_scope)
    torch_xla._XLAC._xla_wait_device_ops(xm.xla_real_devices([device]))  # 'xla:1' -> 'CPU:1'
    context = xm._run_step_closures()
    torch_xla._XLAC._set_all_reduce_token(context.device, None)


def install() -> threading.Lock:
    """Patch torch_xla.sync in this (host) process; returns the lock for model creation.

    ENV must already be in the host's environment (set it in the launching process before the
    launch): torch_xla reads it when its runtime starts, before the launched function runs, so a
    launch without it fails here, by name, rather than with an aborted rendezvous later.
    """
    import os

    import torch_xla

    missing = {name: value for name, value in ENV.items() if os.environ.get(name) != value}
    if missing:
        raise RuntimeError(
            f"the XLA host runs without {missing}: set support.ENV in the launching process's "
            "environment before the launch"
        )
    version = torch_xla.__version__.split("+")[0]
    if version != PINNED:
        raise RuntimeError(f"tests/xla/support.py is written for torch_xla {PINNED}, not {version}")
    torch_xla.sync = locked_sync
    return _lock
