"""Mixed precision: which mode, autocast, the fp16 grad scaler, and the model-forward wrapper.

As in Accelerate, a prepared model's forward runs under autocast and returns float32 outputs, so
loss computations outside the model stay in full precision.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

import torch
from torch import nn

from nbtrain.shared.options import MixedPrecision, parse_mixed_precision

_DTYPES = {MixedPrecision.FP16: torch.float16, MixedPrecision.BF16: torch.bfloat16}


def resolve(requested: object, default: str | None, default_source: str) -> MixedPrecision:
    """The mode from Accelerator(mixed_precision=...), else the launch's default."""
    if requested is None:
        if default is None:
            return MixedPrecision.NO
        return _parse(default, f"the default mixed precision {default!r} from {default_source}")
    return _parse(requested, f"Accelerator(mixed_precision={requested!r})")


def _parse(value: object, origin: str) -> MixedPrecision:
    return parse_mixed_precision(value, origin)  # the launcher's parser: the same messages


class Precision:
    """The precision plan of one Accelerator on one device."""

    def __init__(
        self,
        mode: MixedPrecision,
        device: torch.device,
        scaler_kwargs: dict[str, Any] | None = None,
        autocast_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.mode = mode
        self.device = device
        self.dtype = _DTYPES.get(mode)
        self._autocast_kwargs = dict(autocast_kwargs or {})
        _check_supported(mode, device)
        self.scaler: torch.amp.GradScaler | None = None
        if mode is MixedPrecision.FP16:
            self.scaler = _make_scaler(device, scaler_kwargs or {})

    @property
    def enabled(self) -> bool:
        return self.dtype is not None

    def autocast(self, handler: Any = None) -> contextlib.AbstractContextManager[Any]:
        """Autocast to this plan's dtype (a no-op context without mixed precision).

        ``handler``: an AutocastKwargs-like object (``enabled``, ``cache_enabled``)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        options = dict(self._autocast_kwargs)
        if handler is not None:
            options.update(_handler_options(handler))
        return torch.autocast(self.device.type, dtype=self.dtype, **options)

    def wrap_forward(self, module: nn.Module) -> None:
        """Run ``module``'s forward under autocast and return float32 outputs."""
        if self.dtype is None or isinstance(module.__dict__.get("forward"), AutocastForward):
            return
        module.forward = AutocastForward(module, self.device.type, self.dtype)


def unwrap_forward(module: nn.Module) -> None:
    """Undo ``wrap_forward`` (for Accelerator.unwrap_model(keep_fp32_wrapper=False))."""
    wrapper = module.__dict__.get("forward")
    if isinstance(wrapper, AutocastForward):
        if wrapper.instance_forward is not None:
            module.forward = wrapper.instance_forward
        else:
            del module.__dict__["forward"]


class AutocastForward:
    """A picklable replacement for ``module.forward`` (torch.save(model) keeps working).

    Holds the class's forward function and the module rather than a bound method, so pickling
    never captures a method that resolves back to this wrapper."""

    def __init__(self, module: nn.Module, device_type: str, dtype: torch.dtype) -> None:
        existing = module.__dict__.get("forward")
        self.instance_forward: Callable[..., Any] | None = existing
        self.module = module
        self.device_type = device_type
        self.dtype = dtype

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.device_type, dtype=self.dtype):
            if self.instance_forward is not None:
                output = self.instance_forward(*args, **kwargs)
            else:
                output = type(self.module).forward(self.module, *args, **kwargs)
        return outputs_to_float32(output)


def outputs_to_float32(value: Any) -> Any:
    """Half-precision tensors in a model's output become float32 (containers kept)."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in (torch.float16, torch.bfloat16) else value
    if isinstance(value, MutableMapping):  # e.g. a Hugging Face ModelOutput: convert in place
        for key in list(value.keys()):
            value[key] = outputs_to_float32(value[key])
        return value
    if isinstance(value, Mapping):
        return {key: outputs_to_float32(item) for key, item in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(outputs_to_float32(item) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)(outputs_to_float32(item) for item in value)
    return value


def _handler_options(handler: Any) -> dict[str, Any]:
    options = {}
    for name in ("enabled", "cache_enabled"):
        value = getattr(handler, name, None)
        if value is not None:
            options[name] = value
    return options


def _check_supported(mode: MixedPrecision, device: torch.device) -> None:
    dtype = _DTYPES.get(mode)
    if dtype is None:
        return
    if mode is MixedPrecision.BF16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(
            f"mixed_precision='bf16' needs a GPU with bfloat16 support; {device} has none. Use "
            "mixed_precision='fp16'."
        )
    if not torch.amp.autocast_mode.is_autocast_available(device.type):
        raise ValueError(
            f"mixed_precision={mode.value!r}: torch {torch.__version__} has no autocast for "
            f"{device.type} devices. Use mixed_precision='no'."
        )
    # torch either raises or (more often) warns and silently disables autocast for a dtype the
    # device lacks: check that it really switched on.
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autocast(device.type, dtype=dtype):
                enabled = torch.is_autocast_enabled(device.type)
    except (RuntimeError, AssertionError):
        enabled = False
    if not enabled:
        other = "'fp16'" if mode is MixedPrecision.BF16 else "'bf16'"
        raise ValueError(
            f"mixed_precision={mode.value!r} is not supported on {device.type} devices by torch "
            f"{torch.__version__}. Use mixed_precision={other} or 'no'."
        )


def _make_scaler(device: torch.device, kwargs: dict[str, Any]) -> torch.amp.GradScaler:
    try:
        return torch.amp.GradScaler(device.type, **kwargs)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise ValueError(
            f"mixed_precision='fp16' needs a gradient scaler, which torch {torch.__version__} "
            f"cannot create for {device.type} ({exc}). Use mixed_precision='bf16'."
        ) from None
