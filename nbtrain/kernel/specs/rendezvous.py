"""Where ranks meet: a TCPStore held by the launching process on a port the OS picks.

Ranks connect to it as clients (torch's own TORCHELASTIC_USE_AGENT_STORE protocol, as under
torchrun), so plain ``init_process_group("gloo")`` works in user code, no port is ever guessed,
and two notebooks launching at once can never collide (Accelerate's fixed 29500 can).
"""

from __future__ import annotations

import os
import socket
import sys
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


def open_local(
    world_size: int, timeout: float = 1800.0, listen: str | None = LOOPBACK
) -> LocalRendezvous:
    """The store, listening on ``listen`` only (None: every interface, for ranks on other
    machines). Left to itself TCPStore listens on every interface, so a single-machine launch
    would be reachable from the network: it gets a socket bound to the loopback instead."""
    from torch.distributed import TCPStore

    options: dict[str, Any] = {}
    if listen is not None and sys.platform.startswith("linux"):  # master_listen_fd: Linux only
        options["master_listen_fd"] = _listening_socket(listen)
    try:
        store = TCPStore(
            LOOPBACK,
            0,
            world_size,
            is_master=True,
            timeout=timedelta(seconds=timeout),
            wait_for_workers=False,
            **options,
        )
    except BaseException:
        if "master_listen_fd" in options:
            os.close(options["master_listen_fd"])
        raise
    return LocalRendezvous(store, LOOPBACK, store.port)


def _listening_socket(host: str) -> int:
    """A listening socket on ``host`` and a port the OS picks; the store takes over its fd."""
    family, kind, _, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind)
    try:
        listener.bind(address[:2])
        listener.listen(socket.SOMAXCONN)
    except BaseException:
        listener.close()
        raise
    return listener.detach()
