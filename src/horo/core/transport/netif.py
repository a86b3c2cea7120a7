"""This host's IPv4 interfaces (Linux), for horo's own sockets: which addresses to offer, and which interface
carries an address (so that MPI's traffic and horo's take the same path)."""

from __future__ import annotations

import socket
import struct

__all__ = ["addresses", "facing", "interface_of"]

_SIOCGIFADDR = 0x8915


def addresses() -> list[tuple[str, str]]:
    """(interface name, IPv4 address) of every interface that has one, in the kernel's order."""
    try:
        import fcntl
    except ImportError:  # not Linux: no interface table to read
        return []
    out: list[tuple[str, str]] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # down, or no IPv4 address
            out.append((name, socket.inet_ntoa(packed[20:24])))
    return out


def interface_of(ip: str) -> str | None:
    """The name of the interface holding ``ip``, if any."""
    return next((name for name, addr in addresses() if addr == ip), None)


def facing(host: str) -> str:
    """This host's address that faces ``host`` (the source address the kernel routes to it from; no packet is
    sent). Raises ``OSError`` when ``host`` does not resolve or cannot be routed to."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return str(s.getsockname()[0])
