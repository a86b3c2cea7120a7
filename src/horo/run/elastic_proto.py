"""The elastic driver's wire format: one JSON object per message, signed with the job's secret (HMAC).

A message is ``<64 hex digits of HMAC-SHA256(key, body)> <body>\\n``; a peer that cannot sign with the
secret hororun handed to the workers gets no answer. A message may carry a binary payload (the committed
elastic state): its length and SHA-256 go in the signed body, and the bytes follow the line, so nothing is
read past the line before the signature has been checked.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
from typing import Any

__all__ = ["send_msg", "recv_msg", "local_aliases", "MAX_BYTES", "BLOB"]

MAX_BYTES = 1 << 20
BLOB = "_blob"  # key of a message's binary payload (bytes), outside the JSON


def _sign(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, body, hashlib.sha256).hexdigest().encode()


def send_msg(sock: socket.socket, key: bytes, msg: dict[str, Any]) -> None:
    """Send ``msg``; a ``bytes`` value under ``BLOB`` goes after the signed line as raw bytes."""
    msg = dict(msg)
    blob = msg.pop(BLOB, None)
    if blob is not None:
        msg["blob_len"], msg["blob_sha256"] = len(blob), hashlib.sha256(blob).hexdigest()
    body = json.dumps(msg, separators=(",", ":")).encode()
    sock.sendall(_sign(key, body) + b" " + body + b"\n")
    if blob is not None:
        sock.sendall(blob)


def recv_msg(sock: socket.socket, key: bytes) -> dict[str, Any]:
    """Read one signed message.

    Raises:
        ValueError: the message is too long, malformed, or not signed with ``key``.
    """
    data = b""
    while b"\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_BYTES and b"\n" not in data[:MAX_BYTES]:
            raise ValueError("elastic driver message too long")
    line, _, rest = data.partition(b"\n")
    mac, _, body = line.partition(b" ")
    if not hmac.compare_digest(mac, _sign(key, body)):
        raise ValueError("elastic driver message with a bad signature (not this job's secret)")
    msg = json.loads(body)
    if not isinstance(msg, dict):
        raise ValueError("elastic driver message is not an object")
    if "blob_len" in msg:
        size = int(msg.pop("blob_len"))
        parts, got = [rest], len(rest)
        while got < size:
            chunk = sock.recv(min(1 << 20, size - got))
            if not chunk:
                raise ValueError(f"elastic driver message cut short: {got} of {size} payload bytes")
            parts.append(chunk)
            got += len(chunk)
        blob = b"".join(parts)
        if len(blob) != size or hashlib.sha256(blob).hexdigest() != msg.pop("blob_sha256", None):
            raise ValueError("elastic driver message payload does not match its signed digest")
        msg[BLOB] = blob
    return msg


def local_aliases() -> set[str]:
    """Names under which this machine may appear in a host list: each is a separate host to the driver."""
    names = {"localhost", "127.0.0.1", socket.gethostname()}
    try:
        names.add(socket.getfqdn())
    except OSError:
        pass
    return names
