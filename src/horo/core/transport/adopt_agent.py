"""The two small programs of the joining (``adopt.py``), run as ``python -m horo.core.transport.adopt_agent``:

- ``placeholder``: started by Open MPI as rank k of the joining job; hands its MPI environment to process k
  of the launcher's world and stays until that process ends, then ends with it;
- ``remote-start [ssh options] HOST COMMAND...``: Open MPI's remote-start program (in place of ssh): asks
  the process of local rank 0 on HOST to start Open MPI's daemon with the parameters in COMMAND (never the
  command itself: ``daemon``), and relays its output and status.

Both read ``HORO_JOIN_SECRET`` (the key), ``HORO_JOIN_TABLE`` (every rank's server, in rank order) and
``HORO_JOIN_AGENTS`` (host -> its local rank 0's server) from the environment rank 0 started the job with.
"""

from __future__ import annotations

import json
import os
import sys

from . import daemon, signed
from .adopt import _MPI_PREFIXES, SERVER

__all__ = ["main"]


def _connect(address: str) -> signed.Conn:
    host, port = address.rsplit(":", 1)
    return signed.connect((host, int(port)), os.environ["HORO_JOIN_SECRET"].encode(), SERVER, timeout=30)


def placeholder() -> int:
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    table = json.loads(os.environ["HORO_JOIN_TABLE"])
    conn = _connect(table[rank])
    conn.send({"kind": "placeholder", "rank": rank,
               "env": {k: v for k, v in os.environ.items() if k.startswith(_MPI_PREFIXES)}})
    try:
        msg = conn.recv(wait=None)  # blocks while process `rank` runs
    except (OSError, signed.Refused):
        msg = None
    return 0 if isinstance(msg, dict) and msg.get("bye") == 0 else 1


def remote_start(argv: list[str]) -> int:
    # ssh's calling convention: options first (Open MPI passes e.g. -x), then the host, then the command.
    args = list(argv)
    while args and args[0].startswith("-"):
        args.pop(0)
    if len(args) < 2:
        sys.stderr.write(f"horo remote-start: expected HOST COMMAND. Received: {argv!r}\n")
        return 255
    host, command = args[0], " ".join(args[1:])
    agents = json.loads(os.environ["HORO_JOIN_AGENTS"])
    if host not in agents:
        sys.stderr.write(f"horo remote-start: no process of the joining world runs on {host!r}. Received: "
                         f"host={host!r}; hosts: {sorted(agents)}\n")
        return 255
    try:
        params = daemon.parameters(command)
    except ValueError as exc:
        sys.stderr.write(f"horo remote-start: {exc}\n")
        return 255
    conn = _connect(agents[host])
    seq = conn.send({"kind": "daemon", "args": params})
    while True:
        try:
            msg = conn.recv(wait=None)
        except (OSError, signed.Refused):
            return 255
        if msg is None:
            return 255
        if conn.answers != seq + 1:
            return 255
        if "out" in msg:
            sys.stdout.write(msg["out"])
            sys.stdout.flush()
        elif "rc" in msg:
            return int(msg["rc"])


def main(argv: list[str]) -> int:
    if argv[:1] == ["placeholder"]:
        return placeholder()
    if argv[:1] == ["remote-start"]:
        return remote_start(argv[1:])
    sys.stderr.write(f"usage: python -m horo.core.transport.adopt_agent placeholder | remote-start HOST CMD. "
                     f"Received: {argv!r}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
