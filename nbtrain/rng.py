"""This process's random number generators: capture and restore (python, numpy, torch, cuda).

States are stored as plain containers and tensors, so checkpoints load with weights_only=True.
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


def _as_python_state(value: Any) -> tuple:
    # Loading may turn the inner tuple into a list; random.setstate insists on tuples.
    version, internal, gauss = value
    return (version, tuple(internal), gauss)
