"""Kernel side of a launch's payload: send the call to the ranks without copying big data.

- **fork**: the ranks already have every object of the kernel (copy-on-write pages). The call is
  checked to be picklable, as under every start method (the same bad input fails the same way),
  but what travels is one reference: the ranks run the kernel's own function on the kernel's own
  arguments and globals. Nothing is copied, whatever the size.
- **forkserver / spawn**: the call is pickled with cloudpickle; tensors and numpy arrays of
  ``sharedmem.MIN_SHARED`` bytes or more are written once to one /dev/shm segment that every rank
  maps copy-on-write (see sharedmem.py). A payload that does not fit fails here, before any rank
  starts, naming the object.

``prepare_call`` does the pickling and the checks; ``PreparedCall.commit`` writes the segment
(the live view says so when that takes noticeable time); ``PreparedCall.release`` ends it all,
whatever the launch's outcome: the segment, the fork references and any result segment the
ranks left (a rank killed mid-write, a result never collected). A future warm-rank session can
send data to running ranks the same way: ``share`` + ``release``, read by ``sharedmem.loads``.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from nbtrain.shared import sharedmem, shmclean
from nbtrain.shared.options import StartMethod
from nbtrain.shared.serialization import PayloadError, describe_payload_error, find_path

T = TypeVar("T")

ANNOUNCE_BYTES = 64 << 20  # a payload at least this big is named in the live view's status


@dataclass
class PreparedCall:
    """The bytes each rank receives, and what they refer to until ``release``."""

    data: bytes
    prefix: str = ""  # of every segment name of this launch ("" for a plain payload)
    segment: sharedmem.Segment | None = None
    registry_key: str | None = None

    @property
    def shared_bytes(self) -> int:
        return self.segment.size if self.segment is not None else 0

    def commit(self, announce: Callable[[str], None], ranks: int) -> None:
        """Write the segment, if any; ``announce`` gets a status line if it is large."""
        if self.segment is None or not self.segment.regions:
            return
        if self.segment.size >= ANNOUNCE_BYTES:
            announce(f"sharing {human_size(self.segment.size)} with {ranks} ranks")
        self.segment.write(keep_mapped=True)

    def release(self) -> None:
        """Remove everything this launch put in /dev/shm or the fork registry (idempotent)."""
        if self.segment is not None:
            self.segment.unlink()
        if self.registry_key is not None:
            sharedmem.FORK_REGISTRY.pop(self.registry_key, None)
        if self.prefix:
            shmclean.remove_names(self.prefix + "*")


def released(call: PreparedCall, launch: Callable[[PreparedCall], T]) -> T:
    """``launch(call)``; the big data it shares is released on every outcome (every kind of
    launch with processes: local ranks, the XLA host, the elastic agent, Ray)."""
    __tracebackhide__ = True  # IPython shows the cell and the rank's traceback, not ours
    try:
        return launch(call)
    finally:
        call.release()


def prepare_call(
    function: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    method: StartMethod,
    *,
    local: bool = True,
) -> PreparedCall:
    """Pickle ``function(*args, **kwargs)`` for ranks started with ``method``; ``local``
    False: ranks on other machines (a cluster), whose /dev/shm is not this one's: all inline."""
    shmclean.sweep_orphans()
    launch = secrets.token_hex(6)
    shared = local and sharedmem.available()
    prefix = f"{sharedmem.PREFIX}{os.getpid()}_{launch}_" if shared else ""
    call = (function, args, kwargs)
    if method is StartMethod.FORK:
        try:
            sharedmem.check_picklable(call)
        except Exception as exc:
            raise describe_payload_error(function, args, kwargs, exc) from None
        objects: dict[int, object] = {}
        sharedmem.FORK_REGISTRY[launch] = objects
        data = sharedmem.dumps(
            sharedmem.Envelope(call, prefix or None),
            registry=(launch, objects),
            by_reference=lambda obj: obj is call,
        )
        return PreparedCall(data, prefix, registry_key=launch)
    segment = sharedmem.Segment(f"{prefix}args") if prefix else None
    try:
        data = sharedmem.dumps(sharedmem.Envelope(call, prefix or None), segment=segment)
    except Exception as exc:
        raise describe_payload_error(function, args, kwargs, exc) from None
    if segment is not None:
        _check_room(segment, [("function", function), ("args", args), ("kwargs", kwargs)])
    return PreparedCall(data, prefix, segment=segment)


def share(value: Any, label: str = "value", *, local: bool = True) -> PreparedCall:
    """``value`` for ranks that are already running (a warm-rank session's ``push``): pickled,
    its large tensors and arrays in a new segment (not by reference: the ranks were forked
    before it existed). ``commit``, send ``data``; each rank reads it with
    ``sharedmem.loads(data, private=True)``; ``release`` once every rank has (their mappings
    outlive the name). PayloadError, naming ``label``'s part, if it cannot fit."""
    shmclean.sweep_orphans()
    if not (local and sharedmem.available()):  # the value travels whole in the pickle
        return PreparedCall(sharedmem.dumps(value))
    prefix = f"{sharedmem.PREFIX}{os.getpid()}_{secrets.token_hex(6)}_"
    segment = sharedmem.Segment(f"{prefix}push")
    data = sharedmem.dumps(value, segment=segment)
    _check_room(segment, [(label, value)])
    return PreparedCall(data, prefix, segment=segment)


def _check_room(segment: sharedmem.Segment, roots: list[tuple[str, object]]) -> None:
    """A payload larger than /dev/shm's free space (or than free memory) fails now."""
    if not segment.regions:
        return
    free, where = shm_room()
    if segment.size <= free:
        return
    biggest, nbytes = max(segment.objects, key=lambda item: item[1])
    path = find_path(biggest, roots) or "an argument"
    kind = f"{type(biggest).__module__}.{type(biggest).__qualname__}"
    raise PayloadError(
        f"{path} ({kind}, {human_size(nbytes)}) is too large to share with the ranks: the "
        f"payload's tensors and arrays take {human_size(segment.size)} and {where} has "
        f"{human_size(free)} free. Use start_method='fork' (the ranks then read the kernel's "
        "memory directly, nothing is copied), give /dev/shm more room (Docker: "
        "--shm-size=...), or load the data inside the function instead of passing it."
    )


def shm_room() -> tuple[int, str]:
    """Bytes a segment may take now, and what limits it: /dev/shm's free space, or memory
    (tmpfs pages are memory: a segment larger than what is available would be swapped or
    killed by the OOM killer)."""
    stat = os.statvfs(sharedmem.SHM_DIR)
    room, where = stat.f_bavail * stat.f_frsize, sharedmem.SHM_DIR
    available = _available_memory()
    if available is not None and available < room:
        room, where = available, "memory"
    return room, where


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # not Linux
        pass
    return None


def human_size(nbytes: int) -> str:
    size = float(nbytes)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.3g} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
