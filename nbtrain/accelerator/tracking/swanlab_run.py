"""``SwanLabTracker``: ``swanlab.init(project=project_name, **kwargs)``, built as Accelerate
builds it (``SwanLabTracker(run_name, **swanlab.init keywords)``); offline with
``SWANLAB_MODE=offline`` or ``init_kwargs={"swanlab": {"mode": "offline"}}`` (files under
``SWANLAB_LOG_DIR``). SwanLab counts its steps itself. The run ends as the launch did (SwanLab's
success / aborted / crashed). A resumed launch starts a new run."""

from __future__ import annotations

from typing import Any

from nbtrain.accelerator.tracking.library import Ending, LibraryTracker, scalars

_STATE = {"finished": "success", "killed": "aborted", "failed": "crashed"}


class SwanLabTracker(LibraryTracker):
    """A SwanLab run (see the module docstring).

    :param run_name: the SwanLab project; ``kwargs`` go to ``swanlab.init``.
    """

    name = "swanlab"
    module = "swanlab"
    pip = "swanlab"
    takes_logging_dir = False
    counts_own_steps = True

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__(run_name, None, **kwargs)


    def start(self) -> None:
        import swanlab

        self.run = swanlab.init(project=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.run.config.update(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers (tensors as numbers) and SwanLab's own types (``swanlab.Image``, ...)."""
        numbers = scalars(values)
        self.run.log({key: numbers.get(key, value) for key, value in values.items()},
                     step=step, **kwargs)

    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Each value a list of images (NumPy arrays or PIL images)."""
        import swanlab

        for key, images in values.items():
            self.log({key: [swanlab.Image(image) for image in images]}, step=step, **kwargs)

    def finish(self, ending: Ending = "finished") -> None:
        self.run.finish(state=_STATE[ending])

    def where(self) -> str:
        return f"SwanLab run {self.run.id} ({self.run.dir})"
