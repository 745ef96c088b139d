"""``FullyShardedDataParallelPlugin``: Accelerate's FSDP options, for torch's FSDP2.

nbtrain shards with FSDP2 (``torch.distributed.fsdp.fully_shard``) only. The plugin takes
Accelerate's field names so Accelerate code runs after changing the import; the options FSDP2
has no equivalent for are refused here, when the plugin is made (before any process starts),
with what to do instead. ``settings()`` turns a checked plugin into the plain values the
strategy (``nbtrain.accelerator.fsdp.strategy``) uses.

As in Accelerate, unset fields fall back to the ``FSDP_*`` environment variables ``accelerate
launch --use_fsdp`` exports, and ``ACCELERATE_USE_FSDP=true`` makes ``Accelerator()`` build a
plugin by itself (see ``from_environment``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from nbtrain.rank import rankenv

_WRAPS = ("transformer_based_wrap", "size_based_wrap", "no_wrap")
_STATE_DICTS = ("SHARDED_STATE_DICT", "FULL_STATE_DICT")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_TRUE = {"1", "true", "yes", "on"}

# Accelerate options for FSDP1 that FSDP2 has no knob for: accepted only at the values that
# describe what FSDP2 does anyway; anything else would silently train another way.
_FSDP1_ONLY: dict[str, tuple[tuple[Any, ...], str]] = {
    "backward_prefetch": (
        (None, "NO_PREFETCH", "BACKWARD_PRE"),
        "FSDP2 prefetches the next layer's all-gather itself",
    ),
    "limit_all_gathers": ((None, True), "FSDP2 always limits in-flight all-gathers"),
    "use_orig_params": ((None, True), "FSDP2 always trains the original parameters"),
    "forward_prefetch": ((None, False), "FSDP2 has no forward prefetch switch"),
    "sync_module_states": (
        (None, True, False),
        "use cpu_ram_efficient_loading=True to broadcast rank 0's weights",
    ),
    "param_init_fn": ((None,), "FSDP2 has no init function; use cpu_ram_efficient_loading=True"),
    "state_dict_config": ((None,), "use state_dict_type= instead"),
    "optim_state_dict_config": ((None,), "use state_dict_type= instead"),
    "activation_checkpointing_offload": ((None, False), "FSDP2 has no activation offload"),
    "ignored_modules": ((None,), "nbtrain shards every parameter of the prepared model"),
    "cpu_offload": ((None, False), "nbtrain does not offload FSDP2 parameters"),
}


@dataclass
class FullyShardedDataParallelPlugin:
    """Fully sharded data parallelism (FSDP2): each rank keeps 1/N of the parameters,
    gradients and optimizer state, gathering a layer's full weights only while it runs.

    Supported (Accelerate's names): ``fsdp_version`` (2; unset means 2), ``reshard_after_forward``
    (True: free the gathered weights after each forward, ZeRO-3; False: keep them until the
    backward, ZeRO-2; ``sharding_strategy`` "FULL_SHARD"/"SHARD_GRAD_OP" say the same),
    ``auto_wrap_policy`` ("transformer_based_wrap" with ``transformer_cls_names_to_wrap``,
    "size_based_wrap" with ``min_num_params``, "no_wrap", or a torch FSDP1-style policy callable
    ``policy(module, recurse, nonwrapped_numel)``), ``state_dict_type`` (how ``save_state``
    writes: "SHARDED_STATE_DICT", each rank its shards with torch.distributed.checkpoint, or
    "FULL_STATE_DICT", the gathered model and optimizer from the main process),
    ``cpu_ram_efficient_loading`` (rank 0's weights are broadcast after sharding: the other ranks
    may build their model on the meta device), ``activation_checkpointing`` (the wrapped layers
    recompute activations in backward), ``mixed_precision_policy`` (FSDP2's
    ``MixedPrecisionPolicy``, a dict of its fields, or "bf16"/"fp16"/"fp32").

    Accelerate's FSDP1 options that FSDP2 has no knob for (``backward_prefetch``, ``cpu_offload``,
    ``ignored_modules``, ``state_dict_config``, ``optim_state_dict_config``, ``limit_all_gathers``,
    ``use_orig_params``, ``param_init_fn``, ``sync_module_states``, ``forward_prefetch``,
    ``activation_checkpointing_offload``) are accepted at the values that describe what FSDP2 does
    anyway.

    :raises ValueError: an option at a value FSDP2 cannot honour (the message says what to use), or
        an unknown choice.
    :raises TypeError: a value of the wrong type.
    """

    fsdp_version: int | None = None
    reshard_after_forward: bool | str | None = None
    auto_wrap_policy: str | Callable[..., Any] | None = None
    transformer_cls_names_to_wrap: list[str] | str | None = None
    min_num_params: int | None = None
    state_dict_type: Any = None
    cpu_ram_efficient_loading: bool | None = None
    activation_checkpointing: bool | None = None
    mixed_precision_policy: Any = None
    sharding_strategy: Any = None
    backward_prefetch: Any = None
    cpu_offload: Any = None
    ignored_modules: Any = None
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    limit_all_gathers: bool | None = None
    use_orig_params: bool | None = None
    param_init_fn: Any = None
    sync_module_states: bool | None = None
    forward_prefetch: bool | None = None
    activation_checkpointing_offload: bool | None = None
    _settings: Settings | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _fill_from_environment(self)
        self._settings = _check(self)

    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = _check(self)
        return self._settings


@dataclass(frozen=True)
class Settings:
    """A checked plugin, as the strategy uses it."""

    reshard_after_forward: bool = True
    wrap: str = "no_wrap"  # or transformer_based_wrap / size_based_wrap / callable
    layer_classes: tuple[str, ...] = ()
    min_num_params: int = 100_000_000
    policy: Callable[..., Any] | None = None
    sharded_state_dict: bool = True
    cpu_ram_efficient_loading: bool = False
    activation_checkpointing: bool = False
    mp_policy: Any = None  # torch.distributed.fsdp.MixedPrecisionPolicy or None


def from_environment() -> FullyShardedDataParallelPlugin | None:
    """The plugin ``accelerate launch --use_fsdp`` asks for (ACCELERATE_USE_FSDP=true)."""
    if (rankenv.variable("ACCELERATE_USE_FSDP") or "").strip().lower() in _TRUE:
        return FullyShardedDataParallelPlugin()
    return None


def coerce(plugin: object) -> FullyShardedDataParallelPlugin:
    if isinstance(plugin, FullyShardedDataParallelPlugin):
        return plugin
    raise TypeError(
        f"Accelerator(fsdp_plugin={type(plugin).__module__}.{type(plugin).__qualname__}): pass "
        "nbtrain's plugin, with the same arguments: from nbtrain import "
        "FullyShardedDataParallelPlugin (nbtrain implements FSDP2 itself)."
    )


# ---------------------------------------------------------------------------------------------
# Checking


def _env(name: str) -> str | None:
    value = rankenv.variable(f"FSDP_{name}")
    return value.strip() if value and value.strip() else None


def _fill_from_environment(plugin: FullyShardedDataParallelPlugin) -> None:
    """Unset fields take the FSDP_* variables ``accelerate launch`` exports (Accelerate does)."""
    texts = {
        "fsdp_version": "VERSION",
        "reshard_after_forward": "RESHARD_AFTER_FORWARD",
        "auto_wrap_policy": "AUTO_WRAP_POLICY",
        "transformer_cls_names_to_wrap": "TRANSFORMER_CLS_TO_WRAP",
        "min_num_params": "MIN_NUM_PARAMS",
        "state_dict_type": "STATE_DICT_TYPE",
        "cpu_ram_efficient_loading": "CPU_RAM_EFFICIENT_LOADING",
        "activation_checkpointing": "ACTIVATION_CHECKPOINTING",
    }
    for attribute, name in texts.items():
        if getattr(plugin, attribute) is not None:
            continue
        value = _env(name)
        if value is None:
            continue
        if attribute in ("fsdp_version", "min_num_params"):
            setattr(plugin, attribute, _whole(f"FSDP_{name}", value))
        elif attribute != "reshard_after_forward" and attribute.endswith(("loading", "ing")):
            setattr(plugin, attribute, value.lower() in _TRUE)  # the two flags
        elif attribute == "reshard_after_forward" and value.lower() in _TRUE | {"false", "0"}:
            setattr(plugin, attribute, value.lower() in _TRUE)
        else:
            setattr(plugin, attribute, value)


def _whole(origin: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{origin}={value!r} must be a whole number.") from None


def _check(plugin: FullyShardedDataParallelPlugin) -> Settings:
    if plugin.fsdp_version not in (None, 2):
        raise ValueError(
            f"FullyShardedDataParallelPlugin(fsdp_version={plugin.fsdp_version!r}): nbtrain "
            "implements FSDP2 (torch.distributed.fsdp.fully_shard) only. Use fsdp_version=2 "
            "(or leave it unset); FSDP1's sharding_strategy becomes reshard_after_forward."
        )
    for name, (allowed, why) in _FSDP1_ONLY.items():
        value = getattr(plugin, name)
        if not any(_same(value, ok) for ok in allowed):
            raise ValueError(
                f"FullyShardedDataParallelPlugin({name}={value!r}) cannot be honoured by FSDP2: "
                f"{why}. Drop {name}= (allowed here: {', '.join(map(repr, allowed))})."
            )
    wrap, classes, minimum, policy = _wrap(plugin)
    return Settings(
        reshard_after_forward=_reshard(plugin.reshard_after_forward, plugin.sharding_strategy),
        wrap=wrap,
        layer_classes=classes,
        min_num_params=minimum,
        policy=policy,
        sharded_state_dict=_state_dict_type(plugin.state_dict_type) == "SHARDED_STATE_DICT",
        cpu_ram_efficient_loading=_flag(
            "cpu_ram_efficient_loading", plugin.cpu_ram_efficient_loading
        ),
        activation_checkpointing=_flag("activation_checkpointing", plugin.activation_checkpointing),
        mp_policy=_mp_policy(plugin.mixed_precision_policy),
    )


def _same(value: Any, allowed: Any) -> bool:
    if value is None or allowed is None:
        return value is allowed
    if isinstance(allowed, bool):
        return isinstance(value, bool) and value == allowed
    return _name_of(value) == allowed


def _name_of(value: Any) -> str:
    """A torch enum member (ShardingStrategy.FULL_SHARD) or a string, as an upper-case name."""
    return str(getattr(value, "name", value)).strip().upper()


def _flag(name: str, value: object) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise TypeError(f"FullyShardedDataParallelPlugin({name}={value!r}) must be True or False.")
    return value


def _reshard(value: Any, strategy: Any) -> bool:
    if strategy is not None:
        name = _name_of(strategy)
        if name not in ("FULL_SHARD", "SHARD_GRAD_OP", "1", "2"):
            raise ValueError(
                f"FullyShardedDataParallelPlugin(sharding_strategy={strategy!r}): FSDP2 on one "
                "group of ranks shards fully; 'FULL_SHARD' (reshard_after_forward=True) and "
                "'SHARD_GRAD_OP' (False) are supported. Hybrid sharding needs a 2-D device mesh, "
                "which nbtrain does not build; NO_SHARD is plain DDP: drop the plugin."
            )
        from_strategy = name in ("FULL_SHARD", "1")
        if value is not None and value is not from_strategy:
            raise ValueError(
                f"FullyShardedDataParallelPlugin: sharding_strategy={strategy!r} and "
                f"reshard_after_forward={value!r} disagree. Pass reshard_after_forward only."
            )
        return from_strategy
    if value is None:
        return True
    if isinstance(value, bool):
        return value
    name = _name_of(value)
    if name in ("FULL_SHARD", "SHARD_GRAD_OP"):  # Accelerate's FSDP1 spelling of the same
        return name == "FULL_SHARD"
    raise ValueError(
        f"FullyShardedDataParallelPlugin(reshard_after_forward={value!r}) must be True "
        "(free gathered weights after forward) or False (keep them until backward)."
    )


def _wrap(
    plugin: FullyShardedDataParallelPlugin,
) -> tuple[str, tuple[str, ...], int, Callable[..., Any] | None]:
    policy = plugin.auto_wrap_policy
    classes = plugin.transformer_cls_names_to_wrap
    if isinstance(classes, str):
        classes = [name.strip() for name in classes.split(",") if name.strip()]
    names = tuple(classes or ())
    minimum = plugin.min_num_params
    if minimum is not None and (isinstance(minimum, bool) or not isinstance(minimum, int)):
        raise TypeError(
            f"FullyShardedDataParallelPlugin(min_num_params={minimum!r}) must be a whole number."
        )
    if callable(policy):
        return "callable", names, 0, policy
    kind = "no_wrap" if policy is None else str(policy).strip().lower()
    if kind not in _WRAPS:
        raise ValueError(
            f"FullyShardedDataParallelPlugin(auto_wrap_policy={policy!r}) is not a policy: use "
            f"one of {', '.join(map(repr, _WRAPS))} or a callable."
        )
    if kind == "size_based_wrap" and minimum is not None and minimum < 1:
        raise ValueError(
            f"FullyShardedDataParallelPlugin(min_num_params={minimum}) must be at least 1."
        )
    return kind, names, 100_000_000 if minimum is None else minimum, None


def _state_dict_type(value: Any) -> str:
    if value is None:
        return "SHARDED_STATE_DICT"
    name = _name_of(value)
    if not name.endswith("_STATE_DICT"):
        name += "_STATE_DICT"
    if name not in _STATE_DICTS:
        raise ValueError(
            f"FullyShardedDataParallelPlugin(state_dict_type={value!r}) is not supported: use "
            "'SHARDED_STATE_DICT' (each rank writes its shards) or 'FULL_STATE_DICT' (the "
            "main process writes the whole model). FSDP2 has no LOCAL_STATE_DICT."
        )
    return name


def _mp_policy(value: Any) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if value is None or isinstance(value, MixedPrecisionPolicy):
        return value
    if isinstance(value, str):
        dtype = _DTYPES.get(value.strip().lower())
        if dtype is None:
            raise ValueError(
                f"FullyShardedDataParallelPlugin(mixed_precision_policy={value!r}) must be 'bf16', "
                "'fp16' or 'fp32' (fp8 is not supported), a dict, or a MixedPrecisionPolicy."
            )
        return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
    if isinstance(value, dict):
        fields = ("param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs")
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise ValueError(
                f"FullyShardedDataParallelPlugin(mixed_precision_policy=...) has keys {unknown} "
                f"that FSDP2's MixedPrecisionPolicy lacks (FSDP2 keeps buffers as they are); "
                f"use {', '.join(fields)}."
            )
        options: dict[str, Any] = {
            k: _dtype(v) if k.endswith("dtype") else v for k, v in value.items()
        }
        return MixedPrecisionPolicy(**options)
    raise TypeError(
        f"FullyShardedDataParallelPlugin(mixed_precision_policy={value!r}) must be a string, a "
        "dict or a torch.distributed.fsdp.MixedPrecisionPolicy."
    )


def _dtype(value: Any) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    text = str(value).strip().lower().removeprefix("torch.")
    found = _DTYPES.get(text) or getattr(torch, text, None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"mixed_precision_policy: {value!r} is not a dtype (e.g. 'bf16').")
    return found
