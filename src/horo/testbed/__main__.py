"""``python -m horo.testbed up [--slurm]|down|status|exec|kill|link``: drive the emulated cluster from a shell."""

from __future__ import annotations

import argparse
import os
import sys

from .bed import HEAD, Bed, TestbedError, down, load, up
from .control import exec_argv, host_pids, kill_host, link_bytes, set_link
from .slurm import down as slurm_down
from .slurm import start as slurm_start

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m horo.testbed",
                                description="An emulated cluster in network namespaces (root only).")
    p.add_argument("--name", default="horo", help="bed name, prefix of its namespaces (default: horo)")
    # --name is also accepted after the subcommand ("down --name b" as well as "--name b down").
    named = argparse.ArgumentParser(add_help=False)
    named.add_argument("--name", dest="sub_name", default=None, help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="create the bed", parents=[named])
    u.add_argument("--hosts", type=int, default=2, help="number of hosts node1..nodeN (default 2)")
    u.add_argument("--slots", type=int, default=2, help="slots per host, for -H lists (default 2)")
    u.add_argument("--rate", help="shape every host link with tbf, e.g. 1gbit or 10gbit")
    u.add_argument("--delay", help="one-way delay, e.g. 50us (needs the netem qdisc)")
    u.add_argument("--prefix", default="node", help="host name prefix (default: node)")
    u.add_argument("--slurm", action="store_true",
                   help="also start munge, slurmctld on the head and a slurmd per host (see horo.testbed.slurm)")
    sub.add_parser("down", help="remove everything the bed made", parents=[named])
    sub.add_parser("status", help="print the hosts, their link counters and processes", parents=[named])
    e = sub.add_parser("exec", help="run a command on a host (head: the login node, for hororun)",
                       parents=[named])
    e.add_argument("host")
    e.add_argument("command", nargs=argparse.REMAINDER)
    k = sub.add_parser("kill", help="SIGKILL every process on a host (its holder stays)", parents=[named])
    k.add_argument("host")
    ln = sub.add_parser("link", help="set a host's link up or down (down: a silent cut)", parents=[named])
    ln.add_argument("host")
    ln.add_argument("state", choices=["up", "down"])
    return p


def _start_slurm(bed: Bed) -> None:
    try:
        slurm = slurm_start(bed)
    except BaseException:
        down(bed.name)
        raise
    print(f"SLURM up: munged on every host, slurmctld on {HEAD}, slurmd on {', '.join(slurm.nodes)} "
          f"({slurm.cpus} CPUs each), partition 'bed'")


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    if getattr(ns, "sub_name", None):
        ns.name = ns.sub_name
    try:
        if ns.cmd == "up":
            bed = up(ns.hosts, ns.slots, ns.rate, ns.delay, name=ns.name, prefix=ns.prefix)
            if ns.slurm:
                _start_slurm(bed)
            print(f"bed {bed.name!r} up: {', '.join(f'{h.name}={h.addr}' for h in bed.hosts)}, "
                  f"{HEAD}={bed.head.addr if bed.head else '?'}; rate {bed.rate or 'unshaped'}")
            print(f"run a job: python -m horo.testbed exec {HEAD} hororun --ssh-command {bed.agent} "
                  f"--network-interface eth0 -np {len(bed.hosts) * bed.slots} -H {bed.hosts_arg()} python x.py")
            if ns.slurm:
                print(f"or through SLURM: python -m horo.testbed exec {HEAD} sbatch -N {len(bed.hosts)} "
                      f"-n {len(bed.hosts) * bed.slots} job.sh   (job.sh runs: hororun -np "
                      f"{len(bed.hosts) * bed.slots} python x.py)")
        elif ns.cmd == "down":
            for item in slurm_down(ns.name):  # stops SLURM first when it runs on the bed
                print(f"removed {item}")
        elif ns.cmd == "status":
            bed = load(ns.name)
            print(f"bed {bed.name!r} state {bed.state} rate {bed.rate or 'unshaped'} agent {bed.agent}")
            for h in [*bed.hosts, *([bed.head] if bed.head else [])]:
                rx, tx = link_bytes(bed, h.name)
                print(f"  {h.name:8s} {h.addr:14s} holder {h.pid:7d} rx {rx:>14,d} tx {tx:>14,d} "
                      f"processes {len(host_pids(bed, h.name))}")
        elif ns.cmd == "exec":
            bed = load(ns.name)
            command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
            if not command:
                raise ValueError(f"exec needs a command. Received: command={command!r}. "
                                 f"HINT: python -m horo.testbed exec {HEAD} hostname")
            argv_ = exec_argv(bed, ns.host, command)
            os.execvp(argv_[0], argv_)
        elif ns.cmd == "kill":
            print(" ".join(map(str, kill_host(load(ns.name), ns.host))))
        elif ns.cmd == "link":
            set_link(load(ns.name), ns.host, ns.state == "up")
    except (TestbedError, ValueError) as exc:
        print(f"horo.testbed: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
