"""The Accelerator's checkpoints and saved models: save_state / load_state (atomic, see
checkpoint/state.py), save_model, get_state_dict, memory release, skipping batches."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from nbtrain.accelerator.checkpoint import automatic as naming
from nbtrain.accelerator.checkpoint import state as checkpoint
from nbtrain.accelerator.checkpoint.target import CheckpointTarget
from nbtrain.accelerator.data import batches
from nbtrain.accelerator.data import prepared as data
from nbtrain.accelerator.front.base import AcceleratorBase
from nbtrain.accelerator.fsdp import setup as fsdp_setup
from nbtrain.accelerator.tracking import runs as tracking_runs

F = TypeVar("F", bound=Callable[..., Any])



class StateMethods(AcceleratorBase):
    """register_for_checkpointing, save_state, load_state, save_model, get_state_dict."""

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Also save/load these objects (anything with state_dict() and load_state_dict())."""
        invalid = [
            f"#{index} ({type(obj).__name__})"
            for index, obj in enumerate(objects)
            if not (
                callable(getattr(obj, "state_dict", None))
                and callable(getattr(obj, "load_state_dict", None))
            )
        ]
        if invalid:
            raise TypeError(
                f"register_for_checkpointing() needs objects with state_dict() and "
                f"load_state_dict() methods; these have not: {', '.join(invalid)}."
            )
        self._custom.extend(objects)
        self._stops.registered(list(objects), len(self._custom) - len(objects))

    def save_state(
        self,
        output_dir: str | None = None,
        safe_serialization: bool = True,
        **save_model_func_kwargs: Any,
    ) -> str:
        """Save models, optimizers, schedulers, grad scaler, registered objects, every rank's RNG
        states and dataloader positions, atomically. Every rank must call it.

        ``output_dir`` may hold other files (a tokenizer, save_model output): they are kept.
        Without ``output_dir``, the project configuration's automatic naming picks
        ``<project_dir>/checkpoints/checkpoint_<n>``. ``save_model_func_kwargs`` (options for
        DeepSpeed's saving in Accelerate) are accepted and unused.

        On XLA saving marks steps (its barriers sync), and every mark moves the device's random
        seed on: a run that saves and continues draws other device random numbers afterwards
        than one that never saved; a run resumed from the checkpoint matches the one that never
        saved.

        :param output_dir: the checkpoint folder (see above).
        :param safe_serialization: write the models' weights as safetensors (default) instead of
            torch pickles.
        :returns: the checkpoint's folder.
        :raises ValueError: no ``output_dir`` and no automatic naming
            (``ProjectConfiguration(automatic_checkpoint_naming=True)``).
        """
        automatic = output_dir is None
        target = self._automatic_checkpoint() if output_dir is None else output_dir
        path = checkpoint.save_state(
            target,
            self._training_state(),
            self._collectives,
            safe_serialization=safe_serialization,
        )
        if automatic:
            config = self.project_configuration
            config.iteration += 1
            if config.total_limit is not None and self.is_main_process:
                naming.prune_automatic(
                    self.project_dir or ".", int(config.total_limit), Path(path)
                )
        return str(path)

    def _automatic_checkpoint(self) -> Path:
        config = self.project_configuration
        if not config.automatic_checkpoint_naming:
            raise ValueError(
                "save_state() needs output_dir=, e.g. accelerator.save_state("
                "'checkpoints/step_100'), or Accelerator(project_config=ProjectConfiguration("
                "project_dir=..., automatic_checkpoint_naming=True)) to name checkpoints itself."
            )
        return naming.automatic_directory(config.project_dir, self.save_iteration)

    def load_state(
        self,
        input_dir: str | None = None,
        load_kwargs: dict[str, Any] | None = None,
        **load_model_func_kwargs: Any,
    ) -> str:
        """Restore what save_state wrote; prepared dataloaders continue after the last batch the
        checkpoint had seen. Every rank must call it, with the objects prepared as when saving.

        As in Accelerate: ``load_model_func_kwargs`` go to the model loading (e.g.
        ``strict=False``; ``map_location=`` picks the device the weights load to),
        ``load_kwargs`` to the ``torch.load`` of the other states. Without ``input_dir``, the
        newest automatically named checkpoint is loaded."""
        if input_dir is None:
            if not self.project_configuration.automatic_checkpoint_naming:
                raise ValueError(
                    "load_state() needs input_dir=, the directory save_state() wrote (or "
                    "automatic checkpoint naming in the Accelerator's project_config)."
                )
            input_dir = str(naming.latest_automatic(self.project_dir or "."))
        options = dict(load_model_func_kwargs)
        location = options.pop("map_location", None)
        device = self._device if location in (None, "on_device") else torch.device(location)
        self._stops.cancel_resume()  # the user's own load wins over resume=True's
        loaded = checkpoint.load_state(
            input_dir,
            self._training_state(),
            self._collectives,
            device,
            model_kwargs=options,
            load_kwargs=load_kwargs,
        )
        self.gradient_state.step = loaded.accumulation_step
        self._stops.resumed(loaded.steps)
        return str(loaded.source)

    def _checkpoint_target(self) -> CheckpointTarget:
        """This Accelerator as its checkpoints (checkpoint/) see it."""
        return CheckpointTarget(
            training_state=self._training_state,
            collectives=self._collectives,
            device=self._device,
            gradient_state=self.gradient_state,
            is_main_process=self.is_main_process,
        )

    def _training_state(self) -> checkpoint.TrainingState:
        state = checkpoint.TrainingState(
            models=[self.unwrap_model(model) for model in self._models],
            optimizers=list(self._optimizers),
            schedulers=list(self._schedulers),
            dataloaders=list(self._dataloaders),
            custom=list(self._custom),
            scaler=self._precision.scaler,
            accumulation_step=self.gradient_state.step,
            steps=self._stops.steps,
            trackers=tracking_runs.identities(),
        )
        split = getattr(self._strategy, "checkpoint_state", None)  # FSDP: sharded via DCP
        return split(state) if split is not None else state

    def save_model(
        self,
        model: nn.Module,
        save_directory: str,
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Write the model's weights (model.safetensors, or pytorch_model.bin without
        safetensors) from the main process; not a collective. ``max_shard_size`` is accepted for
        compatibility: nbtrain writes a single file. Under FSDP every rank must call it (the
        shards are gathered), as in Accelerate.

        :param model: a prepared (or plain) model.
        :param save_directory: the folder to write into (created if needed).
        :param safe_serialization: safetensors (default) or torch's pickle format.
        """
        if fsdp_setup.sharded(self._strategy, model):
            state = self.get_state_dict(model)
            if self.is_main_process:
                fsdp_setup.save_full(state, save_directory, safe_serialization)
            return
        if self.is_main_process:
            checkpoint.save_model(
                self.unwrap_model(model), save_directory, safe_serialization=safe_serialization
            )

    def save(self, obj: Any, f: Any, safe_serialization: bool = False) -> None:
        """torch.save (or safetensors) from the main process only; not a collective.

        :param obj: what to save (with ``safe_serialization``: a dict of tensors).
        :param f: a path or a writable binary file.
        :param safe_serialization: write safetensors instead of a torch pickle.
        """
        if not self.is_main_process:
            return
        if safe_serialization:
            from safetensors.torch import save_file

            save_file(obj, f, metadata={"format": "pt"})
        else:
            torch.save(obj, f)

    def get_state_dict(self, model: nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The model's weights. Under FSDP: the whole model gathered to CPU on the main process
        ({} on the others); every rank must call it then.

        :param model: a prepared model.
        :param unwrap: the user's module's keys (True, default) rather than the DDP wrapper's
            (``module.`` prefixed).
        """
        if fsdp_setup.sharded(self._strategy, model):
            return self._strategy.full_state_dict(model)
        return (self.unwrap_model(model) if unwrap else model).state_dict()

    def free_memory(self, *objects: Any) -> list[Any]:
        """Forget every prepared object (between two trainings in one process) and free what
        they held; returns a None for each object given, to rebind your names to:
        ``model, optimizer = accelerator.free_memory(model, optimizer)``."""
        self._models, self._optimizers, self._schedulers, self._dataloaders = [], [], [], []
        forget = getattr(self._strategy, "forget", None)  # XLA: its hooks on the parameters
        if forget is not None:
            forget()
        self.gradient_state.step = 0
        released = [None for _ in objects]
        del objects
        gc.collect()
        if self._device.type == "cuda":
            torch.cuda.empty_cache()
        return released

    def clear(self, *objects: Any) -> list[Any]:
        """Accelerate's alias of free_memory()."""
        return self.free_memory(*objects)

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """Start the next pass of ``dataloader`` at batch ``num_batches``.

        Rarely needed: after load_state a prepared dataloader already continues where the
        checkpoint stopped. For a prepared dataloader the position is absolute, so code written
        for Accelerate that calls both does not skip twice."""
        if isinstance(dataloader, data.PreparedDataLoader):
            return dataloader.skip_first_batches(num_batches)
        return batches.SkippedLoader(dataloader, num_batches)

    # ---------------------------------------------------------------------------------------
    # Live view (kernel side), delegated to nbtrain.rank.reporting

