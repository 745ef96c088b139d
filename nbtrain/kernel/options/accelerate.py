"""The parameters of Accelerate's ``notebook_launcher`` that nbtrain has no own name for, each
taken with Accelerate's meaning or refused with a clear error (before anything starts).

Accelerate 1.15 also has ``use_port``, ``master_addr``, ``rdzv_backend``, ``rdzv_conf``,
``rdzv_id``, ``monitor_interval`` and ``log_line_prefix_template``. nbtrain's ranks on one
machine meet at a store on a port the OS picks (never a collision), nodes meet at torch's c10d
rendezvous on node 0's endpoint, and a rank's end is noticed at once: so these reduce to the
endpoint and the rendezvous timeout (``build_config`` checks both like any other value).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

ACCELERATE_PORT = 29500  # Accelerate's use_port default: the endpoint port when only master_addr
ACCEPTED_BACKENDS = ("static", "c10d")
_TIMEOUT_KEYS = ("join_timeout", "timeout")  # torch's c10d and static backends' names for it
_DEFAULT_RDZV_TIMEOUT = 900.0


@dataclass(frozen=True)
class Rendezvous:
    endpoint: object  # checked by build_config (rdzv_endpoint)
    timeout: object  # checked by build_config (rdzv_timeout)


def resolve(
    *,
    num_nodes: object,
    node_rank: object,
    rdzv_endpoint: object,
    rdzv_timeout: object,
    use_port: object,
    master_addr: object,
    rdzv_backend: object,
    rdzv_conf: object,
    rdzv_id: object,
    monitor_interval: object,
    log_line_prefix_template: object,
) -> Rendezvous:
    """nbtrain's endpoint and rendezvous timeout from nbtrain's and Accelerate's parameters."""
    _check_backend(rdzv_backend)
    if not isinstance(rdzv_id, str):
        raise TypeError(
            f"rdzv_id={rdzv_id!r} must be a string. (nbtrain opens a rendezvous of its own for "
            "each launch, so runs never mix and the id may be left out.)"
        )
    _check_monitor_interval(monitor_interval)
    if log_line_prefix_template is not None:
        raise ValueError(
            f"log_line_prefix_template={log_line_prefix_template!r} is not supported: nbtrain "
            "labels each rank's output lines itself (output='all' shows every rank's lines "
            "under its rank, output='rank0' only rank 0's). Leave it out."
        )
    port = _check_port(use_port)
    address = _check_address(master_addr)
    endpoint = None if rdzv_endpoint == "" else rdzv_endpoint  # "": Accelerate's default
    multi_node = isinstance(num_nodes, int) and num_nodes > 1
    if endpoint is None and multi_node and (address is not None or port is not None):
        # Accelerate's static rendezvous: master_addr:use_port when no rdzv_endpoint is given
        host = f"[{address}]" if address and ":" in address else (address or "127.0.0.1")
        endpoint = f"{host}:{port or ACCELERATE_PORT}"
    timeout = _conf_timeout(rdzv_conf, node_rank, rdzv_timeout)
    return Rendezvous(endpoint, rdzv_timeout if timeout is None else timeout)


def _check_backend(backend: object) -> None:
    if backend in ACCEPTED_BACKENDS:
        return  # both form the same fixed world of num_nodes nodes, on node 0's endpoint
    raise ValueError(
        f"rdzv_backend={backend!r} is not supported: nbtrain runs torch's c10d rendezvous on "
        "node 0's rdzv_endpoint, with node ranks from node_rank ('static' and 'c10d' are "
        "accepted and behave alike). Pass rdzv_backend='static' or leave it out."
    )


def _check_monitor_interval(interval: object) -> None:
    """Accelerate's elastic agent polls its ranks every ``monitor_interval`` seconds; nbtrain
    waits on their pipes and exits, so it notices a failure at once, within any interval."""
    if isinstance(interval, bool) or not isinstance(interval, numbers.Real):
        raise TypeError(f"monitor_interval={interval!r} must be a number of seconds, e.g. 0.1.")
    if not 0 < float(interval) < math.inf:
        raise ValueError(f"monitor_interval={interval!r} must be a finite number of seconds > 0.")


def _check_port(port: object) -> int | None:
    """Accelerate's use_port (a string there by default). Single node: nbtrain's ranks meet on a
    port the OS picks instead (no collision with other launches); multi-node: node 0's port."""
    if port is None:
        return None
    text = str(port).strip() if isinstance(port, (str, int)) and not isinstance(port, bool) else ""
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(
            f"use_port={port!r} must be a port number in 1..65535, e.g. use_port=29500 (used "
            "as node 0's rendezvous port when num_nodes > 1; one node needs none)."
        )
    return int(text)


def _check_address(address: object) -> str | None:
    if address is None:
        return None
    if not isinstance(address, str) or not address.strip():
        raise ValueError(
            f"master_addr={address!r} must be node 0's host name or IP address, e.g. "
            "master_addr='10.0.0.1' (used with use_port when num_nodes > 1)."
        )
    return address.strip().strip("[]")


def _conf_timeout(conf: object, node_rank: object, rdzv_timeout: object) -> object:
    """rdzv_conf: torch's rendezvous options. Taken: the join timeout, and the node's rank
    (Accelerate's static backend sets it to node_rank); anything else is refused."""
    if conf is None:
        return None
    if not isinstance(conf, dict):
        raise TypeError(f"rdzv_conf={conf!r} must be a dict or None.")
    unknown = sorted(set(conf) - {"rank", *_TIMEOUT_KEYS}, key=str)
    if unknown:
        raise ValueError(
            f"rdzv_conf={conf!r}: {', '.join(map(repr, unknown))} not supported. nbtrain's "
            "rendezvous takes only its join timeout (rdzv_conf={'join_timeout': seconds}, or "
            "rdzv_timeout=seconds) and the node's rank (node_rank=)."
        )
    if "rank" in conf and conf["rank"] != node_rank:
        raise ValueError(
            f"rdzv_conf={conf!r} gives rank {conf['rank']!r} but node_rank={node_rank!r}: "
            "they must agree (or leave 'rank' out: node_rank decides)."
        )
    given = {conf[key] for key in _TIMEOUT_KEYS if key in conf}
    if not given:
        return None
    if len(given) > 1 or rdzv_timeout not in (_DEFAULT_RDZV_TIMEOUT, *given):
        raise ValueError(
            f"rdzv_conf={conf!r} and rdzv_timeout={rdzv_timeout!r} give different rendezvous "
            "timeouts: pass one of them."
        )
    return given.pop()
