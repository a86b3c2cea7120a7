"""Signed messages between horo's own processes (the joining rendezvous, heartbeats, hororun's elastic
driver): JSON objects, each framed by its length and signed with the job's secret (HMAC-SHA256), so a peer
without the secret is refused. A message may carry a binary payload (a committed elastic state): its length
and SHA-256 go in the signed body and its bytes follow it, so nothing past the body is read before the
signature has been checked."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import struct
from typing import Any

__all__ = ["BLOB", "MAX_BYTES", "encode", "recv", "send"]

MAX_BYTES = 1 << 20  # of a message's JSON body (a payload is not limited)
BLOB = "_blob"  # the key of a message's binary payload (bytes), outside the JSON
_HEAD = 36  # 4 bytes of length, 32 of HMAC-SHA256


def encode(secret: bytes, obj: Any) -> bytes:
    """One message as bytes: length, HMAC-SHA256 of the JSON body, the body, then any ``obj[BLOB]`` bytes."""
    blob = None
    if isinstance(obj, dict) and BLOB in obj:
        obj = dict(obj)
        blob = obj.pop(BLOB)
        obj["blob_len"], obj["blob_sha256"] = len(blob), hashlib.sha256(blob).hexdigest()
    body = json.dumps(obj, separators=(",", ":")).encode()
    return struct.pack("!I", len(body)) + hmac.new(secret, body, hashlib.sha256).digest() + body + (blob or b"")


def send(sock: socket.socket, secret: bytes, obj: Any) -> None:
    sock.sendall(encode(secret, obj))


def recv(sock: socket.socket, secret: bytes) -> Any:
    """The next message (a payload under ``BLOB``); None at a clean end of the stream.

    Raises:
        PermissionError: a message not signed with ``secret`` (a peer without the job's secret), too long,
            cut short, or whose payload does not match its signed digest.
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
    msg = json.loads(body)
    if isinstance(msg, dict) and "blob_len" in msg:
        blob = _exactly(sock, int(msg.pop("blob_len")))
        if blob is None or hashlib.sha256(blob).hexdigest() != msg.pop("blob_sha256", None):
            raise PermissionError("a message's payload does not match its signed digest")
        msg[BLOB] = blob
    return msg


def _exactly(sock: socket.socket, n: int) -> bytes | None:
    parts, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)
