"""The driver's side of horo.spark's connections: a small server for the Spark tasks and the workers.

Every message is a JSON object signed with the job's secret (``horo.core.transport.signed``); one may carry a
binary payload (a pickled result or error) as signed's blob. A task keeps its connection for the whole run:
it registers, forwards its process's output line by line and reports how the function ended; the driver may
answer ``stop`` on it at any time.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from typing import Any

from ..core.transport.signed import BLOB, encode, recv

__all__ = ["Channel", "Server", "connect"]


class Channel:
    """One signed connection; ``send`` may be called from several threads."""

    def __init__(self, sock: socket.socket, secret: bytes) -> None:
        self.sock = sock
        self.secret = secret
        self._lock = threading.Lock()

    def send(self, msg: dict[str, Any], blob: bytes | None = None) -> None:
        data = encode(self.secret, msg if blob is None else {**msg, BLOB: blob})
        with self._lock:
            self.sock.sendall(data)

    def recv(self) -> tuple[dict[str, Any] | None, bytes | None]:
        """(message, payload); (None, None) at the end of the stream or on a message not signed with the secret."""
        try:
            msg = recv(self.sock, self.secret)
        except (OSError, ValueError):
            return None, None
        if not isinstance(msg, dict):
            return None, None
        return msg, msg.pop(BLOB, None)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def connect(address: str, secret: bytes, timeout: float = 30.0) -> Channel:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    sock.settimeout(None)
    return Channel(sock, secret)


class Server:
    """Listens on every interface of the driver's host; ``handle(channel, first_message, payload)`` runs in a
    thread per connection (a connection whose first message is not signed with the secret is dropped)."""

    def __init__(self, secret: bytes, handle: Callable[[Channel, dict[str, Any], bytes | None], None]) -> None:
        self.secret = secret
        self._handle = handle
        self.sock = socket.create_server(("", 0), backlog=128)
        self.port = self.sock.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._serve, name="horo-spark-driver", daemon=True).start()

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), name="horo-spark-conn", daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        channel = Channel(conn, self.secret)
        conn.settimeout(30.0)
        msg, blob = channel.recv()
        if msg is None:
            channel.close()
            return
        conn.settimeout(None)
        self._handle(channel, msg, blob)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self.sock.close()
