"""The forkserver and what every rank starts with already imported: one list for the forkserver's
preload and for a fork launch's kernel (processes.py), started early by warmup.py."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from nbtrain.shared.options import StartMethod

# Imported once by the launching process (fork) or the forkserver, so that ranks start with them
# loaded. torch._dynamo is imported by the first optimizer or DDP a rank creates and costs seconds
# per rank per launch otherwise; it starts no threads, so forking after it is safe.
# (encodings.idna: every rank's first getaddrinfo of a host name imports it)
WARM_IMPORTS = ["torch", "torch.distributed", "torch._dynamo", "cloudpickle", "encodings.idna"]
# The rank side's entries: a launch's rank and a warm rank (no rank imports them on its own).
PRELOAD = [*WARM_IMPORTS, "nbtrain.rank.worker", "nbtrain.rank.session"]


_warm = False  # the server has imported its preload (it served a process)


def warm() -> bool:
    return _warm


def served() -> None:
    """A process was started from the forkserver: it has imported its preload."""
    global _warm
    _warm = True


def start(*, ready: bool = False) -> None:
    """Start the forkserver with its preload now, unless it runs: the first forkserver launch
    (and warm ranks) then find it warm (warmup.py). Its environment is the kernel's at this
    moment: each rank adopts the kernel's at its launch (rankenv.adopt_environment), and
    multiprocessing hands it the working directory and sys.path of that moment too.

    ``ready``: return only once the server has imported its preload (it forks a process that
    does nothing, once: the server answers only after its imports)."""
    import multiprocessing.forkserver

    import torch.multiprocessing as torch_mp

    context = torch_mp.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    with main_module_not_inherited(StartMethod.FORKSERVER):
        multiprocessing.forkserver.ensure_running()
        if ready:
            probe = context.Process(target=_nothing, name="nbtrain-forkserver-probe")
            probe.start()
    if ready:
        probe.join()
        probe.close()
        served()


def _nothing() -> None:
    pass


@contextlib.contextmanager
def main_module_not_inherited(method: StartMethod) -> Iterator[None]:
    """Spawned ranks must not re-run the user's script.

    multiprocessing makes spawn/forkserver children import the parent's ``__main__`` (a script
    without an ``if __name__ == "__main__"`` guard then launches again, recursively). nbtrain's
    payload travels by cloudpickle, which carries ``__main__`` functions by value, so the child
    needs nothing from ``__main__``: hide its path while the child's start data is prepared.
    """
    main = sys.modules.get("__main__")
    if method is StartMethod.FORK or main is None:
        yield
        return
    saved = {
        name: main.__dict__[name] for name in ("__file__", "__spec__") if name in main.__dict__
    }
    for name in saved:
        setattr(main, name, None) if name == "__spec__" else delattr(main, name)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(main, name, value)
