"""Signed messages between horo's own processes (the joining rendezvous, heartbeats): JSON objects, each
framed by its length and signed with the job's secret (HMAC-SHA256), so a peer without the secret is refused."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import struct
from typing import Any

__all__ = ["MAX_BYTES", "encode", "recv", "send"]

MAX_BYTES = 1 << 20
_HEAD = 36  # 4 bytes of length, 32 of HMAC-SHA256


def encode(secret: bytes, obj: Any) -> bytes:
    """One message as bytes: length, HMAC-SHA256 of the JSON body, the body."""
    body = json.dumps(obj, separators=(",", ":")).encode()
    return struct.pack("!I", len(body)) + hmac.new(secret, body, hashlib.sha256).digest() + body


def send(sock: socket.socket, secret: bytes, obj: Any) -> None:
    sock.sendall(encode(secret, obj))


def recv(sock: socket.socket, secret: bytes) -> Any:
    """The next message; None at a clean end of the stream.

    Raises:
        PermissionError: a message not signed with ``secret`` (a peer without the job's secret), or too long.
    """
    head = _exactly(sock, _HEAD)
    if head is None:
        return None
    (n,) = struct.unpack("!I", head[:4])
    if n > MAX_BYTES:
        raise PermissionError(f"a peer announced a message of {n} bytes (at most {MAX_BYTES})")
    body = _exactly(sock, n)
    if body is None or not hmac.compare_digest(head[4:], hmac.new(secret, body, hashlib.sha256).digest()):
        raise PermissionError("a peer sent a message not signed with this job's secret")
    return json.loads(body)


def _exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf
