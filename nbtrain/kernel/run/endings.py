"""What a launch's ending says: the timeout's message (where each rank was), which checkpoint a
stopped run resumes from, the summary of an interrupted one. lifecycle.Run raises with them."""

from __future__ import annotations

from nbtrain.display.runstate import RunState
from nbtrain.kernel.host import cellnames
from nbtrain.kernel.options.config import LaunchConfig
from nbtrain.kernel.options.names import given, to_raise
from nbtrain.shared import checkpoints, stacks
from nbtrain.shared.stopping import StopPolicy

__all__ = ["interrupted_summary", "kept", "timeout_message"]


def kept(policy: StopPolicy | None) -> str:
    """After an interrupt under a stop policy: which checkpoint the next run resumes from."""
    if policy is None:
        return ""
    latest = checkpoints.latest_complete(policy.project_dir)
    if latest is None:
        return "; no checkpoint was saved"
    return f"; the newest complete checkpoint is {latest} (resume=True continues from it)"


def timeout_message(
    config: LaunchConfig,
    state: RunState,
    stuck: dict[int, stacks.RankStack],
    logs: object,
    *,
    in_process: bool,
) -> str:
    """``timeout=`` expired: what each rank was doing and where (``logs``: the log folder)."""
    where = "; ".join(
        f"rank {rank}: {view.status.value}"
        + (f" at step {view.step}/{view.total}" if view.total is not None else "")
        for rank, view in sorted(state.ranks.items())
    )
    what = " while the function ran in this process" if in_process else (
        f"; every rank was stopped ({where})"
    )
    stacks_text = stacks.describe(stuck, cellnames.place)
    full = f"in {logs}/rank-N.log" if logs is not None else "in each rank's log"
    return (
        f"{given('timeout', f'{config.timeout:g}')} expired{what}. "
        f"Raise {to_raise('timeout')} if the run needs longer."
        + (
            f"\nWhere the ranks were (each rank's full stack is {full}):\n{stacks_text}"
            if stacks_text
            else ""
        )
    )


def interrupted_summary(exc: BaseException, state: RunState, in_process: bool) -> str:
    """The view's last line after an interrupt (or an error in the kernel)."""
    if isinstance(exc, KeyboardInterrupt) and in_process:  # nothing to stop: the call ended
        return f"Interrupted after {state.elapsed:.1f}s"
    if isinstance(exc, KeyboardInterrupt):
        return f"Interrupted after {state.elapsed:.1f}s: every rank was stopped"
    return f"Stopped after {state.elapsed:.1f}s: {type(exc).__name__}: {exc}"
