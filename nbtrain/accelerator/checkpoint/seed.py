"""set_seed: seed python, numpy and torch (CPU, every GPU, and the XLA device in an XLA run) in
one call, as Accelerate does."""

from __future__ import annotations

import random

import numpy as np
import torch

from nbtrain.accelerator.checkpoint import rng
from nbtrain.rank import rankenv


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed every generator with ``seed``.

    ``device_specific=True`` adds the rank (process index), so ranks draw different numbers
    (e.g. different dropout masks or augmentations) yet stay reproducible. ``deterministic=True``
    also makes torch use deterministic algorithms (slower; some ops then raise)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"set_seed(seed={seed!r}) needs an int, e.g. set_seed(42).")
    value = int(seed)
    if device_specific:
        value += rankenv.placement().rank
    if not 0 <= value < 2**32:
        raise ValueError(
            f"set_seed(seed={seed!r}) must lie in 0..2**32-1 (numpy's limit)"
            + (" after adding the rank" if device_specific else "")
            + "."
        )
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)  # also seeds every CUDA device, lazily (safe before fork)
    xm = rng.xla_model()
    if xm is not None:  # torch.manual_seed leaves the XLA device's own generator alone
        xm.set_rng_state(value)  # this ordinal's device (the calling thread's)
    if deterministic:
        torch.use_deterministic_algorithms(True)
