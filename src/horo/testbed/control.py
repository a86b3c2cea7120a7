"""Acting on a running bed: the processes of a host, killing them, cutting its link, its byte counters, and
running commands on it (see ``bed`` for the layout)."""

from __future__ import annotations

import os
import signal

from .bed import Bed, run, shell_flags

__all__ = ["exec_argv", "host_pids", "kill_host", "link_bytes", "set_link"]


def _ns_inode(pid: int, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def host_pids(bed: Bed, host: str) -> list[int]:
    """PIDs of the processes on ``host`` other than its holder (what a job left there, or is running)."""
    h = bed.host(host)
    kind = "pid" if h.own_pid_ns else "uts"
    ns = _ns_inode(h.pid, kind)
    if ns is None:
        return []
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != h.pid and _ns_inode(int(entry), kind) == ns:
            out.append(int(entry))
    return sorted(out)


def kill_host(bed: Bed, host: str, sig: int = signal.SIGKILL) -> list[int]:
    """Send ``sig`` to every process on ``host`` except its holder (the host "dies"); returns the PIDs."""
    pids = host_pids(bed, host)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    return pids


def set_link(bed: Bed, host: str, up_: bool) -> None:
    """``ip link set eth0 up|down`` on ``host``: down cuts it silently (no RST, no FIN reaches a peer)."""
    h = bed.host(host)
    run("ip", "-n", h.netns, "link", "set", "eth0", "up" if up_ else "down")


def link_bytes(bed: Bed, host: str) -> tuple[int, int]:
    """(received, sent) bytes on ``host``'s eth0, from the kernel's counters."""
    h = bed.host(host)
    base = ["ip", "netns", "exec", h.netns, "cat"]
    rx = int(run(*base, "/sys/class/net/eth0/statistics/rx_bytes").stdout)
    tx = int(run(*base, "/sys/class/net/eth0/statistics/tx_bytes").stdout)
    return rx, tx


def exec_argv(bed: Bed, host: str, argv: list[str], cwd: str | None = None) -> list[str]:
    """argv that runs ``argv`` on ``host`` (its namespaces, its TMPDIR), keeping the caller's environment.

    On the head there is no extra fork, so the caller's process (and signals to it) is the command itself.
    """
    h = bed.host(host)
    tmp = os.path.join(bed.state, "tmp", h.name)
    return ["nsenter", "-t", str(h.pid), *shell_flags(h).split(), f"--wd={cwd or os.getcwd()}", "--", "env",
            f"TMPDIR={tmp}", *_mpi_env(), *argv]


def _mpi_env() -> list[str]:
    """Open MPI settings for the bed's ranks (hororun forwards them), each unless the caller set it.

    * ``mpi_yield_when_idle=1``: every "host" shares this machine's cores, and the kernel moves their
      packets (veth, tbf) in softirq time on those same cores. Ranks spinning in MPI's progress loop starve
      it until the scheduler preempts them. Measured with 2 ranks on 2 hosts: a 16 B ``Allreduce`` took
      4.2 ms spinning, 42 µs yielding. A real cluster's hosts have cores of their own.
    * ``btl_tcp_links=2``: with one TCP connection per peer, an ``Allreduce`` (both directions at once)
      reached 0.50-0.61 of a 1 Gbit/s link; with two, 0.94-0.96. Two plain TCP streams, one each way,
      reach 0.92-0.94 here. This one may well help a real cluster too; it is not made hororun's default
      without a real network to show it.
    * ``PRTE_MCA_hwloc_default_binding_policy=none`` (read by the launcher on the head): every "host" sees
      all of this machine's cores, so Open MPI bound the first rank of *each* host to core 0, the same
      core. 2 hosts x 1 rank then ran on one core of two: a Keras step of 14 ms took 28 ms in each rank,
      13.3 ms unbound. Unbound, the hosts share the cores as the scheduler sees fit.
    """
    out = []
    for key, value in (("OMPI_MCA_mpi_yield_when_idle", "1"), ("OMPI_MCA_btl_tcp_links", "2"),
                       ("PRTE_MCA_hwloc_default_binding_policy", "none")):
        if key not in os.environ:
            out.append(f"{key}={value}")
    return out
