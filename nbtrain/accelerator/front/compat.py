"""The parts of Accelerate's Accelerator surface that nbtrain accepts without a concern of its
own: the ``state`` view, the project configuration, and constructor arguments that configure
features nbtrain does not have (checked here, so the Accelerator stays a thin front end).

- ``Accelerator.state`` answers what Accelerate's ``AcceleratorState`` answers (num_processes,
  device, distributed_type, mixed_precision, ...) and prints the same summary.
- ``project_dir`` / ``project_config``: the project directory and Accelerate's automatic
  checkpoint naming (``save_state()`` without a directory), read from Accelerate's own
  ProjectConfiguration or this module's.
- Arguments for RNG synchronisation and torch.compile are accepted with a
  one-time warning saying what nbtrain does instead; DeepSpeed, Megatron-LM and tensor
  parallelism are refused (training silently without them would not be the run that was asked
  for).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from nbtrain.accelerator.front.base import AcceleratorBase

_WARNED: set[str] = set()


def warn_once(key: str, text: str, stacklevel: int = 5) -> None:
    """A warning shown once per process (a notebook builds many Accelerators). ``stacklevel``
    counts from this function: the default, 5, names the caller of ``Accelerator(...)`` when
    called from check_unsupported (<- setup.check_arguments <- Accelerator.__init__); other call
    sites pass their own depth."""
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(text, UserWarning, stacklevel=stacklevel)


# ---------------------------------------------------------------------------------------------
# Constructor arguments without an nbtrain feature behind them

_REFUSED = {
    "deepspeed_plugin": "DeepSpeed",
    "deepspeed_plugins": "DeepSpeed",
    "megatron_lm_plugin": "Megatron-LM",
    "torch_tp_plugin": "tensor parallelism",
    "parallelism_config": "tensor/context parallelism",
}


def check_unsupported(arguments: dict[str, Any]) -> None:
    """Refuse the parallelism plugins; warn (once) about what is accepted but not used."""
    for name, feature in _REFUSED.items():
        if arguments.get(name) is not None:
            raise ValueError(
                f"Accelerator({name}=...): nbtrain trains with DistributedDataParallel (one full "
                f"model copy per rank) and does not support {feature}. Drop {name}=, or use "
                "Hugging Face Accelerate for this run."
            )
    if arguments.get("rng_types") is not None:
        warn_once(
            "rng_types",
            "Accelerator(rng_types=...) is not used: nbtrain seeds every prepared dataloader's "
            "shuffling itself (the same order on every rank, a new one each epoch), without "
            "synchronising the ranks' global generators.",
        )
    backend = arguments.get("dynamo_backend")
    if arguments.get("dynamo_plugin") is not None or (
        backend is not None and str(getattr(backend, "value", backend)).lower() != "no"
    ):
        warn_once(
            "dynamo",
            "Accelerator(dynamo_backend=/dynamo_plugin=) is not used: nbtrain does not compile "
            "models. Compile yours before prepare(): model = torch.compile(model).",
        )


# ---------------------------------------------------------------------------------------------
# Project configuration


@dataclass
class ProjectConfiguration:
    """Accelerate's ProjectConfiguration fields (its objects are accepted as they are).

    With ``automatic_checkpoint_naming``, ``save_state()`` writes
    ``<project_dir>/checkpoints/checkpoint_<iteration>`` (keeping the ``total_limit`` newest)
    and ``load_state()`` reads the newest. ``save_on_each_node`` is not used: the directory must
    be on storage every rank shares.

    :param project_dir: the project folder.
    :param logging_dir: where trackers write (default: ``project_dir``).
    :param automatic_checkpoint_naming: name checkpoints as above.
    :param total_limit: how many automatic checkpoints to keep (None: all).
    :param iteration: the number of the next automatic checkpoint.
    :param save_on_each_node: accepted; not used (above).
    """

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def __post_init__(self) -> None:
        if self.logging_dir is None:
            self.logging_dir = self.project_dir


def project_configuration(project_dir: Any, config: Any) -> Any:
    """The configuration object to keep (the user's own, so its ``iteration`` stays shared)."""
    if config is None:
        return ProjectConfiguration(project_dir=None if project_dir is None else str(project_dir))
    for name in ("project_dir", "automatic_checkpoint_naming", "iteration"):
        if not hasattr(config, name):
            raise TypeError(
                f"Accelerator(project_config={config!r}) needs a ProjectConfiguration (from "
                f"accelerate.utils or nbtrain.utils); this object has no {name!r}."
            )
    if project_dir is not None and config.project_dir is None:
        config.project_dir = str(project_dir)
        if getattr(config, "logging_dir", None) is None:
            config.logging_dir = config.project_dir
    if config.automatic_checkpoint_naming and config.project_dir is None:
        raise ValueError(
            "ProjectConfiguration(automatic_checkpoint_naming=True) needs a project directory: "
            "pass project_dir=... to it or to the Accelerator."
        )
    return config


# ---------------------------------------------------------------------------------------------
# accelerator.state


class _Ends(Protocol):
    """What the view calls on its Accelerator beyond what every part reads (base.py)."""

    def end_training(self) -> None: ...


class State:
    """A live view of where the Accelerator runs, with the names of Accelerate's AcceleratorState
    (``accelerator.state.num_processes``, ``logger.info(accelerator.state)``, ...). Other
    PartialState helpers (``wait_for_everyone``, ``print``, ``main_process_first``, ...) are the
    Accelerator's own."""

    # The accelerator sits in a slot, not in __dict__: the instance dict holds only values a
    # script assigned (``accelerator.state.distributed_type = ...``, as Accelerate's scripts
    # do), so two views of equal accelerators compare equal field by field after pickling.
    __slots__ = ("__dict__", "_accelerator")

    deepspeed_plugin = None
    megatron_lm_plugin = None
    dynamo_plugin = None
    parallelism_config = None
    initialized = True

    def __init__(self, accelerator: AcceleratorBase) -> None:
        self._accelerator = accelerator

    @property
    def fsdp_plugin(self) -> Any:
        return self._accelerator.fsdp_plugin

    @property
    def backend(self) -> str | None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return str(dist.get_backend())
        return None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return getattr(self._accelerator, name)
        except AttributeError:
            raise AttributeError(
                f"accelerator.state (nbtrain's view of Accelerate's AcceleratorState) has no "
                f"attribute {name!r}; it offers the Accelerator's own attributes and methods "
                "(num_processes, device, wait_for_everyone, ...) and destroy_process_group()."
            ) from None

    def destroy_process_group(self, group: Any = None) -> None:
        """End the process group, as Accelerate's scripts do last (``group``: a sub-group to
        destroy instead). Collectives need a new Accelerator afterwards."""
        import torch.distributed as dist

        if group is not None:
            dist.destroy_process_group(group)
            return
        cast(_Ends, self._accelerator).end_training()  # the Accelerator (core.py) of this view
        if dist.is_available() and dist.is_initialized():  # one the user's code had made
            dist.destroy_process_group()

    def __repr__(self) -> str:
        acc = self._accelerator
        backend = self.backend
        return (
            f"Distributed environment: {acc.distributed_type.value}"
            f"{'  Backend: ' + backend if backend else ''}\n"
            f"Num processes: {acc.num_processes}\n"
            f"Process index: {acc.process_index}\n"
            f"Local process index: {acc.local_process_index}\n"
            f"Device: {acc.device}\n"
            f"\nMixed precision type: {acc.mixed_precision}\n"
        )
