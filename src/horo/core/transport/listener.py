"""The listening socket every horo server uses: a stranger costs it a few dozen bytes and one slot, never a
thread, never more than :data:`signed.HANDSHAKE_BYTES` read, never longer than the handshake's deadline.

One thread runs a selector over the listening socket and every connection still in its handshake
(``signed.ServerHandshake``). At most ``pending`` such connections are kept: a new one evicts the oldest,
so strangers that hold idle connections cannot keep a job's own processes out (they complete the handshake in
one round trip, a stranger's idle connection never does). A handshake not complete within ``handshake_s``
seconds, or refused, closes the connection and is logged (``signed.refuse``). Only a peer that proved it holds
the key reaches ``on_conn``, in a thread of its own (or in the selector's thread with ``threads=False``, for a
callback that only hands the connection on). Standard library only: the heartbeat process imports it by path.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

if __package__:
    from . import signed
else:  # imported by path, next to signed.py (the heartbeat process: no package import)
    import signed  # type: ignore[no-redef]

__all__ = ["Listener"]


class _Pending:
    __slots__ = ("sock", "hs", "deadline", "peer")

    def __init__(self, sock: socket.socket, hs: signed.ServerHandshake, deadline: float, peer: str) -> None:
        self.sock, self.hs, self.deadline, self.peer = sock, hs, deadline, peer


class Listener:
    """Listen on ``host``:``port`` (0: any free port) for peers holding ``key``, for the service ``service``.

    Raises:
        OSError: the address cannot be bound (taken, or not this host's).
    """

    def __init__(self, host: str, port: int, key: bytes, service: str,
                 on_conn: Callable[[signed.Conn], None], *, pending: int = 32, handshake_s: float = 10.0,
                 threads: bool = True, backlog: int = 128) -> None:
        self.key, self.service, self.on_conn = key, service, on_conn
        self.cap, self.handshake_s, self.threads = pending, handshake_s, threads
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, port), family=family, backlog=backlog)
        self.sock.setblocking(False)
        self.address: tuple[str, int] = self.sock.getsockname()[:2]
        self._pending: OrderedDict[socket.socket, _Pending] = OrderedDict()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.sock, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"horo-listen-{service}", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self.address[1]

    def close(self) -> None:
        """Stop listening; connections already handed on stay open."""
        if self._closed:
            return
        self._closed = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if threading.current_thread() is not self._thread:
            self._thread.join(5.0)

    def _loop(self) -> None:
        try:
            while not self._closed:
                timeout = None
                if self._pending:
                    timeout = max(next(iter(self._pending.values())).deadline - time.monotonic(), 0.0)
                for key, _ in self._sel.select(timeout):
                    if key.fileobj is self.sock:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        self._closed = True
                    else:
                        self._step(key.fileobj)  # type: ignore[arg-type]
                now = time.monotonic()
                while self._pending:
                    p = next(iter(self._pending.values()))
                    if p.deadline > now:
                        break
                    self._drop(p, f"no handshake within {self.handshake_s:g} s")
        finally:
            for p in list(self._pending.values()):
                self._drop(p, None)
            self._sel.close()
            for s in (self.sock, self._wake_r, self._wake_w):
                s.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, or the listening socket closed: try at the next readiness
                return
            if len(self._pending) >= self.cap:
                oldest = next(iter(self._pending.values()))
                self._drop(oldest, f"no handshake while {self.cap} other connections waited for theirs")
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # the server's hello goes at once
            p = _Pending(sock, signed.ServerHandshake(self.key, self.service),
                         time.monotonic() + self.handshake_s, str(addr[0]))
            self._pending[sock] = p
            self._sel.register(sock, selectors.EVENT_READ, None)

    def _drop(self, p: _Pending, reason: str | None) -> None:
        self._pending.pop(p.sock, None)
        try:
            self._sel.unregister(p.sock)
        except (KeyError, ValueError):
            pass
        if reason is not None:  # before the close: a peer that sees the close finds the refusal logged
            signed.refuse(p.peer, self.service, reason)
        p.sock.close()

    def _step(self, sock: socket.socket) -> None:
        p = self._pending.get(sock)
        if p is None:
            return
        try:
            data = sock.recv(p.hs.wanted())
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(p, "the connection failed during the handshake")
            return
        if not data:
            self._drop(p, "closed without a handshake")
            return
        try:
            reply = p.hs.feed(data)
            if reply is not None:
                sock.send(reply)  # a few dozen bytes into an empty socket buffer: never blocks
        except signed.Refused as exc:
            self._drop(p, str(exc))
            return
        except OSError:
            self._drop(p, "the connection failed during the handshake")
            return
        if not p.hs.done:
            return
        self._pending.pop(sock, None)
        self._sel.unregister(sock)
        sock.setblocking(True)
        conn = p.hs.conn(sock)
        if self.threads:
            threading.Thread(target=self._serve, args=(conn,), name=f"horo-{self.service}", daemon=True).start()
        else:
            self._serve(conn)

    def _serve(self, conn: signed.Conn) -> None:
        try:
            self.on_conn(conn)
        except Exception as exc:  # noqa: BLE001 - one connection's failure must not end the server
            signed.refuse(conn.peer, self.service, f"its request failed: {exc!r}")
            conn.close()
