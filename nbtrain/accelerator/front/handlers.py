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
    # Accelerate's communication hook: only "no hook" is accepted (see _check_comm_hook)
    comm_hook: Any = None
    comm_wrapper: Any = None
    comm_state_option: dict = field(default_factory=dict)


_COMM_FIELDS = ("comm_hook", "comm_wrapper", "comm_state_option")  # not DDP's own arguments


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
# Accelerate's handlers for features nbtrain does not have: accepted (with a warning) where
# leaving them out changes nothing about the training, refused where it would.
_IGNORED = {"ProfileKwargs": "accelerator.profile() does not exist in nbtrain; use torch.profiler"}
_REFUSED = {
    name: "fp8 training is not supported by nbtrain; use mixed_precision='bf16' or 'fp16'"
    for name in ("FP8RecipeKwargs", "AORecipeKwargs", "TERecipeKwargs", "MSAMPRecipeKwargs")
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
    seen: set[str] = set()
    for handler in handlers:
        name = type(handler).__name__
        if name in seen:
            raise ValueError(f"kwargs_handlers holds two {name} objects: pass one.")
        seen.add(name)
        kind = _KINDS.get(name)
        if kind is None:
            _not_used(name)
            continue
        values = _values(handler)
        if kind == "ddp":
            _check_comm_hook(handler)
            # (without a hook, Accelerate ignores its wrapper and state too)
            options.ddp.update({k: v for k, v in values.items() if k not in _COMM_FIELDS})
        elif kind == "scaler":
            options.scaler.update(values)
        elif kind == "autocast":
            options.autocast.update(values)
        else:
            _process_group(options, values)
    return options


def _not_used(name: str) -> None:
    if name in _REFUSED:
        raise ValueError(f"kwargs_handlers got {name}: {_REFUSED[name]}.")
    if name in _IGNORED:
        from nbtrain.accelerator.front.compat import warn_once

        # warn_once <- _not_used <- collect <- setup.check_arguments <- Accelerator.__init__ <-
        # the user's line
        text = f"kwargs_handlers: {name} is not used ({_IGNORED[name]})."
        warn_once(f"handler:{name}", text, stacklevel=6)
        return
    raise TypeError(
        f"kwargs_handlers got {name}, which nbtrain does not use; it accepts "
        f"{', '.join(_KINDS)} (from accelerate.utils or nbtrain.utils)."
    )


def _check_comm_hook(handler: Any) -> None:
    """Accelerate's DDP handler can register a gradient-compression hook; nbtrain does not."""
    hook = getattr(handler, "comm_hook", None)
    if hook is not None and str(getattr(hook, "value", hook)).lower() != "no":
        raise ValueError(
            f"DistributedDataParallelKwargs(comm_hook={hook!r}) is not supported by nbtrain. "
            "Drop comm_hook, or register the hook yourself on the prepared model: "
            "model.register_comm_hook(state, hook)."
        )


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
