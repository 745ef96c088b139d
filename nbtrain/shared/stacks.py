"""Where each rank is: ask it for its stacks, find the user's frames and its collective.

A launch that outlives ``timeout=`` or stops making progress is nearly always a rank blocked
somewhere (a collective that a peer never joins, a deadlock in teardown, a data loader waiting on
a dead worker). The launcher sends each rank ``DUMP_SIGNAL``; the rank's ``faulthandler`` writes
every thread's stack to its stderr pipe (it works even while the main thread is blocked in C++,
holding the GIL). From each dump, ``rank_stack`` keeps the user's innermost frames and the
torch.distributed collective the rank is inside (from its frames), and ``describe`` writes the
one picture every caller shows: the TimeoutError, hang detection, the dashboard's "where?"
button, ``ranks.where()`` and ``nbtrain launch`` on SIGQUIT.

torch's Flight Recorder (TORCH_FR_BUFFER_SIZE; torch._C._distributed_c10d._dump_fr_trace_json)
records gloo collectives too on torch 2.13 (name "gloo:all_reduce", collective_seq_id, state),
but it is read by Python code inside the rank, which a blocked main thread never runs: it would
need a helper thread in every rank, not built yet. The stacks are what any rank can answer.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import sysconfig
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

DUMP_SIGNAL: int | None = getattr(signal, "SIGUSR1", None)  # None on Windows: no dump there
WAIT = 1.0  # seconds the launcher waits for the dumps before it stops the ranks
MAX_FRAMES = 6

_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ ")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<name>.+)$')
# Frames below the user's function: the rank entry, and the XLA host's ordinal entry.
_ENTRY = ("nbtrain/rank/worker.py", "nbtrain/rank/xla_host.py", "nbtrain/rank/session.py")
# torch's collectives (all_reduce, barrier, broadcast, ...): each is a function of this module.
_COLLECTIVES = ("torch/distributed/distributed_c10d.py",)
# The Accelerator's own collectives (wait_for_everyone, gather, reduce, broadcast, save_state's
# barrier, ...): they wait by polling an async all_gather, so no torch collective is on the
# stack while they wait; the call the user made names the collective.
_ACCELERATOR_COLLECTIVES = ("nbtrain/accelerator/comm/",)


def enable_dumps() -> None:
    """In a rank: dump every thread's stack to stderr on DUMP_SIGNAL (the launcher's request)."""
    import faulthandler

    if DUMP_SIGNAL is not None:
        faulthandler.register(DUMP_SIGNAL, file=sys.stderr, all_threads=True)


@dataclass(frozen=True)
class Frame:
    """One frame of a dump: where (file, line) and the function's name."""

    file: str
    line: int
    name: str

    @property
    def inside_nbtrain(self) -> bool:
        return _inside_nbtrain(self.file)


@dataclass(frozen=True)
class RankStack:
    """Where one rank is: the user's frames, innermost first (a call into nbtrain kept as its
    outermost frame, see _calls_into_nbtrain_collapsed), the torch.distributed collective it
    is inside (None: none), or, without frames, a note ("exited", "idle (between cells)", ...)
    that says why."""

    frames: tuple[Frame, ...] = ()
    collective: str | None = None
    note: str = ""


def rank_stack(lines: list[str]) -> RankStack:
    """From one faulthandler dump, the thread running the user's function (empty if none)."""
    for block in _threads(lines):
        frames = [m for m in map(_FRAME.match, block) if m is not None]
        start = users_outermost([(m["file"], m["name"]) for m in reversed(frames)])
        entry = len(frames) - start if start is not None else 0
        if entry:  # the frames above our entry point are the user's (and what they called)
            called = [m["name"] for m in frames[:entry] if _in_collectives(m["file"])]
            kept = _calls_into_nbtrain_collapsed(
                [Frame(m["file"], int(m["line"]), m["name"]) for m in frames[:entry]]
            )
            in_accelerator = any(_in_accelerator_comm(m["file"]) for m in frames[:entry])
            made = _nbtrain_call(kept) if in_accelerator else None
            return RankStack(tuple(kept), made or _collective(called))
    return RankStack()


def _in_accelerator_comm(path: str) -> bool:
    path = path.replace("\\", "/")
    return _inside_nbtrain(path) and any(part in path for part in _ACCELERATOR_COLLECTIVES)


def _nbtrain_call(kept: list[Frame]) -> str | None:
    """The innermost call into nbtrain the user made (wait_for_everyone, gather_for_metrics,
    save_state): the collective a rank waiting in the Accelerator's transport is in."""
    return next((frame.name for frame in kept if frame.inside_nbtrain), None)


def users_outermost(places: Sequence[tuple[str, str]]) -> int | None:
    """Of a stack's (file, function) pairs, outermost first: the index of the user's outermost
    frame (the launched function's, the cell's, the script's), past the rank's entry point and
    ``nbtrain launch``'s way into the script. None: no entry point on this stack. What comes
    before it is multiprocessing's, nbtrain's and, under fork, the kernel's own stack."""
    entries = [i for i, (file, _) in enumerate(places) if file.replace("\\", "/").endswith(_ENTRY)]
    if not entries:
        return None
    start = entries[-1] + 1
    while start < len(places) and _plumbing(*places[start]):
        start += 1
    return start


def user_frames(lines: list[str]) -> list[Frame]:
    """From one faulthandler dump, the frames of the thread running the user's function,
    innermost first. A call into nbtrain is kept as its outermost frame (the API the user called:
    wait_for_everyone, backward, ...); what runs inside it is nbtrain's business, left out. Empty
    if no thread was running the function."""
    return list(rank_stack(lines).frames)


def _in_collectives(path: str) -> bool:
    return path.replace("\\", "/").endswith(_COLLECTIVES)


def _collective(names: list[str]) -> str | None:
    """The collective the user called: the outermost public function of torch's collectives
    module on the stack (all_gather_object calls all_gather: the user called the first)."""
    public = [name for name in names if not name.startswith("_") and name != "wrapper"]
    return public[-1] if public else None


def _calls_into_nbtrain_collapsed(frames: list[Frame]) -> list[Frame]:
    """Innermost first, without what runs inside a call into nbtrain: its own frames and the
    libraries it calls (torch.distributed, ...), up to a frame of the user's code again (a
    dataset's __getitem__ that nbtrain's loader called)."""
    kept: list[Frame] = []
    inside = False
    for frame in reversed(frames):  # outermost first: the user's function
        if frame.inside_nbtrain:
            if not inside:
                kept.append(frame)  # the call the user made
            inside = True
        elif not inside or not _library(frame.file):
            kept.append(frame)
            inside = False
    return kept[::-1]


def is_thread_header(line: str) -> bool:
    """A dump's 'Current thread 0x... (most recent call first):' line."""
    return _THREAD.match(line) is not None


def is_dump_line(line: str) -> bool:
    """A line of a faulthandler dump: a thread header, a frame, "<no Python frame>", the
    blank line between threads."""
    stripped = line.strip()
    return (
        not stripped
        or stripped in ("<no Python frame>", "...")  # "...": a stack cut at 100 frames
        or _THREAD.match(line) is not None
        or _FRAME.match(line) is not None
    )


def is_entry_frame(line: str) -> bool:
    """A dump's frame of a rank's entry point: every frame after it (outer ones) is nbtrain's
    or, under fork, the kernel's own stack from before the fork."""
    match = _FRAME.match(line)
    return match is not None and match["file"].replace("\\", "/").endswith(_ENTRY)


def _plumbing(path: str, name: str) -> bool:
    """``nbtrain launch``'s frames between a rank's entry and the script: script.run_script
    and runpy's."""
    path = path.replace("\\", "/")
    if path.endswith("nbtrain/rank/script.py"):
        return name == "run_script"
    return path.endswith(("/runpy.py", "<frozen runpy>"))


GROUP_FROM = 4  # ranks in a picture from which ranks at one place share a line


def describe(
    picture: Mapping[int, RankStack],
    place: Callable[[str, int], str] | None = None,
    *,
    live: bool = False,
) -> str:
    """The one account of where the ranks are (``live``) or were when they were stopped: a
    line per place, with the ranks there ("rank 1 was waiting in wait_for_everyone(), called
    from Cell In[5], line 5 in train"; "ranks 0-62 were in ..."), then, when some ranks wait
    in a collective, which ranks have not entered it: the rank(s) the others wait for.
    ``place`` names a file and line (the kernel names its cells as IPython does); by default
    the short path."""
    where = place or short_place
    # At width, ranks that stand at the same place share one line ("ranks 0-62 are waiting in
    # all_reduce(), ..."): at 64 ranks the picture stays a few lines, the odd one out shows. A
    # few ranks keep a line each, which reads best when there are only two or three.
    wide = len(picture) >= GROUP_FROM
    groups: dict[tuple[object, str, str], list[int]] = {}
    for rank, stack in sorted(picture.items()):
        said = _place_of(stack, where, live)
        if said is not None:
            groups.setdefault((None if wide else rank, *said), []).append(rank)
    parts = [_said(ranks, (key[1], key[2]), live) for key, ranks in groups.items()]
    waiting = waited_for(picture)
    if waiting is not None:
        parts.append(waiting[1])
    return "\n".join(parts)


def _place_of(
    stack: RankStack, where: Callable[[str, int], str], live: bool
) -> tuple[str, str] | None:
    """(kind, text) of one rank's line: ("waiting", "wait_for_everyone(), called from ..."),
    ("in", "Cell In[3], line 12 in train"), ("note", "exited"); None: nothing to say."""
    frames = list(stack.frames)
    if frames and frames[0].inside_nbtrain:  # waiting in the nbtrain call the user made
        text = f"{frames[0].name}()"
        if len(frames) > 1:
            text += ", called from " + _chain(frames[1:], where)
        return "waiting", text
    if frames:
        return "in", _chain(frames, where)
    if stack.note and live:
        return "note", stack.note
    return None


def _said(ranks: list[int], said: tuple[str, str], live: bool) -> str:
    kind, text = said
    if kind == "note":
        return f"{_ranks(ranks)}: {text}"
    one = len(ranks) == 1
    verb = ("is" if one else "are") if live else ("was" if one else "were")
    return f"{_ranks(ranks)} {verb} {'waiting in ' if kind == 'waiting' else 'in '}{text}"


def waited_for(picture: Mapping[int, RankStack]) -> tuple[list[int], str] | None:
    """The ranks the others wait for (those not inside the collective most ranks are in) and
    a sentence that says so; None when no rank is inside a collective."""
    inside: dict[str, list[int]] = {}
    for rank, where in sorted(picture.items()):
        if where.collective is not None:
            inside.setdefault(where.collective, []).append(rank)
    if not inside:
        return None
    name, ranks = max(inside.items(), key=lambda item: len(item[1]))
    missing = [rank for rank in sorted(picture) if rank not in ranks]
    waiters = f"{_ranks(ranks)} {'waits' if len(ranks) == 1 else 'wait'} in {name}"
    others = {other: r for other, r in inside.items() if other != name}
    if not missing:
        return [], f"{waiters}: every rank is inside it (slow, or blocked in the backend)."
    elsewhere = [
        f"{_ranks(r)} {'is' if len(r) == 1 else 'are'} in {other} instead"
        for other, r in sorted(others.items())
    ]
    sentence = (
        f"{waiters}; {_ranks(missing)} {'has' if len(missing) == 1 else 'have'} not entered it"
        + (f" ({'; '.join(elsewhere)}: a mismatched collective?)" if elsewhere else "")
        + f": the others wait for {_ranks(missing)}."
    )
    return missing, sentence


def innermost_own(stack: RankStack) -> Frame | None:
    """The innermost frame of the rank's own code (not a library's, not nbtrain's): where it
    stands ("Cell In[3], line 12"); None without frames."""
    frames = list(stack.frames)
    own = [frame for frame in frames if not frame.inside_nbtrain and not _library(frame.file)]
    found = own or frames
    return found[0] if found else None


def name_ranks(ranks: list[int]) -> str:
    return _ranks(ranks)


def _ranks(ranks: list[int]) -> str:
    """'rank 3', 'ranks 0, 2', 'ranks 0-62, 64': runs of three or more as a range."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    named = [
        f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs
    ]
    return "ranks " + ", ".join(named)


def short_place(file: str, line: int) -> str:
    return f"{_short(file)}:{line}"


def _chain(frames: list[Frame], place: Callable[[str, int], str]) -> str:
    named = [_named(frame, place) for frame in frames]
    if len(named) > MAX_FRAMES:  # keep the innermost ones and the user's function
        named = [*named[: MAX_FRAMES - 2], "...", named[-1]]
    return " <- ".join(named)


def _named(frame: Frame, place: Callable[[str, int], str]) -> str:
    if frame.inside_nbtrain:  # the nbtrain call the user made: its name says enough
        return f"{frame.name}()"
    return f"{place(frame.file, frame.line)} in {frame.name}"


def _threads(lines: list[str]) -> list[list[str]]:
    blocks: list[list[str]] = []
    for line in lines:
        if _THREAD.match(line):
            blocks.append([])
        elif blocks:
            blocks[-1].append(line)
    return blocks


def _short(path: str) -> str:
    """.../site-packages/torch/x.py -> torch/x.py, and nbtrain's own files (an editable install
    too) -> nbtrain/x.py; a notebook cell's file name stays as it is."""
    path = path.replace("\\", "/")
    if path.startswith(_PACKAGE):
        return "nbtrain/" + path[len(_PACKAGE):]
    index = path.rfind("site-packages/")
    return path[index + len("site-packages/"):] if index >= 0 else path


def _library(path: str) -> bool:
    """An installed package's file or the standard library's, not the user's own code."""
    path = path.replace("\\", "/")
    return "-packages/" in path or path.startswith(("<", _STDLIB))


def _inside_nbtrain(path: str) -> bool:
    """A file of this nbtrain, or of nbtrain installed elsewhere (another machine's rank)."""
    path = path.replace("\\", "/")
    return path.startswith(_PACKAGE) or "site-packages/nbtrain/" in path


_STDLIB = sysconfig.get_paths()["stdlib"].replace("\\", "/") + "/"
# nbtrain's own folder (this file is nbtrain/shared/stacks.py).
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))).replace("\\", "/") + "/"
