"""The watch loop's wait on many pipes: one poll object kept across passes.

``multiprocessing.connection.wait`` builds a new selector and registers every descriptor on each
call: with 64 ranks (three pipes and a sentinel each) that was ~1.4 ms of the kernel's CPU per
pass, 20 passes a second, whatever the ranks sent. Beside supervisor.py, which waits with it:
descriptors are registered once and unregistered when they leave the watched set.
"""

from __future__ import annotations

import select
from collections.abc import Iterable

_READABLE = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR


class Poller:
    def __init__(self) -> None:
        self._poll = select.poll()
        self._registered: set[int] = set()

    def wait(self, fds: Iterable[int], timeout: float) -> list[int]:
        """The descriptors of ``fds`` ready to read (or closed), within ``timeout`` seconds."""
        wanted = set(fds)
        for fd in self._registered - wanted:
            self._poll.unregister(fd)
        for fd in wanted - self._registered:
            self._poll.register(fd, _READABLE)
        self._registered = wanted
        try:
            ready = self._poll.poll(max(0, int(timeout * 1000)))
        except InterruptedError:  # (PEP 475 retries; a handler that raised propagates)
            return []
        # POLLNVAL: a descriptor closed behind our back; forget it so the caller sees it as
        # ready and finds it closed, as wait() would.
        return [fd for fd, _ in ready]
