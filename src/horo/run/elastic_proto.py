"""The elastic driver's wire format: horo's authenticated connections (``horo.core.transport.signed``), one
request and one answer per connection; a peer that does not hold the key hororun handed to the workers gets no
answer. A message may carry a binary payload (the committed elastic state) under ``BLOB``.
"""

from __future__ import annotations

import socket
from typing import Any

from horo.core.transport import signed
from horo.core.transport.signed import BLOB, MAX_BYTES

__all__ = ["BLOB", "MAX_BYTES", "SERVICE", "local_aliases", "request"]

#: The service name the connections' keys are bound to.
SERVICE = "elastic"


def request(address: str, key: bytes, msg: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """Send ``msg`` to the driver at ``address`` (``host:port``) and return its answer.

    Raises:
        OSError: the driver cannot be reached, is busy past ``timeout``, or closed without answering.
        ValueError: the answer is refused (not signed with the connection's key, or not to this request) or
            is not an object.
    """
    host, port = address.rsplit(":", 1)
    conn = signed.connect((host, int(port)), key, SERVICE, timeout=timeout)
    try:
        reply = conn.request(msg, timeout=timeout)
    except signed.Refused as exc:
        raise ValueError(f"elastic driver answer refused: {exc}") from None
    finally:
        conn.close()
    if not isinstance(reply, dict):
        raise ValueError("the elastic driver closed the connection without an answer")
    return reply


def local_aliases() -> set[str]:
    """Names under which this machine may appear in a host list: each is a separate host to the driver."""
    names = {"localhost", "127.0.0.1", socket.gethostname()}
    try:
        names.add(socket.getfqdn())
    except OSError:
        pass
    return names
