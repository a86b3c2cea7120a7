"""Authenticated connections between horo's own processes (the joining, heartbeats, hororun's elastic driver,
horo.spark): the one framing every control-plane socket of horo speaks (threat model: docs/design-join.md).

A connection opens with a handshake: the client sends a fresh random nonce, the server answers with its own
and a proof that it holds the job's key, the client proves the same. Both derive the connection's key from
the job's key, a label naming the service and the two nonces, so nothing recorded from another connection,
another service or an earlier run verifies here. Every message is then a fixed-size header (version,
direction, sequence number, the sequence number it answers, lengths) with its HMAC-SHA256, read and checked
before any other byte; then the JSON body and any binary payload, with an HMAC of their own. A reflected
message (wrong direction), a replayed, dropped or reordered one (wrong sequence number), an answer to another
request, or one cut short is refused. Standard library only: the heartbeat process imports this file by path.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import select
import socket
import struct
import threading
import time
from typing import Any

__all__ = ["BLOB", "HANDSHAKE_BYTES", "MAX_BYTES", "Conn", "Refused", "ServerHandshake", "accept", "client", "connect",
           "refuse"]

MAX_BYTES = 1 << 20  # of a message's JSON body (a payload's length is authenticated, and not limited)
BLOB = "_blob"  # the key of a message's binary payload (bytes), outside the JSON
_NONCE, _TAG = 16, 32
_C_MAGIC, _S_MAGIC, _F_MAGIC, _VERSION = b"HOc1", b"HOs1", b"HF", 1
_HELLO = len(_C_MAGIC) + _NONCE  # the client's first bytes
_SERVER_HELLO = len(_S_MAGIC) + _NONCE + _TAG
#: What a server reads from a peer before it knows whether the peer holds the key.
HANDSHAKE_BYTES = _HELLO + _TAG
# magic, version, direction, sequence number, the sequence number answered + 1 (0: none), body and blob lengths
_HEAD = struct.Struct("!2sBBQQIQ")
_TO_SERVER, _TO_CLIENT = 1, 2
_RATE = 1 << 20  # bytes a second an authenticated peer is given at least, past its header's deadline

_log = logging.getLogger("horo.security")
_logged: set[tuple[str, str, str]] = set()
_logged_lock = threading.Lock()


class Refused(PermissionError):
    """Bytes from a peer that does not hold the job's key, or that replay, reflect or reorder its messages."""


def refuse(peer: str, service: str, reason: str) -> None:
    """Log a refusal once per peer address, service and reason, at WARNING on logger ``horo.security``."""
    with _logged_lock:
        if (peer, service, reason) in _logged or len(_logged) > 4096:  # bounded: a flood from many addresses
            return
        _logged.add((peer, service, reason))
    _log.warning("horo: refused a connection from %s to %s: %s", peer, service, reason)


def _mac(key: bytes, *parts: bytes) -> bytes:
    h = hmac.new(key, digestmod=hashlib.sha256)
    for p in parts:
        h.update(p)
    return h.digest()


def _conn_key(key: bytes, label: str, cn: bytes, sn: bytes) -> bytes:
    return _mac(key, b"horo connection|", label.encode(), b"|", cn, sn)


def _peer(sock: socket.socket) -> str:
    try:
        name = sock.getpeername()
    except OSError:
        return "?"
    return str(name[0]) if isinstance(name, tuple) else "a local socket"


def _ready(sock: socket.socket, deadline: float | None) -> None:
    """Wait until ``sock`` has bytes (or its end) to read; ``TimeoutError`` past ``deadline`` (monotonic; None:
    no limit). A poll, not a socket timeout: another thread may be sending on the same socket meanwhile."""
    if deadline is None and sock.gettimeout() != 0.0:
        return  # a blocking read waits by itself
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise TimeoutError("a message was not complete in time")
        if poller.poll(None if left is None else left * 1000):
            return


def _no_delay(sock: socket.socket) -> None:
    # Small messages in turn (hello, proof, request): Nagle's wait for an acknowledgement would add the peer's
    # delayed-ACK time (40 ms on Linux) to each exchange.
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass


def _read(sock: socket.socket, n: int, deadline: float | None) -> bytes | None:
    """Exactly ``n`` bytes by ``deadline`` (monotonic; None: no limit); None at a clean end before the first."""
    parts, got = [], 0
    while got < n:
        _ready(sock, deadline)
        try:
            chunk = sock.recv(min(n - got, 1 << 20))
        except (BlockingIOError, InterruptedError):
            continue
        if not chunk:
            if got:
                raise Refused(f"a message cut short ({got} of {n} bytes)")
            return None
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


class Conn:
    """One authenticated connection (after the handshake). ``send`` may be called from several threads; one
    thread receives. ``seq`` and ``answers`` describe the last message received."""

    def __init__(self, sock: socket.socket, key: bytes, is_client: bool, service: str) -> None:
        self.sock, self._key, self.service = sock, key, service
        sock.settimeout(None)  # deadlines are polls (``_ready``): a timeout would also cut a sender short
        _no_delay(sock)
        self._out, self._in = (_TO_SERVER, _TO_CLIENT) if is_client else (_TO_CLIENT, _TO_SERVER)
        self._sent = self._got = 0
        self.seq, self.answers = -1, 0
        self.peer = _peer(sock)
        self._lock = threading.Lock()
        self._pending = b""  # the rest of a frame ``send_nowait`` began

    def _frame(self, obj: Any, answers: int) -> bytes:
        blob = b""
        if isinstance(obj, dict) and BLOB in obj:
            obj = dict(obj)
            blob = obj.pop(BLOB)
        body = json.dumps(obj, separators=(",", ":")).encode()
        head = _HEAD.pack(_F_MAGIC, _VERSION, self._out, self._sent, answers, len(body), len(blob))
        tag = _mac(self._key, head)
        return b"".join((head, tag, body, blob, _mac(self._key, tag, body, blob)))

    def send(self, obj: Any, answers: int = 0) -> int:
        """Send ``obj`` (a JSON value; a dict's ``BLOB`` bytes go as a raw payload); returns its sequence number.
        ``answers``: the sequence number of the request this answers, plus one (0: not an answer)."""
        with self._lock:
            data = self._frame(obj, answers)
            if self._pending:
                self.sock.sendall(self._pending)
                self._pending = b""
            self.sock.sendall(data)
            self._sent += 1
            return self._sent - 1

    def send_nowait(self, obj: Any) -> bool:
        """Send without blocking (a non-blocking socket): False when nothing could go out now. A frame begun
        is finished before the next one, so the stream stays whole."""
        with self._lock:
            try:
                if self._pending:
                    self._pending = self._pending[self.sock.send(self._pending):]
                    if self._pending:
                        return False
                data = self._frame(obj, 0)
                n = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                return False
            self._pending = data[n:]
            self._sent += 1
            return True

    def reply(self, obj: Any) -> int:
        """Send ``obj`` as the answer to the last message received."""
        return self.send(obj, answers=self.seq + 1)

    def recv(self, wait: float | None = None, within: float = 30.0) -> Any:
        """The next message (a payload under ``BLOB``), or None at a clean end of the stream.

        Waits up to ``wait`` seconds (None: for ever) for it to begin; once begun, the whole message must arrive
        within ``within`` seconds (more for a long payload), not ``within`` per read.

        Raises:
            Refused: not signed with this connection's key, reflected, replayed, out of order or cut short.
            TimeoutError: nothing began within ``wait``, or the message was not complete in time.
        """
        size = _HEAD.size + _TAG
        while True:
            _ready(self.sock, None if wait is None else time.monotonic() + wait)
            try:
                first = self.sock.recv(size)
                break
            except (BlockingIOError, InterruptedError):
                continue
        if not first:
            return None
        deadline = time.monotonic() + within
        rest = _read(self.sock, size - len(first), deadline) if len(first) < size else b""
        if rest is None:
            raise Refused("a message cut short")
        head, tag = (first + rest)[:_HEAD.size], (first + rest)[_HEAD.size:]
        if not hmac.compare_digest(tag, _mac(self._key, head)):
            raise Refused("a message not signed with this connection's key")
        magic, version, direction, seq, answers, n, m = _HEAD.unpack(head)
        if magic != _F_MAGIC or version != _VERSION:
            raise Refused(f"an unknown framing (version {version})")
        if direction != self._in:
            raise Refused("a reflected message (this side's own direction)")
        if seq != self._got:
            raise Refused(f"a replayed or reordered message (number {seq}, expected {self._got})")
        if n > MAX_BYTES:
            raise Refused(f"a message of {n} bytes (at most {MAX_BYTES})")
        tail = _read(self.sock, n + m + _TAG, deadline + (n + m) / _RATE)
        if tail is None:
            raise Refused("a message cut short")
        body, blob = tail[:n], tail[n:n + m]
        if not hmac.compare_digest(tail[n + m:], _mac(self._key, tag, body, blob)):
            raise Refused("a message whose body does not match its signed header")
        self._got += 1
        self.seq, self.answers = seq, answers
        msg = json.loads(body)
        if m and isinstance(msg, dict):
            msg[BLOB] = blob
        return msg

    def request(self, obj: Any, timeout: float = 30.0) -> Any:
        """Send ``obj`` and return the answer to it (None: the peer closed the connection first).

        Raises:
            Refused: the answer is to another request, or is refused as :meth:`recv` says.
        """
        seq = self.send(obj)
        msg = self.recv(wait=timeout, within=timeout)
        if msg is not None and self.answers != seq + 1:
            raise Refused(f"an answer to another request ({self.answers - 1}, not {seq})")
        return msg

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class ServerHandshake:
    """The server's side of the handshake, fed bytes as they arrive (a selector drives it): it never asks for
    more than :data:`HANDSHAKE_BYTES` in all, and says when the peer has proven it holds the key."""

    def __init__(self, key: bytes, service: str) -> None:
        self.key, self.service = key, service
        self.buf = b""
        self._ck: bytes | None = None
        self.done = False

    def wanted(self) -> int:
        """How many more bytes the current step needs."""
        return (_HELLO if self._ck is None else HANDSHAKE_BYTES) - len(self.buf)

    def feed(self, data: bytes) -> bytes | None:
        """Take bytes the peer sent (at most :meth:`wanted`); returns the server's hello to send once the
        client's is complete. Raises :class:`Refused` for a peer that is not a horo process of this job."""
        self.buf += data
        if self._ck is None and len(self.buf) == _HELLO:
            if self.buf[:len(_C_MAGIC)] != _C_MAGIC:
                raise Refused("not horo's handshake")
            sn = os.urandom(_NONCE)
            self._ck = _conn_key(self.key, self.service, self.buf[len(_C_MAGIC):], sn)
            return _S_MAGIC + sn + _mac(self._ck, b"server")
        if self._ck is not None and len(self.buf) == HANDSHAKE_BYTES:
            if not hmac.compare_digest(self.buf[_HELLO:], _mac(self._ck, b"client")):
                raise Refused("a peer without this job's key")
            self.done = True
        return None

    def conn(self, sock: socket.socket) -> Conn:
        assert self.done and self._ck is not None
        return Conn(sock, self._ck, is_client=False, service=self.service)


def client(sock: socket.socket, key: bytes, service: str, timeout: float = 10.0) -> Conn:
    """The client's side of the handshake on a connected socket.

    Raises:
        ConnectionResetError: the server closed the connection during the handshake (it was busy, or does not
            take this key: a client may try again).
        Refused: the server does not hold the key (another program on that port).
    """
    deadline = time.monotonic() + timeout
    cn = os.urandom(_NONCE)
    _no_delay(sock)
    sock.settimeout(timeout)
    sock.sendall(_C_MAGIC + cn)
    hello = _read(sock, _SERVER_HELLO, deadline)
    if hello is None:
        raise ConnectionResetError(f"{_peer(sock)} closed the connection during the handshake ({service})")
    if hello[:len(_S_MAGIC)] != _S_MAGIC:
        raise Refused("the server does not speak horo's handshake")
    sn = hello[len(_S_MAGIC):len(_S_MAGIC) + _NONCE]
    ck = _conn_key(key, service, cn, sn)
    if not hmac.compare_digest(hello[len(_S_MAGIC) + _NONCE:], _mac(ck, b"server")):
        raise Refused("the server does not hold this job's key")
    sock.sendall(_mac(ck, b"client"))
    return Conn(sock, ck, is_client=True, service=service)


def accept(sock: socket.socket, key: bytes, service: str, timeout: float = 10.0) -> Conn:
    """The server's side of the handshake on an accepted socket, blocking (``listener.Listener`` drives many at
    once). Raises :class:`Refused` or ``OSError`` (``TimeoutError``: not complete within ``timeout``)."""
    deadline = time.monotonic() + timeout
    hs = ServerHandshake(key, service)
    while not hs.done:
        data = _read(sock, hs.wanted(), deadline)
        if data is None:
            raise ConnectionResetError("the peer closed the connection during the handshake")
        reply = hs.feed(data)
        if reply is not None:
            sock.sendall(reply)
    return hs.conn(sock)


def connect(address: tuple[str, int], key: bytes, service: str, timeout: float = 10.0) -> Conn:
    """Connect and authenticate to a horo server, trying again while it is busy (it closed the connection during
    the handshake: a flood of strangers slows a job down, never stops it) until ``timeout`` seconds have passed.

    Raises:
        OSError: nothing listens there, or it stayed busy past ``timeout``.
        Refused: what listens there does not hold the key.
    """
    deadline = time.monotonic() + timeout
    pause = 0.05
    while True:
        sock = None
        try:
            sock = socket.create_connection(address, timeout=max(deadline - time.monotonic(), 0.1))
            return client(sock, key, service, max(deadline - time.monotonic(), 0.1))
        except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError, TimeoutError):
            if sock is not None:
                sock.close()
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 1.0)
        except BaseException:
            if sock is not None:
                sock.close()
            raise
