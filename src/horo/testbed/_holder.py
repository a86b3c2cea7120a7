"""The long-lived process that owns one emulated host's namespaces (run by ``horo.testbed up``).

It is started as ``ip netns exec NS unshare --uts --ipc --mount [--pid --fork --mount-proc] python -m
horo.testbed._holder NAME HOSTS_FILE``: it names the host, gives it a private /dev/shm and the bed's hosts
file, says ``ready`` on stdout, then sleeps and reaps orphans (as PID 1 of a PID namespace it must: a
process started with ``nsenter`` whose parent exits is re-parented here). Killing it ends every process of
the host, which is how ``down`` clears a host.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

__all__ = ["main"]


def _setup(name: str, hosts_file: str) -> None:
    socket.sethostname(name)
    # A private /dev/shm: MPI shared-memory segments of one "host" must not be visible to another, or
    # intra-"host" transports would silently carry what should cross the network.
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777,size=50%", f"shm-{name}", "/dev/shm"], check=True)
    subprocess.run(["mount", "--bind", hosts_file, "/etc/hosts"], check=True)


def main(argv: list[str]) -> int:
    name, hosts_file = argv
    try:
        _setup(name, hosts_file)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", flush=True)
        return 1
    print("ready", flush=True)
    sys.stdout.close()
    os.close(1)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            time.sleep(0.5)
        except InterruptedError:
            pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
