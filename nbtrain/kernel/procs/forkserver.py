"""The forkserver ranks are made from when they start clean: started early by warmup.py, with
what every rank starts with already imported (shared/preload.py)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from nbtrain.shared.options import StartMethod
from nbtrain.shared.preload import PRELOAD

# The forkserver imports PRELOAD through one module of ours, deaf to Ctrl-C meanwhile (its
# docstring says why).
SERVER_PRELOAD = ["nbtrain.rank.forkserver_preload"]

__all__ = ["PRELOAD", "SERVER_PRELOAD"]


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
    context.set_forkserver_preload(SERVER_PRELOAD)
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
