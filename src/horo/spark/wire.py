"""The driver's side of horo.spark's connections: a small server for the Spark tasks and the workers.

Every connection is one of horo's authenticated ones (``horo.core.transport.signed``), keyed with the run's
secret; a message is a JSON object and may carry a binary payload (a pickled result or error). A task keeps its
connection for the whole run: it registers, forwards its process's output line by line and reports how the
function ended; the driver may answer ``stop`` on it at any time.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable
from typing import Any

from ..core.transport import signed
from ..core.transport.listener import Listener
from ..core.transport.signed import BLOB

__all__ = ["SERVICE", "Channel", "Server", "connect"]

#: The service name the connections' keys are bound to.
SERVICE = "spark"


class Channel:
    """One authenticated connection; ``send`` may be called from several threads, ``recv`` from one."""

    def __init__(self, conn: signed.Conn) -> None:
        self.conn = conn
        self.sock: socket.socket = conn.sock

    def send(self, msg: dict[str, Any], blob: bytes | None = None) -> None:
        self.conn.send(msg if blob is None else {**msg, BLOB: blob})

    def recv(self, wait: float | None = None) -> tuple[dict[str, Any] | None, bytes | None]:
        """(message, payload); (None, None) at the end of the stream, after ``wait`` seconds without one, or
        on a message refused (``signed``)."""
        try:
            msg = self.conn.recv(wait=wait, within=60.0)
        except signed.Refused as exc:
            signed.refuse(self.conn.peer, SERVICE, str(exc))
            return None, None
        except (OSError, ValueError):
            return None, None
        if not isinstance(msg, dict):
            return None, None
        return msg, msg.pop(BLOB, None)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()


def connect(address: str, secret: bytes, timeout: float = 30.0) -> Channel:
    host, port = address.rsplit(":", 1)
    return Channel(signed.connect((host, int(port)), secret, SERVICE, timeout=timeout))


class Server:
    """Listens on ``host`` (the driver's address the executors reach: Spark's own); ``handle(channel,
    first_message, payload)`` runs in a thread per authenticated connection."""

    def __init__(self, secret: bytes, handle: Callable[[Channel, dict[str, Any], bytes | None], None],
                 host: str = "127.0.0.1") -> None:
        self._handle = handle
        self.listener = Listener(host, 0, secret, SERVICE, self._one)
        self.port = self.listener.port

    def _one(self, conn: signed.Conn) -> None:
        channel = Channel(conn)
        msg, blob = channel.recv(wait=30.0)
        if msg is None:
            channel.close()
            return
        self._handle(channel, msg, blob)

    def close(self) -> None:
        self.listener.close()
