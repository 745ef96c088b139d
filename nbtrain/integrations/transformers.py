"""NbtrainCallback: a Hugging Face Trainer reports its steps and metrics to nbtrain's live view.

    trainer = Trainer(..., callbacks=[NbtrainCallback()])

Every rank reports (the Trainer calls callbacks on every process): a "train" bar over
``state.max_steps``, an "eval" bar over the evaluation batches, and the numbers in each of the
Trainer's logs (loss, learning_rate, eval_* ...) at ``state.global_step``. Outside an nbtrain
launch it draws a text bar like ``nbtrain.progress``. Tip: ``TrainingArguments(disable_tqdm=True)``
avoids tqdm's own text bars in the ranks' output.
"""

from __future__ import annotations

import numbers
from collections.abc import Sized
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "nbtrain.NbtrainCallback needs the transformers package: pip install transformers"
    ) from exc

from nbtrain.rank.reporting import ProgressHandle, log, open_bar


class NbtrainCallback(TrainerCallback):
    """Reports a Trainer's progress and logged metrics to nbtrain (see the module docstring)."""

    def __init__(self) -> None:
        self._train: ProgressHandle | None = None
        self._eval: ProgressHandle | None = None
        self._eval_steps = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        total = state.max_steps if state.max_steps and state.max_steps > 0 else None
        self._train = open_bar(total, "train")
        if state.global_step:  # resumed from a checkpoint
            self._train.update_to(state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._train is not None:
            self._train.update_to(state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close_eval()
        if self._train is not None:
            self._train.update_to(state.global_step)
            self._train.close(complete=True)
            self._train = None

    def on_prediction_step(
        self, args: Any, state: Any, control: Any, eval_dataloader: Any = None, **kwargs: Any
    ) -> None:
        if self._eval is None:
            total = len(eval_dataloader) if isinstance(eval_dataloader, Sized) else None
            self._eval = open_bar(total, "eval")
            self._eval_steps = 0
        self._eval_steps += 1
        self._eval.update_to(self._eval_steps)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close_eval()

    def on_predict(
        self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any
    ) -> None:
        self._close_eval()

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        values = {
            name: float(value)
            for name, value in (logs or {}).items()
            if isinstance(value, numbers.Real) and not isinstance(value, bool)
        }
        if values:
            log(values, step=state.global_step)

    def _close_eval(self) -> None:
        if self._eval is not None:
            self._eval.close(complete=True)
            self._eval = None
