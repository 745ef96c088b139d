"""What stop/resume checks share: the stop button as the kernel gets it (SIGINT once a rank says
it is training) and a user object that a checkpoint must carry.

Used by the stop/resume tests, the tracker tests and the GPU acceptance check (benchmarks/gpu),
so that "interrupted mid-run" means the same everywhere."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path


def interrupt_when(path: Path, delay: float = 0.0, times: int = 1) -> threading.Thread:
    """SIGINT this process (the kernel's role) once ``path`` exists, then ``delay`` later;
    ``times`` presses 50 ms apart. Join the returned thread after the launch."""

    def wait_then_interrupt() -> None:
        deadline = time.monotonic() + 120
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(delay)
        for _ in range(times):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)

    thread = threading.Thread(target=wait_then_interrupt)
    thread.start()
    return thread


class Seen:
    """A user object registered for checkpointing (after prepare()): its count of batches must
    survive a stop and resume."""

    def __init__(self) -> None:
        self.batches = 0

    def state_dict(self) -> dict:
        return {"batches": self.batches}

    def load_state_dict(self, state: dict) -> None:
        self.batches = state["batches"]
