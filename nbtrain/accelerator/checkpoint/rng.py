"""This process's random number generators: capture and restore (python, numpy, torch, cuda,
and the XLA device's in an XLA run).

States are stored as plain containers and tensors, so checkpoints load with weights_only=True.

XLA: the device RNG is a seed that every step mark (``torch_xla.sync``) moves on, whether or not
the step drew random numbers; random ops inside a step derive from it in the lazy graph. It is
a plain number only at a step boundary, so capture marks the step first (as Accelerate's
save_state does) and saves the seed the next step starts from; restore sets it back. The marks
a save makes after capturing move the seed on, so a run that saves and continues differs from
one that never saved, and the resumed run matches the latter.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture() -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "name": str(name),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    xm = xla_model()
    if xm is not None:
        from nbtrain.accelerator.devices.xla_runtime import sync

        sync()  # the step boundary: the seed stops depending on the step's pending random ops
        state["xla"] = int(xm.get_rng_state())
    return state


def restore(state: dict[str, Any]) -> None:
    random.setstate(_as_python_state(state["python"]))
    saved = state["numpy"]
    keys = saved["keys"].numpy().astype(np.uint32)
    np.random.set_state(
        (saved["name"], keys, saved["pos"], saved["has_gauss"], saved["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:  # a different GPU count: restore what lines up (our device first)
            for index, value in enumerate(cuda[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(value, index)
    seed = state.get("xla")
    xm = xla_model()
    if seed is not None and xm is not None:
        xm.set_rng_state(int(seed))  # this ordinal's device (the calling thread's)


def xla_model() -> Any | None:
    """torch_xla's xla_model when this process runs XLA: torch_xla imported and its runtime
    started. Never imports torch_xla, never starts its runtime (a kernel must not hold the TPU)."""
    from nbtrain.shared.tpu import xla_runtime_initialized

    if not xla_runtime_initialized():
        return None
    import torch_xla.core.xla_model as xm

    return xm


def _as_python_state(value: Any) -> tuple:
    # Loading may turn the inner tuple into a list; random.setstate insists on tuples.
    version, internal, gauss = value
    return (version, tuple(internal), gauss)
