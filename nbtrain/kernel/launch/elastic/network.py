"""Where node 0's rendezvous endpoint is, seen from this node: host and port, the local
address and network interface that reach it, and whether this node is the one to host it."""

from __future__ import annotations

import ipaddress
import socket
import struct

from nbtrain.kernel.options.config import LaunchConfig


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, port = endpoint.rsplit(":", 1)
    return host.strip("[]"), int(port)


def route_address(host: str, port: int) -> str:
    """This machine's address on the interface that reaches ``host`` (no packet is sent)."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(sockaddr)
        return str(probe.getsockname()[0])


def is_local_address(host: str) -> bool:
    """Can this machine bind ``host``? (True exactly when it is one of its addresses.)"""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, sockaddr in infos:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((sockaddr[0], 0))
            except OSError:
                continue
            return True
    return False


def interface_of(address: str) -> str | None:
    """The network interface holding ``address`` (Linux; None elsewhere or if not found)."""
    try:
        wanted = ipaddress.ip_address(address)
        names = [name for _, name in socket.if_nameindex()]
    except (ValueError, OSError, AttributeError):
        return None
    if wanted.version == 6:
        return _ipv6_interface(wanted)
    for name in names:
        if _ipv4_of(name) == wanted:
            return name
    return None


def _ipv4_of(name: str) -> ipaddress.IPv4Address | None:
    import fcntl

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            request = struct.pack("256s", name[:15].encode())
            packed = fcntl.ioctl(probe.fileno(), siocgifaddr, request)
        except OSError:  # no IPv4 address on this interface
            return None
    return ipaddress.IPv4Address(packed[20:24])


def _ipv6_interface(wanted: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    try:
        with open("/proc/net/if_inet6") as table:
            for line in table:
                fields = line.split()
                if len(fields) >= 6 and ipaddress.IPv6Address(int(fields[0], 16)) == wanted:
                    return fields[5]
    except (OSError, ValueError):
        pass
    return None


def check_endpoint_here(config: LaunchConfig) -> str:
    """Before anything starts: the endpoint resolves, and node 0 is the machine it names.

    Returns this node's address toward the endpoint (its identity in the rendezvous).
    """
    assert config.rdzv_endpoint is not None
    host, port = split_endpoint(config.rdzv_endpoint)
    try:
        address = route_address(host, port)
    except OSError as exc:
        raise ValueError(
            f"rdzv_endpoint={config.rdzv_endpoint!r}: cannot resolve or route to {host!r} "
            f"({exc}). Pass node 0's address as every node can reach it, e.g. '10.0.0.1:{port}'."
        ) from None
    if config.node_rank == 0 and not is_local_address(host):
        raise ValueError(
            f"node_rank=0 hosts the rendezvous at rdzv_endpoint={config.rdzv_endpoint!r}, but "
            f"{host!r} is not an address of this machine ({socket.gethostname()}). Run "
            "node_rank=0 on the machine the endpoint names, or pass this machine's address."
        )
    return address


# ---------------------------------------------------------------------------------------------
# Several nodes: torch's c10d rendezvous


