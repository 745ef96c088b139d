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


class OnInterrupt(Enum):
    STOP = "stop"  # every rank stops at once (the default)
    CHECKPOINT = "checkpoint"  # the ranks save at their next optimizer step, then stop
