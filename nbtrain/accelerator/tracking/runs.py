"""The tracker run of this process: one per launch, on the main process only.

The run belongs to the process, not to one Accelerator: a warm rank's later cells (a new
Accelerator each) log into the run their first cell started, until ``end_training()`` or the
end of the session (``ranks.stop()``); a launch's run ends with its function (``end_launch``,
called by the rank's worker), whether the function returned, failed or stopped for a checkpoint;
the library trackers record which (``ending_of``: MLflow's KILLED for a stopped launch, FAILED
for one that raised).

Continuing on resume: every checkpoint saves the trackers' identities (``identities``, into the
checkpoint's meta); a launch with ``resume=True`` reopens those runs at the checkpoint's step.
"""

from __future__ import annotations

import sys
from typing import Any

from torch.optim.optimizer import register_optimizer_step_post_hook

from nbtrain.accelerator.tracking.base import BlankTracker, is_user_tracker
from nbtrain.accelerator.tracking.choose import Choice
from nbtrain.accelerator.tracking.library import Ending, LibraryTracker
from nbtrain.accelerator.tracking.registry import build
from nbtrain.rank import runtime
from nbtrain.rank.failures import exit_code_of
from nbtrain.shared.events import Tracked


class TrackerRun:
    """The trackers of one run, and what they were started with."""

    def __init__(self, project_name: str | None, trackers: list[Any], base_steps: int) -> None:
        self.project_name = project_name
        self.trackers = trackers
        self.base_steps = base_steps  # a resumed launch's checkpoint had taken these steps
        self.announced_to: object = None  # the launch (runtime) last told where the run is

    def announce(self) -> None:
        """Tell the launch's dashboard where the run is recorded (once per launch or cell)."""
        current = runtime.current()
        if current is None or current is self.announced_to:
            return
        self.announced_to = current
        for tracker in self.trackers:
            if isinstance(tracker, LibraryTracker):
                current.sink.send(Tracked(current.info.rank, tracker.where()))

    def finish(self, ending: Ending = "finished") -> None:
        errors = []
        for tracker in self.trackers:
            try:
                if isinstance(tracker, LibraryTracker):
                    tracker.finish(ending)
                else:  # Accelerate's interface: finish() without arguments
                    tracker.finish()
            except Exception as exc:  # every tracker gets its finish, whatever one raised
                errors.append(exc)
        if errors:
            raise errors[0]


_active: TrackerRun | None = None


def active() -> TrackerRun | None:
    return _active


def start(
    project_name: str | None,
    chosen: list[Choice],
    logging_dir: str | None,
    config: dict[str, Any] | None,
    init_kwargs: dict[str, Any] | None,
    resumed: tuple[dict[str, Any], int] | None,
) -> TrackerRun:
    """Open the run (main process). A run already open in this process with the same project
    goes on (a warm rank's cell run again); one of another project ends first."""
    global _active
    if _active is not None:
        if _active.project_name == project_name:
            _active.announce()
            return _active
        end()
    kwargs = init_kwargs or {}
    previous, steps = resumed if resumed is not None else ({}, 0)
    trackers: list[Any] = []
    for choice in chosen:
        if is_user_tracker(choice):
            trackers.append(choice)
            continue
        tracker = build(choice, project_name, logging_dir, kwargs.get(choice, {}))
        if choice in previous and isinstance(tracker, LibraryTracker):
            tracker.continue_run(previous[choice], steps)
        trackers.append(tracker)
    for tracker in trackers:
        tracker.start()
    if config is not None:
        for tracker in trackers:
            # A continued run has its configuration from its first launch already.
            if getattr(tracker, "previous", None) is None:
                tracker.store_init_configuration(config)
    _active = TrackerRun(project_name, trackers, steps)
    _active.announce()
    _counter.watch()
    return _active


def log(values: dict[str, Any], step: int | None, log_kwargs: dict[str, Any] | None) -> None:
    """To every tracker of the run; ``step`` defaults to the run's optimizer step (the steps
    its resumed checkpoint had taken plus those taken since, as checkpoints count them), except
    for a tracker that counts its own steps (``counts_own_steps``), which gets None."""
    if _active is None:
        return
    _active.announce()
    optimizer_step = _active.base_steps + _counter.taken()
    kwargs = log_kwargs or {}
    for tracker in _active.trackers:
        at = step
        if at is None and not getattr(tracker, "counts_own_steps", False):
            at = optimizer_step
        tracker.log(values, step=at, **kwargs.get(tracker.name, {}))


def get(name: str, unwrap: bool, main: bool) -> Any:
    """Accelerate's ``get_tracker``: processes that do not track get a blank tracker."""
    if _active is None or not main:
        return BlankTracker()
    for tracker in _active.trackers:
        if tracker.name == name:
            return tracker.tracker if unwrap else tracker
    names = ", ".join(repr(tracker.name) for tracker in _active.trackers)
    raise ValueError(f"get_tracker({name!r}): this run's trackers are {names}.")


def identities() -> dict[str, Any]:
    """What a checkpoint saves to continue the run: {tracker name: identity}."""
    if _active is None:
        return {}
    found = {
        tracker.name: tracker.identity()
        for tracker in _active.trackers
        if isinstance(tracker, LibraryTracker)
    }
    return {name: identity for name, identity in found.items() if identity}  # {}: not continued


def end(ending: Ending = "finished") -> TrackerRun | None:
    """Finish the run (``end_training()``); a later ``init_trackers`` starts a new one."""
    global _active
    run, _active = _active, None
    _counter.forget()
    if run is not None:
        run.finish(ending)
    return run


def end_launch(error: BaseException | None = None) -> None:
    """The launch's function is over (``error``: what it raised, if anything): finish its run,
    so everything logged is on disk before the rank reports its end. A tracker's error is
    printed, not raised over the rank's own outcome."""
    try:
        end(ending_of(error))
    except Exception as exc:
        print(f"nbtrain: finishing the tracker run failed: {exc!r}", file=sys.stderr)


def ending_of(error: BaseException | None) -> Ending:
    """How a launch's function ended, as the trackers' libraries name it: stopped by the user
    (the stop button, an interrupt, the stop after an interrupt's checkpoint, all
    KeyboardInterrupts) is killed, as MLflow and W&B record Ctrl-C; sys.exit(0) is finished."""
    if error is None or (isinstance(error, SystemExit) and exit_code_of(error) == 0):
        return "finished"
    return "killed" if isinstance(error, KeyboardInterrupt) else "failed"


class _OptimizerSteps:
    """Optimizer steps taken since the run started in this process (across a warm rank's
    cells): the most steps any one optimizer took, so two optimizers stepping once per
    iteration (a GAN's) count one step per iteration, as checkpoints count. Steps an fp16 grad
    scaler skipped, and accumulation micro-steps, are no optimizer steps."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self._hook: Any = None

    def watch(self) -> None:
        self.counts.clear()
        if self._hook is None:
            self._hook = register_optimizer_step_post_hook(self._on_step)

    def forget(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _on_step(self, optimizer: Any, *_: Any) -> None:
        key = id(optimizer)
        self.counts[key] = self.counts.get(key, 0) + 1

    def taken(self) -> int:
        return max(self.counts.values(), default=0)


_counter = _OptimizerSteps()

