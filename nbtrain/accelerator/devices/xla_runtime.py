"""torch_xla's runtime as the rest of the Accelerator uses it: this ordinal's device, the step
mark (``sync``, looked up at call time: tests on XLA:CPU replace ``torch_xla.sync``), the number
of ordinals, and safetensors files of XLA models. Never imports torch_xla unless called."""

from __future__ import annotations

import sys

import torch
from torch import nn

from nbtrain.rank import rankenv


def current_device() -> str | None:
    """This ordinal's XLA device, when this process runs XLA: torch_xla already imported (by
    nbtrain's XLA host, or by the user's code) and a PJRT device chosen. Never imports it."""
    if "torch_xla" not in sys.modules or not rankenv.xla_device_chosen():
        return None
    import torch_xla

    return str(torch_xla.device())


def sync() -> None:
    import torch_xla

    torch_xla.sync()


def world_size() -> int:
    try:
        import torch_xla.runtime as xr
    except ImportError as exc:
        raise ModuleNotFoundError(
            "DistributedType.XLA needs torch_xla, which is not installed: pip install "
            "'torch_xla[tpu]' (its version must match torch's), or train on CPU/CUDA."
        ) from exc

    return int(xr.world_size())


# ---------------------------------------------------------------------------------------------
# Checkpoints: safetensors reads tensor storage directly, which XLA tensors do not expose, so
# XLA models are written from a CPU copy of their state (tied weights stored once, as
# safetensors' own save_model does) and read back by copying CPU values into the parameters.


def _tied_groups(model: nn.Module) -> list[list[str]]:
    groups: dict[int, list[str]] = {}
    for name, value in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(value), []).append(name)
    return list(groups.values())


def write_safetensors(model: nn.Module, path: str) -> None:
    from safetensors.torch import save_file

    state = model.state_dict()
    cpu = {names[0]: state[names[0]].detach().cpu().contiguous() for names in _tied_groups(model)}
    save_file(cpu, path, metadata={"format": "pt"})


def read_safetensors(model: nn.Module, path: str, *, strict: bool = True) -> None:
    """``strict`` as in safetensors' load_model (load_state(dir, strict=False) passes it): keys
    missing from the file, or in the file but not in the model, are an error only if strict."""
    from safetensors.torch import load_file

    saved = load_file(path, device="cpu")
    state: dict[str, torch.Tensor] = {}
    known: set[str] = set()
    for names in _tied_groups(model):
        known.update(names)
        found = next((saved[name] for name in names if name in saved), None)
        if found is not None:
            state.update(dict.fromkeys(names, found))
    # Keys of no parameter or buffer go in too, for load_state_dict to report (or, not strict,
    # to skip) as unexpected.
    state.update({name: value for name, value in saved.items() if name not in known})
    model.load_state_dict(state, strict=strict)  # copies into the XLA parameters in place
