"""Stop and resume options, checked in the kernel before any process starts.

``on_interrupt``, ``checkpoint_every``, ``resume``/``resume_from``, ``project_dir`` and
``total_limit`` become one ``StopPolicy`` (shared/stopping.py) that every rank receives. Every
check that can be made here is made here: a folder that cannot be written, a resume with no
checkpoint or one written by another number of ranks.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbtrain.kernel.options.config import choice, whole
from nbtrain.shared import checkpoints
from nbtrain.shared.options import OnInterrupt
from nbtrain.shared.stopping import STOP_SIGNAL, StopPolicy

DEFAULT_ROOT = "nbtrain-runs"  # under the working directory: nbtrain-runs/<function name>
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|min|m|h)\s*$")
_SECONDS = {"s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class StopOptions:
    """The stop and resume options as given (notebook_launcher's and start_ranks'), unchecked:
    ``build_policy`` checks them, again whenever a warm session starts new ranks."""

    on_interrupt: object = "stop"
    checkpoint_every: object = None
    resume: object = False
    resume_from: object = None
    project_dir: object = None
    total_limit: object = 3


def build_policy(
    function_name: str,
    world_size: int,
    options: StopOptions = StopOptions(),
    *,
    refused: str = "",
) -> StopPolicy | None:
    """The launch's policy, or None when it asked for none of stop, periodic saves, resume.
    ``refused``: where they do not run yet for this launch's kind (launch.py), in the error's
    words; asking for any there is refused before any folder is made."""
    graceful = choice("on_interrupt", options.on_interrupt, OnInterrupt) is OnInterrupt.CHECKPOINT
    if graceful and STOP_SIGNAL is None:
        raise ValueError(
            "on_interrupt='checkpoint' needs POSIX signals, which this platform lacks; use "
            "checkpoint_every= for periodic checkpoints instead."
        )
    steps, seconds = _every(options.checkpoint_every)
    mode = _resume_mode(options.resume)
    limit = None if options.total_limit is None else whole("total_limit", options.total_limit, 1)
    resume_from, project_dir = options.resume_from, options.project_dir
    if not (graceful or steps or seconds or mode or resume_from is not None):
        if project_dir is not None:
            raise ValueError(
                f"project_dir={project_dir!r} is only used for checkpoints: add "
                "on_interrupt='checkpoint', checkpoint_every= or resume=True."
            )
        return None
    if refused:
        _refuse(refused)
    root = _project_dir(project_dir, function_name)
    if graceful or steps or seconds:
        _check_writable(root)
    source = _resume_source(root, mode, resume_from)
    meta = checkpoints.read_meta(source) if source is not None else {}
    if source is not None:
        _check_world(source, meta, world_size)
    return StopPolicy(
        project_dir=str(root),
        next_number=checkpoints.next_number(root),
        on_interrupt=graceful,
        every_steps=steps,
        every_seconds=seconds,
        total_limit=limit,
        resume_from=None if source is None else str(source),
        resumed_steps=int(meta.get("steps", 0)),
    )


def _every(value: object) -> tuple[int | None, float | None]:
    """checkpoint_every: a whole number of optimizer steps, or a duration."""
    if value is None:
        return None, None
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(1)) * _SECONDS[match.group(2)]
    elif isinstance(value, int) and not isinstance(value, bool):
        return whole("checkpoint_every", value, 1, _EVERY_HINT), None
    else:
        raise ValueError(f"checkpoint_every={value!r} is not understood.{_EVERY_HINT}")
    if seconds <= 0:
        raise ValueError(f"checkpoint_every={value!r} must be a positive duration.{_EVERY_HINT}")
    return None, seconds


_EVERY_HINT = (
    " Pass a number of optimizer steps (checkpoint_every=500), a duration as text "
    "(checkpoint_every='10min', '90s', '1h') or a datetime.timedelta."
)


def _resume_mode(value: object) -> str | None:
    if value is True:
        return "required"
    if value is False or value is None:
        return None
    if value == "auto":
        return "auto"
    raise ValueError(
        f"resume={value!r} must be True (continue from the newest checkpoint), 'auto' (the same, "
        "or start fresh when there is none) or False."
    )


def _project_dir(value: object, function_name: str) -> Path:
    if value is None:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", function_name).strip("_") or "run"
        return Path(DEFAULT_ROOT, name).absolute()
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"project_dir={value!r} must be a path (str or os.PathLike).")
    return Path(value).expanduser().absolute()


def _check_writable(root: Path) -> None:
    folder = checkpoints.automatic_parent(root)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise PermissionError(
            f"project_dir={str(root)!r}: cannot create {str(folder)!r} for checkpoints "
            f"({error.strerror}). Pass a project_dir= you can write to."
        ) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(
            f"project_dir={str(root)!r}: {str(folder)!r} is not writable. Pass a "
            "project_dir= you can write to."
        )


def _resume_source(root: Path, mode: str | None, resume_from: object) -> Path | None:
    """The complete checkpoint to resume from (resume_from=, else the newest), or None."""
    if resume_from is not None:
        if not isinstance(resume_from, (str, os.PathLike)):
            raise TypeError(f"resume_from={resume_from!r} must be a checkpoint directory path.")
        named = Path(resume_from).expanduser().absolute()
        if not checkpoints.is_complete(named):
            raise FileNotFoundError(
                f"resume_from={str(named)!r} is not a complete checkpoint (no "
                f"{checkpoints.MARKER}). Pass a directory written by save_state() or by a "
                "checkpoint of on_interrupt= / checkpoint_every=."
            )
        return named
    if mode is None:
        return None
    newest = checkpoints.latest_complete(root)
    if newest is None and mode == "required":
        raise FileNotFoundError(
            f"resume=True: there is no complete checkpoint in "
            f"{str(checkpoints.automatic_parent(root))!r} yet. Pass resume='auto' to start "
            "fresh when there is none, or resume_from= a checkpoint directory."
        )
    return newest


def _check_world(source: Path, meta: dict[str, Any], world_size: int) -> None:
    saved = meta.get("world_size")
    if saved != world_size and not meta.get("fsdp"):  # FSDP's sharded states reshard
        raise ValueError(
            f"resume: {str(source)!r} was written by {saved} rank(s) but this launch has "
            f"{world_size}. Its RNG states and data positions are per rank: resume with "
            f"num_processes={saved} (times the nodes)."
        )


def _refuse(where: str) -> None:
    """Stop and resume run on ranks started by nbtrain on one machine or a cluster (for now)."""
    raise ValueError(
        f"on_interrupt='checkpoint', checkpoint_every= and resume= are not available {where} "
        "yet: launch num_processes >= 2 ranks on this machine, or save and load with "
        "accelerator.save_state() / load_state() in the function."
    )


def resumed(policy: StopPolicy | None) -> StopPolicy | None:
    """A restart's policy (ranks placed again on a cluster): the same saves, resuming from the
    newest complete checkpoint where there is one, numbering on after the highest."""
    if policy is None:
        return None
    newest = checkpoints.latest_complete(policy.project_dir)
    number = checkpoints.next_number(policy.project_dir)
    if newest is None:
        return dataclasses.replace(policy, next_number=number)
    meta = checkpoints.read_meta(newest)
    return dataclasses.replace(
        policy,
        next_number=number,
        resume_from=str(newest),
        resumed_steps=int(meta.get("steps", 0)),
    )
