"""Around torch's blocking rendezvous calls (node.py): a status line every few seconds while
one blocks, and torch's rendezvous log kept quiet where its warning would only confuse."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def every(seconds: float, action: Callable[[], None]) -> Iterator[None]:
    """Run ``action`` every ``seconds`` in a helper thread while the block blocks."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # a status line must never break a launch
                action()
            stop.wait(seconds)

    thread = threading.Thread(target=loop, name="nbtrain-rendezvous-status", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def quiet_rendezvous_log() -> Iterator[None]:
    # A peer that already closed the store makes torch log a warning on shutdown; the launch
    # result says what happened, the warning would only confuse.
    log = logging.getLogger("torch.distributed.elastic.rendezvous.dynamic_rendezvous")
    previous = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(previous)
