"""The launch options' choices as enums, shared by the kernel (validation, display) and the
ranks (the Accelerator's mixed precision). Compared by identity, never as strings."""

from __future__ import annotations

from enum import Enum


class StartMethod(Enum):
    FORK = "fork"
    FORKSERVER = "forkserver"
    SPAWN = "spawn"


class OutputMode(Enum):
    ALL = "all"
    MAIN = "main"
    NONE = "none"


class ProgressMode(Enum):
    AUTO = "auto"
    WIDGETS = "widgets"
    TEXT = "text"
    OFF = "off"


class MixedPrecision(Enum):
    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"


PRECISION_CHOICES = "'no', 'fp16' or 'bf16'"


def parse_mixed_precision(value: object, origin: str) -> MixedPrecision:
    """``value`` as a mode; ``origin`` is how the user wrote it (``mixed_precision='fp8'``,
    ``Accelerator(mixed_precision='fp8')``). The launcher and the Accelerator both parse here, so
    a value gets the same message from either.

    :raises TypeError: ``value`` is not a string.
    :raises ValueError: an unknown mode, or ``'fp8'`` (Accelerate's, which nbtrain lacks).
    """
    if isinstance(value, MixedPrecision):
        return value
    if not isinstance(value, str):
        raise TypeError(f"{origin}: mixed precision must be a string, one of {PRECISION_CHOICES}.")
    text = value.strip().lower()
    if text == "fp8":
        # Accelerate's fp8 needs TransformerEngine, MS-AMP or torchao on recent GPUs.
        raise ValueError(
            f"{origin}: fp8 is not supported by nbtrain; use 'bf16' or 'fp16' (or 'no')."
        )
    try:
        return MixedPrecision(text)
    except ValueError:
        raise ValueError(f"{origin} is not a valid choice: use {PRECISION_CHOICES}.") from None


class OnInterrupt(Enum):
    STOP = "stop"  # every rank stops at once (the default)
    CHECKPOINT = "checkpoint"  # the ranks save at their next optimizer step, then stop
