"""Which hosts of a stalled job still answer on the network (hororun's check after a rank's stall line).

When a link is cut silently, every rank stalls, and only the reachable hosts' stall lines arrive; but a
reachable rank may also be killed by the launcher before its own line gets out, so "did not report" alone
can name a healthy host (measured on horo.testbed). A TCP connection attempt tells them apart without any
daemon: a reachable host answers at once, accepting or refusing (RST); a host cut off answers nothing.
"""

from __future__ import annotations

import socket
import threading

__all__ = ["Probe", "PROBE_PORT"]

#: The port tried: ssh's, which a host started over ssh listens on; a closed port answers too (refused).
PROBE_PORT = 22


class Probe:
    """Try a TCP connection to each of ``hosts`` at once, in the background; ``silent()`` waits for the answers.

    A host that neither accepts nor refuses within ``timeout`` seconds (or cannot be routed to) is silent. A
    name that does not resolve is not judged. A firewall that drops connection attempts makes a host look
    silent: the answer only narrows down hosts that already failed to report.
    """

    def __init__(self, hosts: list[str], timeout: float = 2.0, port: int = PROBE_PORT) -> None:
        self.timeout, self.port = timeout, port
        self._answers: dict[str, bool | None] = {}
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._try, args=(h,), name=f"hororun-probe-{h}", daemon=True)
                         for h in dict.fromkeys(hosts)]
        for t in self._threads:
            t.start()

    def _try(self, host: str) -> None:
        answer: bool | None
        try:
            with socket.create_connection((host, self.port), timeout=self.timeout):
                answer = True
        except ConnectionRefusedError:
            answer = True
        except socket.gaierror:
            answer = None
        except OSError:  # timed out, no route to the host, network unreachable
            answer = False
        with self._lock:
            self._answers[host] = answer

    def silent(self) -> list[str]:
        """The hosts that did not answer (waits for the probes, at most about ``timeout`` seconds)."""
        for t in self._threads:
            t.join(self.timeout + 1.0)
        with self._lock:
            return [h for h, ok in self._answers.items() if ok is False]
