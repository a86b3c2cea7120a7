"""By hand, on the bed: how fast plain TCP carries bulk data both ways at once between two "hosts".

MODE ``one`` sends 64 MiB each way over a single connection (as Open MPI's TCP BTL does once both directions
share one); ``two`` uses one connection per direction. On the 1 Gbit/s bed (2026-11-23) ``one`` reached
0.94-0.96 of the link each way, so a shared connection is not slow by itself (docs/multihost.md).

    ip netns exec horob-node1 python tests/multihost/tcp_duplex.py one 198.18.0.2 listen &
    ip netns exec horob-node2 python tests/multihost/tcp_duplex.py one 198.18.0.1 connect
"""

import socket
import sys
import threading
import time

TOTAL = 64 << 20
PIECE = 1 << 20
PORTS = (5601, 5602)


def _open(port: int, listen: bool, peer: str) -> socket.socket:
    if listen:
        with socket.socket() as srv:
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            srv.bind(("0.0.0.0", port))
            srv.listen(1)
            srv.settimeout(30)
            return srv.accept()[0]
    for _ in range(300):
        try:
            return socket.create_connection((peer, port), timeout=30)
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"no listener at {peer}:{port}")


def _send(sock: socket.socket) -> None:
    piece = b"x" * PIECE
    for _ in range(TOTAL // PIECE):
        sock.sendall(piece)


def _recv(sock: socket.socket) -> None:
    got = 0
    while got < TOTAL:
        data = sock.recv(PIECE)
        if not data:
            raise SystemExit("the peer closed early")
        got += len(data)


def main() -> None:
    mode, peer, role = sys.argv[1:4]
    listen = role == "listen"
    out = _open(PORTS[0], listen, peer)
    back = out if mode == "one" else _open(PORTS[1], not listen, peer)
    send_on, recv_on = (out, back) if listen else (back, out)
    send_on.sendall(b"go")  # both sides ready before the clock starts
    recv_on.recv(2)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=_send, args=(send_on,)), threading.Thread(target=_recv, args=(recv_on,))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    print(f"{mode} ({role}): {TOTAL * 8 / dt / 1e9:.2f} Gbit/s each way in {dt:.2f} s", flush=True)


if __name__ == "__main__":
    main()
