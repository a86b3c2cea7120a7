"""The elastic driver's wire format: horo's signed messages (``horo.core.transport.signed``), one request
and one answer per connection; a peer that cannot sign with the secret hororun handed to the workers gets no
answer. A message may carry a binary payload (the committed elastic state) under ``BLOB``.
"""

from __future__ import annotations

import socket
from typing import Any

from horo.core.transport.signed import BLOB, MAX_BYTES, recv, send

__all__ = ["send_msg", "recv_msg", "local_aliases", "MAX_BYTES", "BLOB"]


def send_msg(sock: socket.socket, key: bytes, msg: dict[str, Any]) -> None:
    """Send ``msg``; a ``bytes`` value under ``BLOB`` goes after the signed body as raw bytes."""
    send(sock, key, msg)


def recv_msg(sock: socket.socket, key: bytes) -> dict[str, Any]:
    """Read one signed message.

    Raises:
        ValueError: the message is missing, too long, malformed, or not signed with ``key``.
    """
    try:
        msg = recv(sock, key)
    except PermissionError as exc:
        raise ValueError(f"elastic driver message refused: {exc}") from None
    if not isinstance(msg, dict):
        raise ValueError("elastic driver message is not an object (or the peer closed the connection)")
    return msg


def local_aliases() -> set[str]:
    """Names under which this machine may appear in a host list: each is a separate host to the driver."""
    names = {"localhost", "127.0.0.1", socket.gethostname()}
    try:
        names.add(socket.getfqdn())
    except OSError:
        pass
    return names
