"""Which processes a test (or a Jupyter kernel) left running: the one rule every leak guard uses.

multiprocessing's forkserver and resource tracker are started once per process and kept on
purpose (warm starts): they are exempt, but only themselves: a process running multiprocessing's
forkserver / resource-tracker entry point whose parent is the watched process or was already
running when the watch began (a kernel started by a fixture), and is not itself a forkserver. A
command-line match alone would hide every leaked rank of a forkserver launch (and its DataLoader
workers): they are forked from the server and carry its command line.

A process whose parent died is reparented to init or to the nearest subreaper above it, and is
no descendant any more; it still carries the watched process's session id. So processes of that
session that appeared after the watch began, are no descendants, and whose parent is init or an
ancestor of the watched process (the only places the kernel reparents them to) count as leaked
too. A CI harness is often a subreaper in the same session: "parent outside the session" alone
would miss every orphan there.
"""

from __future__ import annotations

import os

import psutil

_HELPERS = (
    "from multiprocessing.forkserver import main",
    "from multiprocessing.resource_tracker import main",
)


def is_helper(process: psutil.Process, parents: set[int]) -> bool:
    """A forkserver or resource tracker started by one of ``parents`` (not a process forked
    from a forkserver, which carries the same command line)."""
    try:
        parent = process.ppid()
        if parent not in parents or not _runs(process, _HELPERS):
            return False
        return not _runs(psutil.Process(parent), _HELPERS[:1])
    except psutil.Error:
        return False


def _runs(process: psutil.Process, entry_points: tuple[str, ...]) -> bool:
    command = " ".join(process.cmdline())
    return any(marker in command for marker in entry_points)


def helpers(root: int | None = None) -> set[int]:
    root = os.getpid() if root is None else root
    try:
        children = psutil.Process(root).children()
    except psutil.Error:
        return set()
    return {child.pid for child in children if is_helper(child, {root})}


class ProcessWatch:
    """Snapshot at creation; ``leaked()`` lists what is alive now that was not then."""

    def __init__(self, root: int | None = None) -> None:
        self.root = os.getpid() if root is None else root
        self.session = _session(self.root)
        self.before = self._descendants() | self._session_members()
        self._parents = self.before | {self.root}  # whose helpers are exempt
        self._adopters = _ancestors(self.root) | {1}  # where an orphan of the tree ends up

    def alive(self) -> dict[int, psutil.Process]:
        """Live descendants (helpers excepted) and orphans of the root's session."""
        found = {pid: proc for pid, proc in self._live_descendants().items()}
        for pid in self._session_members() - self.before - set(found):
            proc = _process(pid)
            if proc is not None and _live(proc) and _orphan(proc, self._adopters):
                found[pid] = proc
        return found

    def leaked(self) -> dict[int, psutil.Process]:
        return {pid: proc for pid, proc in self.alive().items() if pid not in self.before}

    def describe(self, processes: dict[int, psutil.Process]) -> list[str]:
        described = []
        for pid, proc in sorted(processes.items()):
            try:
                described.append(f"{pid} (parent {proc.ppid()}): {' '.join(proc.cmdline())[:120]}")
            except psutil.Error:
                described.append(str(pid))
        return described

    def _live_descendants(self) -> dict[int, psutil.Process]:
        try:
            children = psutil.Process(self.root).children(recursive=True)
        except psutil.Error:
            return {}
        return {
            child.pid: child
            for child in children
            if _live(child) and not is_helper(child, self._parents)
        }

    def _descendants(self) -> set[int]:
        try:
            return {child.pid for child in psutil.Process(self.root).children(recursive=True)}
        except psutil.Error:
            return set()

    def _session_members(self) -> set[int]:
        if self.session is None:
            return set()
        members = set()
        for pid in psutil.pids():
            if _session(pid) == self.session:
                members.add(pid)
        return members


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def _live(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _ancestors(pid: int) -> set[int]:
    try:
        return {parent.pid for parent in psutil.Process(pid).parents()}
    except psutil.Error:
        return set()


def _orphan(process: psutil.Process, adopters: set[int]) -> bool:
    """Reparented to init or a subreaper above the watched process: its parent died."""
    try:
        return process.ppid() in adopters
    except psutil.Error:
        return False
