"""An emulated cluster on one Linux machine: network namespaces joined by a bridge, one per "host".

Layout of a bed named ``NAME`` with hosts ``node1..nodeN`` (all addresses in 198.18.0.0/24, RFC 2544's
benchmarking range, and only inside the bed's own namespaces):

- netns ``NAME-br`` holds a bridge ``br0``; every host has a veth pair, ``eth0`` on its side and a port named
  after the host on the bridge. Nothing connects to the machine's own network namespace.
- netns ``NAME-nodeK`` (address 198.18.0.K): a holder process (``_holder``) in its own UTS (hostname), IPC,
  PID and mount namespaces, with a private /dev/shm and the bed's /etc/hosts. Without the IPC/PID/shm
  separation, MPI moves "cross-host" data through shared memory and the link carries nothing.
- netns ``NAME-head`` (198.18.0.254): the login node, where ``hororun``/``mpiexec`` run. It has its own
  hostname and hosts file but shares the machine's PID namespace, so its ``nsenter`` can reach every host's
  holder by PID: that is what the ssh stand-in (``STATE/ssh``) does for the MPI launcher's remote start.
- ``--rate`` puts a ``tbf`` on both directions of every node's link (node egress and the bridge port);
  ``--delay`` needs ``netem``, which this code will not fake when the kernel lacks it.

The state (PIDs, settings, hosts file, ssh stand-in, per-host TMPDIR) lives in ``STATE = $HORO_TESTBED_DIR/NAME``
(default /run/horo-testbed/NAME). Everything needs root and iproute2 (``ip``, ``tc``) and util-linux
(``unshare``, ``nsenter``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["HEAD", "SUBNET", "Bed", "Host", "TestbedError", "down", "load", "run", "shell_flags", "state_dir",
           "unsupported_reason", "up"]

SUBNET = "198.18.0"  # /24, RFC 2544 benchmarking range
HEAD = "head"
_HEAD_OCTET = 254
_CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")
_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(k|m|g)?bit$")
_DELAY_RE = re.compile(r"^\d+(?:\.\d+)?(us|ms|s)$")
_TOOLS = ("ip", "tc", "unshare", "nsenter", "mount")


class TestbedError(RuntimeError):
    """The bed cannot be made, found or changed; the message says why and what to do."""

    __test__ = False  # not a pytest test class, despite the name


@dataclass
class Host:
    """One emulated host: its name, address, network namespace and holder PID (in the machine's PID space)."""

    name: str
    addr: str
    netns: str
    pid: int
    own_pid_ns: bool = True


@dataclass
class Bed:
    """A bed that is up, as recorded in its state directory."""

    name: str
    state: str
    hosts: list[Host] = field(default_factory=list)  # the nodes, in order; the head is separate
    head: Host | None = None
    slots: int = 1
    rate: str | None = None

    @property
    def agent(self) -> str:
        """Path of the ssh stand-in: ``AGENT [ssh options] HOST COMMAND...``."""
        return os.path.join(self.state, "ssh")

    @property
    def bridge_netns(self) -> str:
        return f"{self.name}-br"

    def host(self, name: str) -> Host:
        for h in [*self.hosts, *([self.head] if self.head else [])]:
            if name in (h.name, h.addr):
                return h
        names = [h.name for h in self.hosts] + [HEAD]
        raise TestbedError(f"bed {self.name!r} has no host {name!r}. Received: host={name!r}. "
                           f"HINT: one of {names}.")

    def hosts_arg(self, slots: int | None = None, count: int | None = None) -> str:
        """``-H`` value for hororun: ``node1:S,node2:S,...``."""
        s = self.slots if slots is None else slots
        return ",".join(f"{h.name}:{s}" for h in self.hosts[:count])


def state_dir(name: str) -> Path:
    return Path(os.environ.get("HORO_TESTBED_DIR", "/run/horo-testbed")) / name


def unsupported_reason() -> str | None:
    """Why a bed cannot be made here (not root, a missing tool), or None when it can."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, e.g. in CI or a container)"
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        return f"missing tools {missing} (apt-get install iproute2 util-linux)"
    return None


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise TestbedError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}")
    return proc


def _rate_bytes(rate: str) -> float:
    m = _RATE_RE.match(rate)
    if not m:
        raise ValueError(f"--rate must be a tc rate like 1gbit, 10gbit or 500mbit. Received: rate={rate!r}. "
                         "HINT: --rate 1gbit")
    scale = {None: 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    return float(m.group(1)) * scale / 8


def _shape(netns: str, dev: str, rate: str | None, delay: str | None) -> None:
    """Rate-limit (tbf) and optionally delay (netem) what ``dev`` in ``netns`` sends."""
    parent = ["root"]
    if delay:
        proc = run("ip", "netns", "exec", netns, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:",
                    "netem", "delay", delay, check=False)
        if proc.returncode != 0:
            raise TestbedError(
                f"cannot add a delay: this kernel has no 'netem' qdisc (sch_netem), and tbf/htb cannot delay "
                f"packets. Received: --delay={delay!r}; tc said: {proc.stderr.strip()}. HINT: load sch_netem "
                "(modprobe sch_netem) on a kernel that has it, or leave out --delay."
            )
        parent = ["parent", "1:1"]
    if rate:
        # A 2 ms bucket: measured here to give 0.96 of the rate to one TCP stream; a much smaller one
        # throttles TCP bursts well below the rate.
        burst = max(int(_rate_bytes(rate) * 0.002), 32 * 1024)
        run("ip", "netns", "exec", netns, "tc", "qdisc", "add", "dev", dev, *parent, "handle", "10:", "tbf",
             "rate", rate, "burst", str(burst), "latency", "20ms")


def _holder_pid(launcher: int, own_pid_ns: bool, timeout: float = 10.0) -> int:
    """The holder's PID: ``unshare --fork``'s child when it makes a PID namespace, else itself."""
    if not own_pid_ns:
        return launcher
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            kids = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
        except OSError:
            kids = []
        if kids:
            return int(kids[0])
        time.sleep(0.02)
    raise TestbedError(f"the holder of PID {launcher} did not start within {timeout:g} s")


def _start_holder(bed: Bed, host: str, netns: str, own_pid_ns: bool, hosts_file: Path) -> int:
    ns = ["--uts", "--ipc", "--mount", "--propagation", "private"]
    if own_pid_ns:
        ns += ["--pid", "--fork", "--mount-proc"]
    log = open(os.path.join(bed.state, f"holder-{host}.log"), "w")  # noqa: SIM115 - the child keeps it
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen(["ip", "netns", "exec", netns, "unshare", *ns, sys.executable, "-m",
                             "horo.testbed._holder", host, str(hosts_file)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True,
                            start_new_session=True, env=env)
    log.close()
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "ready":
        proc.kill()
        err = Path(bed.state, f"holder-{host}.log").read_text()
        raise TestbedError(f"host {host}: its namespace holder failed: {line} {err.strip()}")
    return _holder_pid(proc.pid, own_pid_ns)


_AGENT = """#!/bin/sh
# ssh stand-in for the horo test bed {name!r} (written by `python -m horo.testbed up`).
# Called as ssh is by an MPI launcher: AGENT [ssh options] HOST COMMAND...; runs COMMAND as one shell line
# inside HOST's namespaces, with a clean environment as a fresh ssh login would have.
while [ $# -gt 0 ]; do
  case "$1" in
    -[bcDEeFIiJLlmOoPpQRSWw]) shift 2 ;;
    --) shift; break ;;
    -*) shift ;;
    *) break ;;
  esac
done
if [ $# -lt 1 ]; then echo "usage: $0 [ssh options] HOST COMMAND..." >&2; exit 255; fi
host=$1; shift
pidfile={state}/pids/$host
if [ ! -r "$pidfile" ]; then
  echo "horo testbed ssh: no host '$host' on bed {name!r}. HINT: one of: {names}" >&2; exit 255
fi
read pid tmp nsflags < "$pidfile"
exec nsenter -t "$pid" $nsflags -- env -i PATH={path} HOME=/root USER=root LOGNAME=root SHELL=/bin/sh \\
  TMPDIR="$tmp" /bin/sh -c "cd; $*"
"""


def up(hosts: int = 2, slots: int = 2, rate: str | None = None, delay: str | None = None, name: str = "horo",
       prefix: str = "node") -> Bed:
    """Create the bed (see the module docstring) and return it.

    Raises:
        ValueError: a bad argument (named, with a hint), before anything is made.
        TestbedError: the bed exists already, or the machine cannot make one; nothing is left behind.
    """
    if not isinstance(hosts, int) or not 1 <= hosts <= 64:
        raise ValueError(f"--hosts must be an integer in [1, 64]. Received: hosts={hosts!r}. HINT: --hosts 2")
    if not isinstance(slots, int) or slots < 1:
        raise ValueError(f"--slots must be a positive integer. Received: slots={slots!r}. HINT: --slots 2")
    for label, value in (("name", name), ("prefix", prefix)):
        if not _NAME_RE.match(value):
            raise ValueError(f"--{label} must be 1-8 lowercase letters/digits starting with a letter. "
                             f"Received: {label}={value!r}. HINT: --{label} horo")
    if rate is not None:
        _rate_bytes(rate)
    if delay is not None and not _DELAY_RE.match(delay):
        raise ValueError(f"--delay must be a tc time like 50us or 1ms. Received: delay={delay!r}. HINT: --delay 50us")
    reason = unsupported_reason()
    if reason:
        raise TestbedError(f"cannot build a test bed here: {reason}.")
    st = state_dir(name)
    existing = _our_netns(name)
    if st.exists() or existing:
        raise TestbedError(f"a bed named {name!r} is already up (state {st}, namespaces {existing}). "
                           f"HINT: python -m horo.testbed down --name {name}")
    bed = Bed(name=name, state=str(st), slots=slots, rate=rate)
    try:
        _build(bed, hosts, prefix, rate, delay)
    except BaseException:
        down(name)
        raise
    return bed


def _build(bed: Bed, count: int, prefix: str, rate: str | None, delay: str | None) -> None:
    st = Path(bed.state)
    (st / "pids").mkdir(parents=True)
    names = [f"{prefix}{k}" for k in range(1, count + 1)]
    octets = dict(zip(names, range(1, count + 1)))
    octets[HEAD] = _HEAD_OCTET
    hosts_file = st / "hosts"
    hosts_file.write_text("127.0.0.1 localhost\n::1 localhost ip6-localhost\n"
                          + "".join(f"{SUBNET}.{o} {n}\n" for n, o in octets.items()))
    br = bed.bridge_netns
    run("ip", "netns", "add", br)
    run("ip", "-n", br, "link", "add", "br0", "type", "bridge")
    run("ip", "-n", br, "link", "set", "br0", "up")
    for host, octet in octets.items():
        netns = f"{bed.name}-{host}"
        run("ip", "netns", "add", netns)
        run("ip", "-n", br, "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", netns)
        run("ip", "-n", br, "link", "set", host, "master", "br0", "up")
        run("ip", "-n", netns, "addr", "add", f"{SUBNET}.{octet}/24", "dev", "eth0")
        run("ip", "-n", netns, "link", "set", "eth0", "up")
        run("ip", "-n", netns, "link", "set", "lo", "up")
        node = host != HEAD
        if node and (rate or delay):
            _shape(netns, "eth0", rate, delay)  # what the host sends
            _shape(br, host, rate, delay)  # what it receives: a full-duplex port at the same rate
        tmp = st / "tmp" / host
        tmp.mkdir(parents=True)
        pid = _start_holder(bed, host, netns, node, hosts_file)
        h = Host(name=host, addr=f"{SUBNET}.{octet}", netns=netns, pid=pid, own_pid_ns=node)
        if node:
            bed.hosts.append(h)
        else:
            bed.head = h
        line = f"{pid} {tmp} {shell_flags(h)}\n"
        for key in (h.name, h.addr):
            (st / "pids" / key).write_text(line)
    agent = st / "ssh"
    agent.write_text(_AGENT.format(name=bed.name, state=st, path=_CLEAN_PATH, names=" ".join(names)))
    agent.chmod(0o755)
    (st / "bed.json").write_text(json.dumps(asdict(bed), indent=1))


def shell_flags(h: Host) -> str:
    return "-n -u -i -m -p" if h.own_pid_ns else "-n -u -i -m"


def load(name: str = "horo") -> Bed:
    """The bed named ``name`` that is up. Raises TestbedError when there is none."""
    path = state_dir(name) / "bed.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        raise TestbedError(f"no bed named {name!r} is up (no {path}). "
                           f"HINT: python -m horo.testbed up --name {name} --hosts 2") from None
    hosts = [Host(**h) for h in raw.pop("hosts")]
    head = raw.pop("head")
    return Bed(hosts=hosts, head=Host(**head) if head else None, **raw)


def _our_netns(name: str) -> list[str]:
    proc = run("ip", "netns", "list", check=False)
    found = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    return [n for n in found if n.startswith(f"{name}-")]


def down(name: str = "horo") -> list[str]:
    """Remove everything a bed named ``name`` made (processes, namespaces, state); safe to repeat.

    Returns:
        What was removed, for the log.
    """
    removed: list[str] = []
    for netns in _our_netns(name):
        # Every process in the namespace: holders (which takes their PID namespaces down) and anything
        # that entered it without a PID namespace of its own (the head's jobs).
        pids = run("ip", "netns", "pids", netns, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        removed += [f"pid {p}" for p in pids]
    for netns in _our_netns(name):
        deadline = time.monotonic() + 5
        while run("ip", "netns", "pids", netns, check=False).stdout.split() and time.monotonic() < deadline:
            time.sleep(0.05)
        run("ip", "netns", "del", netns, check=False)
        removed.append(f"netns {netns}")
    st = state_dir(name)
    if st.exists():
        shutil.rmtree(st, ignore_errors=True)
        removed.append(f"state {st}")
    return removed
