"""Backends of a rank group: where its ranks are placed and how their bytes travel.

A backend starts the ranks and hands back one ``RankProcess`` each, whose pipes are the channel
the group's Supervisor reads (stdout, stderr, framed events); ``close`` frees what the placement
held besides the processes (a rendezvous, command pipes). Everything else (watching, Ctrl-C,
timeout, stacks, teardown) is the group's, written once for every backend.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from nbtrain.kernel.procs import handles, processes
from nbtrain.shared.options import StartMethod
from nbtrain.shared.specs import HostSpec, RankSpec


class Backend(Protocol):
    """Placement and transport of a rank group's ranks."""

    def start(self) -> list[handles.RankProcess]:
        """Start every rank; each comes back with its pipes (the channel to read)."""
        ...

    def close(self) -> None:
        """Free what the placement held, once the processes are stopped and closed."""
        ...


def _nothing() -> None:
    pass


def _no_fds(rank: int) -> tuple[int, ...]:
    return ()


def _silent(text: str) -> None:
    pass


@dataclasses.dataclass
class LocalProcesses:
    """Ranks as processes of this machine (fork, forkserver or spawn), bytes over pipes.

    Each process runs ``target(spec, data(rank), stdout, stderr, events)``: ``specs`` decides
    the ranks (a RankSpec each, or the XLA host's HostSpec), ``data`` is what else it gets (the
    payload, or a warm rank's command pipe). Under fork a child inherits every pipe; it is told
    to close the others' (and ``also_close(rank)``: descriptors only the backend knows of).
    """

    method: StartMethod
    target: Callable[..., None]
    specs: Mapping[int, RankSpec | HostSpec]
    data: Callable[[int], Any]
    also_close: Callable[[int], tuple[int, ...]] = _no_fds
    before: Callable[[], None] = _nothing  # just before the first process starts
    release: Callable[[], None] = _nothing  # what close() frees (the rendezvous, ...)
    debuggable: bool = False  # the target takes the debug pipe's end last (rank/debugger.py)
    # Told what starting will spend its seconds on, before it blocks (a launch shows it in
    # every rank's row; start_ranks prints it): the phases until a rank can speak for itself.
    say: Callable[[str], None] = _silent

    def start(self) -> list[handles.RankProcess]:
        phase = processes.starting_phase(self.method, len(self.specs))
        if phase:
            self.say(phase)
        self.before()
        return processes.start_ranks(self.method, list(self.specs), self.target, self._args)

    def close(self) -> None:
        self.release()

    def _args(self, rank: int, pipes: handles.RankPipes, close: tuple[int, ...]) -> tuple:
        spec = self.specs[rank]
        if close:  # fork: the other ranks' pipes, and what only the backend knows of
            spec = dataclasses.replace(spec, close_fds=(*close, *self.also_close(rank)))
        args = (spec, self.data(rank), pipes.stdout_w, pipes.stderr_w, pipes.events_w)
        return (*args, pipes.debug_r) if self.debuggable else args
