"""Run mpiexec as a child and make sure the job, and every process it started, ends with it."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from horo.run.output import Output
from horo.run.reach import Probe

__all__ = ["JobWatch", "descendants", "first_rank_exit", "kill_leftovers", "remove_stale_session_dirs", "run_job"]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _prctl() -> Callable[..., int] | None:
    """libc's prctl on Linux, else None (the extra safety nets are then skipped)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _children_map() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc (empty where /proc does not exist)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return children
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue  # exited meanwhile
        # The command name (field 2) may hold spaces and parentheses; the fields after the last ')' do not.
        fields = stat[stat.rfind(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def descendants(root: int, skip: frozenset[int] = frozenset()) -> list[int]:
    """All live descendants of ``root`` (children first), by walking /proc, leaving out ``skip`` subtrees."""
    children = _children_map()
    found: list[int] = []
    queue = [pid for pid in children.get(root, []) if pid not in skip]
    while queue:
        pid = queue.pop(0)
        found.append(pid)
        queue.extend(children.get(pid, []))
    return found


def _reap(pids: list[int]) -> None:
    """Collect exit statuses of any of ``pids`` that are our (adopted) children, so none stays a zombie."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except (ChildProcessError, OSError):
            pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return False


def remove_stale_session_dirs(tmp: str | None = None) -> list[str]:
    """Remove this user's Open MPI session directories (``$TMPDIR/ompi.<launcher pid>``) whose launcher is gone.

    A launcher that is killed leaves its directory, with its PMIx socket files, behind. Once PIDs wrap
    (``pid_max`` can be 32768), a new launcher given the same PID cannot start its PMIx server there:
    "The PMIx server's listener thread failed to start", exit status 213 (reproduced here).

    Returns:
        The directories removed.
    """
    removed: list[str] = []
    uid = os.getuid()
    for d in Path(tmp or tempfile.gettempdir()).glob("ompi.*"):
        pid = d.name[len("ompi."):]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        try:
            st = d.lstat()
        except OSError:
            continue
        if st.st_uid == uid and d.is_dir() and not d.is_symlink():
            shutil.rmtree(d, ignore_errors=True)
            removed.append(str(d))
    return removed


def kill_leftovers(skip: frozenset[int] = frozenset(), grace: float = 1.0) -> list[int]:
    """SIGTERM, then SIGKILL, every remaining descendant of this process; returns the pids it found.

    Hydra puts each rank in a session of its own, so killing mpiexec's process group would miss them.
    Instead this process is made a child subreaper at launch: ranks orphaned by a dead mpiexec or proxy
    are re-parented here and still show up as descendants. ``skip``: children (and their subtrees) that
    existed before the job and are none of its business.
    """
    pids = descendants(os.getpid(), skip)
    if not pids:
        return pids
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(pids)
            if not any(_alive(p) for p in pids):
                return pids
            time.sleep(0.05)
    _reap(pids)
    return pids


# What Open MPI (prterun) and hydra print when a job is failing. Open MPI's exit status is not enough: when
# a host dies with its daemon, prterun prints "A daemon failed to report back ... Remote host: X" and
# exits 0; and when a host's link is silently cut it never finishes tearing the job down (it waits on TCP).
_FAILURE = re.compile(
    rb"exited with non-zero status|MPI_ABORT was invoked|lost communication with a remote daemon|"
    rb"daemon failed to report back|killed by signal|terminated by signal|BAD TERMINATION|"
    rb"exited on signal|has exited due to process"
)
_HOST = re.compile(rb"(?:Remote host:\s*|on node\s+|on host\s+)([A-Za-z0-9_.\-]+)")
# Open MPI 5 (PRRTE) when a host's daemon is gone, as measured on the test bed: "PRTE has lost communication
# with a remote daemon" ... "Remote daemon: [prterun-...@0,2] on node node3", or "A daemon failed to report
# back after being spawned" ... "Remote host: node3" (also for a daemon that died mid-job).
_DAEMON_LOST = re.compile(rb"lost communication with a remote daemon|daemon failed to report back")
# A rank aborting the whole job: the job is to end, in elastic mode too (prterun was seen to stay, after an
# abort by a worker that had been spawned into the world).
_ABORT = re.compile(rb"MPI_ABORT was invoked")
_DAEMON_HOST = re.compile(rb"(?:Remote daemon:.*?on node\s+|Remote host:\s*)([A-Za-z0-9_.\-]+)")
# horo's stall watchdog (core/base/watchdog.py), printed by a rank before it exits. It counts as a failure by
# itself: when the launcher's own host runs ranks, prterun reports nothing of their exit while a remote
# daemon is cut off (measured on horo.testbed), so its lines alone would never end the job.
_STALL = re.compile(rb"horo: error: rank \d+ on host ([A-Za-z0-9_.\-]+) has been blocked in ")
# horo's heartbeats (core/transport/heartbeat.py): a rank names the peer that fell silent, and its host.
_SILENT_TEARDOWN_S = 2.0  # for the ranks still reachable to print what they saw
_HEARTBEAT = re.compile(rb"horo: error: rank \d+ on host ([A-Za-z0-9_.\-]+): rank \d+ on host ([A-Za-z0-9_.\-]+) "
                        rb"has sent no heartbeat")


class JobWatch:
    """Reads one of mpiexec's streams, passes it on line by line, and notes when the job is failing: the
    launcher reports a failure, or a rank reports that horo's watchdog found it stalled.

    ``proc_failures``: whether a process that failed or ended early counts (not in elastic mode: under
    ULFM the job survives it, and workers that leave end without ``MPI_Finalize`` on purpose, which
    prterun reports as improper; only a lost daemon, an ``MPI_Abort`` or a stall ends such a job).
    """

    def __init__(self, sink: Callable[[bytes], None], proc_failures: bool = True) -> None:
        self.sink = sink
        self.proc_failures = proc_failures
        self.failed_at: float | None = None
        self.hosts: list[str] = []
        self.daemon_lost = False
        self._daemon_hosts: list[str] = []
        self.stalled: list[str] = []  # hosts whose ranks reported a stall
        self.unheard: list[str] = []  # hosts a rank's heartbeats found silent

    def feed(self, line: bytes) -> None:
        self.sink(line)
        stall = _STALL.search(line)
        if stall:
            host = stall.group(1).decode(errors="replace").rstrip(".")
            if host not in self.stalled:
                self.stalled.append(host)
        beat = _HEARTBEAT.search(line)
        if beat:
            host = beat.group(2).decode(errors="replace").rstrip(".")
            if host not in self.unheard:
                self.unheard.append(host)
            stall = beat  # the reporter's own host is alive, and the job is failing
        failed = _FAILURE.search(line) and (self.proc_failures or _DAEMON_LOST.search(line) or _ABORT.search(line))
        if (stall or failed) and self.failed_at is None:
            self.failed_at = time.monotonic()
        if stall:
            return  # the host it names is the reporter's, not the failed one
        for m in _HOST.finditer(line):
            host = m.group(1).decode(errors="replace").rstrip(".")
            if host not in self.hosts:
                self.hosts.append(host)
        if _DAEMON_LOST.search(line):
            self.daemon_lost = True
        for m in _DAEMON_HOST.finditer(line):
            host = m.group(1).decode(errors="replace").rstrip(".")
            if host not in self._daemon_hosts:
                self._daemon_hosts.append(host)

    @property
    def lost(self) -> list[str]:
        """Hosts whose launcher daemon the job lost (named in the launcher's report of that), and hosts whose
        ranks fell silent (named by the heartbeats of the others)."""
        return [*(self._daemon_hosts if self.daemon_lost else []),
                *(h for h in self.unheard if not self.daemon_lost or h not in self._daemon_hosts)]

    def silent(self, hosts: list[str]) -> list[str]:
        """Of the job's ``hosts``, those none of whose ranks reported a stall, once some rank did: when a link
        is cut, every rank stalls, but only the reachable hosts' reports arrive."""
        if not self.stalled:
            return []
        return [h for h in hosts if h not in self.stalled]

    def merge(self, other: JobWatch) -> None:
        """Take in what ``other`` (the stdout watch) saw."""
        if other.failed_at is not None and (self.failed_at is None or other.failed_at < self.failed_at):
            self.failed_at = other.failed_at
        self.hosts += [h for h in other.hosts if h not in self.hosts]
        self.daemon_lost = self.daemon_lost or other.daemon_lost
        self._daemon_hosts += [h for h in other._daemon_hosts if h not in self._daemon_hosts]  # noqa: SLF001
        self.stalled += [h for h in other.stalled if h not in self.stalled]
        self.unheard += [h for h in other.unheard if h not in self.unheard]

    def pump(self, stream: Any) -> None:
        for line in iter(stream.readline, b""):
            self.feed(line)


def run_job(cmd: list[str], env: dict[str, str], grace: float = 5.0, teardown: float = 10.0,
            lost_hosts: list[str] | None = None, hosts: list[str] | None = None,
            notes: dict[str, Any] | None = None, ended: Callable[[], float | None] | None = None,
            output: Output | None = None, check: Callable[[], str | None] | None = None) -> int:
    """Run ``cmd`` (an mpiexec line) to completion and return its exit status.

    mpiexec gets a session of its own, so a terminal's Ctrl-C reaches only hororun, which forwards
    SIGINT/SIGTERM/SIGHUP to mpiexec once (hydra passes it on to every rank); if mpiexec has not ended
    ``grace`` seconds later, or a second signal comes, it is killed. Whatever is left afterwards is killed
    too. A death by signal is reported as 128 + signal number, as shells do.

    mpiexec's output goes through a :class:`JobWatch`: once the launcher reports a failed rank or a lost
    host, or a rank reports that horo's watchdog found it stalled, mpiexec gets ``teardown`` seconds to end
    the job, then is killed (a host cut off from the network never answers its kill order), and a failure is
    never reported as status 0.

    Children this process already had (when ``main`` is called from a bigger program) are left alone.
    ``hosts``: the job's hosts; after a stall, those none of whose ranks reported it are named as the likely
    cause, narrowed to those that do not answer on the network when some do not (``reach.Probe``).
    ``lost_hosts``, when given (elastic mode, which restarts the job without them), receives the hosts
    whose launcher daemon the job lost or, after a stall, those silent hosts; only those end the job then
    (``JobWatch``'s ``proc_failures``), and failures are left to the caller to report. ``notes``, when
    given, receives the hosts whose ranks reported a stall (``stalled``) and the silent ones (``silent``).
    ``ended``, when given, returns when every rank said it was ending (else None): mpiexec then gets
    ``teardown`` seconds to finish before it is ended. ``output`` routes the job's lines (default: to this
    process's stdout and stderr). ``check``, polled while the job runs, returns why the job must end (then
    printed, and the job is stopped as on a signal, with status 1), else None.
    """
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    def in_child() -> None:
        # If hororun itself is killed with SIGKILL, mpiexec still gets SIGTERM and tears the job down.
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)

    remove_stale_session_dirs(env.get("TMPDIR"))
    before = frozenset(descendants(os.getpid()))
    # preexec_fn only calls prctl, which takes no locks; the usual threads caveat does not bite here.
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=in_child,  # noqa: PLW1509
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    output = output or Output()
    to_stderr = output.stderr
    watch = JobWatch(to_stderr, proc_failures=lost_hosts is None)
    out_watch = JobWatch(output.stdout, proc_failures=lost_hosts is None)
    readers = [threading.Thread(target=w.pump, args=(stream,), name=f"hororun-{label}", daemon=True)
               for w, stream, label in ((watch, proc.stderr, "stderr"), (out_watch, proc.stdout, "stdout"))]
    for reader in readers:
        reader.start()
    received: list[int] = []
    killed_stuck = stopped = False
    probe = None

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        try:
            proc.send_signal(signum if len(received) == 1 else signal.SIGKILL)
        except OSError:
            pass

    on_main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED} if on_main else {}
    try:
        deadline: float | None = None
        rc = 1
        while True:
            try:
                rc = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            why = check() if check is not None and not received else None
            if why is not None:
                to_stderr(f"hororun: error: {why}\n".encode())
                forward(int(signal.SIGTERM), None)
                stopped = True
            if received and deadline is None:
                deadline = time.monotonic() + grace
            if deadline is not None and time.monotonic() > deadline:
                proc.kill()
            watch.merge(out_watch)
            if probe is None and hosts and watch.stalled:  # during the teardown wait
                probe = Probe(hosts)
            # A host the heartbeats found silent never answers prterun either: its end need not be waited for.
            if watch.failed_at is not None and time.monotonic() > watch.failed_at + (
                    min(teardown, _SILENT_TEARDOWN_S) if watch.unheard else teardown):
                killed_stuck = True
                proc.kill()
            end = ended() if ended is not None else None
            if end is not None and time.monotonic() > end + teardown:
                proc.kill()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_leftovers(before)
        for reader in readers:
            reader.join(timeout=2.0)
        watch.merge(out_watch)
    silent = watch.silent(hosts or [])
    cut = [h for h in silent if h in (probe.silent() if probe is not None else [])]
    if cut:
        silent = cut  # a host that reported nothing may just have been killed before its line got out
    if notes is not None:
        notes.update(stalled=list(watch.stalled), silent=silent)
    if lost_hosts is not None:
        lost_hosts.extend(h for h in [*watch.lost, *silent] if h not in lost_hosts)
    rc = rc if rc >= 0 else 128 - rc
    if stopped:
        return 1
    if watch.failed_at is None or not (rc == 0 or killed_stuck or watch.stalled or watch.unheard):
        return rc
    if lost_hosts is not None:  # the elastic caller restarts without the lost hosts, or says why not
        return 1 if rc in (0, 137) and (watch.lost or silent or killed_stuck) else rc
    why = (f"mpiexec had not ended the job {teardown:g} s after the first failure was reported, so hororun "
           "killed it" if killed_stuck else "mpiexec exited 0 although it reported a failure" if rc == 0 else
           f"mpiexec exited with status {rc}")
    if watch.unheard:
        to_stderr(f"hororun: error: the job failed: {', '.join(watch.unheard)} fell silent (no heartbeat for "
                   f"HORO_HEARTBEAT_TIMEOUT_SECONDS): that host, or the network to it, is the likely cause. {why}. "
                   "HINT: a frozen host or a cut network link looks like this; see the ranks' messages above.\n"
                   .encode())
    elif watch.stalled:
        cause = (f"{', '.join(cut)} did not answer a TCP connection attempt from this host and none of its ranks "
                 "reported: that host, or the network to it, is the likely cause" if cut else
                 f"no rank on {', '.join(silent)} reported: that host, or the network to it, is the likely cause"
                 if silent else "every host's ranks reported it")
        to_stderr(f"hororun: error: the job failed: ranks on {', '.join(watch.stalled)} stalled in a collective "
                   f"past HORO_STALL_SHUTDOWN_TIME_SECONDS; {cause}. {why}. HINT: a cut network link or a hung "
                   "host looks like this; see the ranks' messages above.\n".encode())
    else:
        named = f" (hosts in mpiexec's messages: {', '.join(watch.hosts)})" if watch.hosts else ""
        to_stderr(f"hororun: error: the job failed{named}: {why}. HINT: a lost host or a cut network link "
                   "looks like this; see the messages above.\n".encode())
    return rc if rc not in (0, -9, 137) else 1


def first_rank_exit(folder: str, rc: int) -> int:
    """The exit code of the rank that failed first (reported by the rank hook), else mpiexec's ``rc``."""
    if rc == 0:
        return 0
    reports = []
    for path in Path(folder).glob("exit.*"):
        try:
            when, code = path.read_text().split()
            reports.append((float(when), int(code)))
        except (OSError, ValueError):
            continue
    return min(reports)[1] if reports else rc
