"""Accelerator(kwargs_handlers=[...]): extra options for DDP, the grad scaler, the process group
and autocast.

Accelerate's own handler objects (``from accelerate.utils import DistributedDataParallelKwargs``)
are accepted as they are, recognised by class name, so a script keeps its imports; these small
dataclasses are the same thing for code without accelerate installed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any


class _Handler:
    def to_kwargs(self) -> dict[str, Any]:
        """The options set to something other than their default."""
        defaults = type(self)()
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
            if getattr(self, f.name) != getattr(defaults, f.name)
        }


@dataclass
class DistributedDataParallelKwargs(_Handler):
    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False


@dataclass
class GradScalerKwargs(_Handler):
    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class InitProcessGroupKwargs(_Handler):
    backend: str | None = None
    init_method: str | None = None
    timeout: timedelta | None = None


@dataclass
class AutocastKwargs(_Handler):
    enabled: bool = True
    cache_enabled: bool | None = None


@dataclass
class Options:
    """The handlers' options, sorted by who uses them."""

    ddp: dict[str, Any] = field(default_factory=dict)
    scaler: dict[str, Any] = field(default_factory=dict)
    autocast: dict[str, Any] = field(default_factory=dict)
    backend: str | None = None
    timeout: float | None = None


_KINDS = {
    "DistributedDataParallelKwargs": "ddp",
    "GradScalerKwargs": "scaler",
    "InitProcessGroupKwargs": "process_group",
    "AutocastKwargs": "autocast",
}


def collect(handlers: object) -> Options:
    options = Options()
    if handlers is None:
        return options
    if not isinstance(handlers, (list, tuple)):
        raise TypeError(
            f"kwargs_handlers={handlers!r} must be a list of handler objects, e.g. "
            "[DistributedDataParallelKwargs(find_unused_parameters=True)]."
        )
    for handler in handlers:
        kind = _KINDS.get(type(handler).__name__)
        if kind is None:
            raise TypeError(
                f"kwargs_handlers got {type(handler).__name__}, which nbtrain does not use; it "
                f"accepts {', '.join(_KINDS)}."
            )
        values = _values(handler)
        if kind == "ddp":
            options.ddp.update(values)
        elif kind == "scaler":
            options.scaler.update(values)
        elif kind == "autocast":
            options.autocast.update(values)
        else:
            _process_group(options, values)
    return options


def _values(handler: Any) -> dict[str, Any]:
    to_kwargs = getattr(handler, "to_kwargs", None)
    if callable(to_kwargs):
        return dict(to_kwargs())
    if dataclasses.is_dataclass(handler):
        return dataclasses.asdict(handler)  # type: ignore[arg-type]
    return dict(vars(handler))


def _process_group(options: Options, values: dict[str, Any]) -> None:
    if values.get("backend"):
        options.backend = str(values["backend"])
    timeout = values.get("timeout")
    if timeout is not None:
        options.timeout = (
            timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        )
    if values.get("init_method"):
        raise ValueError(
            "InitProcessGroupKwargs(init_method=...) is not supported: nbtrain's launcher provides "
            "the rendezvous. Drop init_method."
        )
