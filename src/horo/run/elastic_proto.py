"""The elastic driver's wire format: one JSON object per message, signed with the job's secret (HMAC).

A message is ``<64 hex digits of HMAC-SHA256(key, body)> <body>\\n``; a peer that cannot sign with the
secret hororun handed to the workers gets no answer.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
from typing import Any

__all__ = ["send_msg", "recv_msg", "local_aliases", "MAX_BYTES"]

MAX_BYTES = 1 << 20


def _sign(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, body, hashlib.sha256).hexdigest().encode()


def send_msg(sock: socket.socket, key: bytes, msg: dict[str, Any]) -> None:
    body = json.dumps(msg, separators=(",", ":")).encode()
    sock.sendall(_sign(key, body) + b" " + body + b"\n")


def recv_msg(sock: socket.socket, key: bytes) -> dict[str, Any]:
    """Read one signed message.

    Raises:
        ValueError: the message is too long, malformed, or not signed with ``key``.
    """
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_BYTES:
            raise ValueError("elastic driver message too long")
    mac, _, body = data.rstrip(b"\n").partition(b" ")
    if not hmac.compare_digest(mac, _sign(key, body)):
        raise ValueError("elastic driver message with a bad signature (not this job's secret)")
    msg = json.loads(body)
    if not isinstance(msg, dict):
        raise ValueError("elastic driver message is not an object")
    return msg


def local_aliases() -> set[str]:
    """Names under which this machine may appear in a host list: each is a separate host to the driver."""
    names = {"localhost", "127.0.0.1", socket.gethostname()}
    try:
        names.add(socket.getfqdn())
    except OSError:
        pass
    return names
