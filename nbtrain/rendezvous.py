"""Where ranks meet: a TCPStore held by the launching process on a port the OS picks.

Ranks connect to it as clients (torch's own TORCHELASTIC_USE_AGENT_STORE protocol, as under
torchrun), so plain ``init_process_group("gloo")`` works in user code, no port is ever guessed,
and two notebooks launching at once can never collide (Accelerate's fixed 29500 can).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

LOOPBACK = "127.0.0.1"


@dataclass
class LocalRendezvous:
    store: Any
    host: str
    port: int

    def env(self) -> dict[str, str]:
        return {
            "MASTER_ADDR": self.host,
            "MASTER_PORT": str(self.port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
        }

    def close(self) -> None:
        self.store = None  # dropping the last reference stops the server and frees the port


def open_local(world_size: int, timeout: float = 1800.0) -> LocalRendezvous:
    from torch.distributed import TCPStore

    store = TCPStore(
        LOOPBACK,
        0,
        world_size,
        is_master=True,
        timeout=timedelta(seconds=timeout),
        wait_for_workers=False,
    )
    return LocalRendezvous(store, LOOPBACK, store.port)
