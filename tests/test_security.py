"""horo's control plane against an attacker on the same host (docs/design-join.md, "Threat model").

The attacker can read ``ps``, connect to any port on loopback and send anything; it holds no key of the job.
Everything here is real: the framing and the listener on real sockets, real heartbeat processes, and real
torchrun and hororun jobs that are flooded, scanned and offered a shell command while they start.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import security_helpers as attack

from horo.core.transport import adopt, daemon, joinkey, signed
from horo.core.transport.listener import Listener
from horo.run.elastic_driver import ElasticDriver
from horo.run.elastic_proto import request
from horo.run.mpiexec import HYDRA, OPENMPI, LaunchPlan, build_command

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20
KEY = os.urandom(32)


def _pair(service: str = "test") -> tuple[signed.Conn, signed.Conn, socket.socket, socket.socket]:
    """(client, server) connections over a fresh socket pair, after the handshake; and the raw sockets."""
    a, b = socket.socketpair()
    got: list[signed.Conn] = []
    t = threading.Thread(target=lambda: got.append(signed.accept(b, KEY, service)))
    t.start()
    client = signed.client(a, KEY, service)
    t.join()
    return client, got[0], a, b


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(pid: int) -> list[tuple[str, int]]:
    """The TCP addresses process ``pid`` listens on."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=False).stdout
    found = []
    for line in out.splitlines():
        if f"pid={pid}," in line:
            local = line.split()[3]
            host, port = local.rsplit(":", 1)
            found.append((host.strip("[]"), int(port)))
    return found


# ------------------------------------------------------------------------------------------- the framing
def test_a_frame_replayed_reordered_or_reflected_within_a_connection_is_refused() -> None:
    client, server, a, b = _pair()
    with a, b:
        frame = client._frame({"op": "poll"}, 0)  # noqa: SLF001 - the exact bytes the client sends next
        client.send({"op": "poll"})
        assert server.recv(wait=5) == {"op": "poll"}
        a.sendall(frame)  # the same bytes again
        with pytest.raises(signed.Refused, match="replayed or reordered"):
            server.recv(wait=5)
    client, server, a, b = _pair()
    with a, b:
        client.send({"op": "poll"})
        server.recv(wait=5)
        answer = server._frame({"free": 1}, 1)  # noqa: SLF001 - the server's answer, sent back to the server
        a.sendall(answer)
        with pytest.raises(signed.Refused, match="reflected"):
            server.recv(wait=5)


def test_an_answer_to_another_request_is_refused() -> None:
    client, server, a, b = _pair()
    with a, b:
        client.send({"op": "first"})
        assert server.recv(wait=5) == {"op": "first"}
        threading.Timer(0.2, lambda: (server.recv(wait=5), server.send({"for": "first"}, answers=1))).start()
        with pytest.raises(signed.Refused, match="an answer to another request"):
            client.request({"op": "second"}, timeout=5)


def test_a_frame_of_another_service_or_connection_does_not_verify() -> None:
    a, b = socket.socketpair()
    with a, b:
        t = threading.Thread(target=lambda: pytest.raises(OSError, signed.accept, b, KEY, "elastic", 5.0))
        t.start()
        with pytest.raises(signed.Refused, match="does not hold this job's key"):
            signed.client(a, KEY, "join-server", 5.0)  # the right key, bound to another service
        a.close()
        t.join()


def test_a_recorded_request_replayed_on_a_new_connection_is_refused_and_logged(caplog) -> None:
    """A worker's poll to hororun's elastic driver, recorded on the path and resent byte for byte on a new
    connection, gets no answer: the driver's fresh nonce makes the recorded proof and frames worthless."""
    drv = ElasticDriver(lambda: {"localhost": 2}, 1, 2)
    recorded = bytearray()
    proxy = socket.create_server(("127.0.0.1", 0))

    def relay() -> None:
        inside, _ = proxy.accept()
        outside = socket.create_connection(("127.0.0.1", drv.listener.port))
        ends = {inside: outside, outside: inside}
        while ends:
            import select

            for s in select.select(list(ends), [], [], 5)[0]:
                data = s.recv(65536)
                if s is inside:
                    recorded.extend(data)
                if not data:
                    ends.pop(s, None)
                    continue
                ends[s].sendall(data)
        inside.close()
        outside.close()

    t = threading.Thread(target=relay, daemon=True)
    t.start()
    try:
        reply = request(f"127.0.0.1:{proxy.getsockname()[1]}", drv.key, {"op": "poll", "real": "recorded-poll"})
        assert reply["max_np"] == 2 and "recorded-poll" in drv.last_seen
        t.join(10)
        del drv.last_seen["recorded-poll"]
        caplog.set_level(logging.WARNING, logger="horo.security")
        with socket.create_connection(("127.0.0.1", drv.listener.port), timeout=5) as s:
            s.sendall(bytes(recorded))
            got = b""
            try:
                while chunk := s.recv(4096):
                    got += chunk
            except ConnectionResetError:
                pass  # closed with the rest of the recording unread
        assert len(got) <= 52, got  # at most the server's hello (a fresh nonce), then the connection closed: no answer
        assert "recorded-poll" not in drv.last_seen  # the replayed request never reached the driver
        lines = [r.getMessage() for r in caplog.records if r.name == "horo.security"]
        assert "horo: refused a connection from 127.0.0.1 to elastic: a peer without this job's key" in lines, lines
    finally:
        proxy.close()
        drv.stop()


# ------------------------------------------------------------------------------------------ the listener
def test_a_listener_refuses_junk_and_idle_floods_cheaply_and_logs_once(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="horo.security")
    served: list[object] = []

    def serve(conn: signed.Conn) -> None:
        served.append(conn.recv(wait=5))
        conn.reply({"ok": True})

    lst = Listener("127.0.0.1", 0, KEY, "flood-test", serve, handshake_s=3.0)
    try:
        before = attack.cost(os.getpid())
        held = attack.idle(lst.address, 40)  # more than the listener keeps: the oldest are let go
        flood = attack.junk(lst.address, 300)
        after = attack.cost(os.getpid())
        print(f"flood cost (rss bytes, threads): {before} -> {after}")  # shown with -rP
        conn = signed.connect(lst.address, KEY, "flood-test", timeout=10)
        assert conn.request({"op": "after the flood"}, timeout=10) == {"ok": True}
        assert served == [{"op": "after the flood"}]
        assert after[0] - before[0] < 64 * MiB and after[1] - before[1] < 64, (before, after)
        attack.close(flood + held)
        lines = [r.getMessage() for r in caplog.records if r.name == "horo.security"]
        junk_lines = [ln for ln in lines if ln.endswith("to flood-test: not horo's handshake")]
        assert junk_lines == ["horo: refused a connection from 127.0.0.1 to flood-test: not horo's handshake"], lines
        assert any("no handshake while 32 other connections waited" in ln for ln in lines), lines
    finally:
        lst.close()


def test_the_spark_driver_server_takes_its_tasks_through_a_flood() -> None:
    pytest.importorskip("pyspark")
    from horo.spark.wire import Server, connect

    got: list[dict] = []
    srv = Server(KEY, lambda channel, msg, blob: (got.append(msg), channel.send({"op": "ack"})))
    try:
        before = attack.cost(os.getpid())
        held = attack.idle(("127.0.0.1", srv.port), 12)
        flood = attack.junk(("127.0.0.1", srv.port), 300)
        after = attack.cost(os.getpid())
        print(f"flood cost (rss bytes, threads): {before} -> {after}")  # shown with -rP
        channel = connect(f"127.0.0.1:{srv.port}", KEY, timeout=10)
        channel.send({"op": "hello", "index": 0})
        assert channel.recv(wait=10)[0] == {"op": "ack"} and got == [{"op": "hello", "index": 0}]
        assert after[0] - before[0] < 64 * MiB and after[1] - before[1] < 64, (before, after)
        attack.close(flood + held)
        assert srv.listener.address[0] == "127.0.0.1"
    finally:
        srv.close()


def test_the_heartbeat_setup_takes_its_ranks_through_a_flood(tmp_path: Path) -> None:
    program = REPO / "src" / "horo" / "core" / "transport" / "heartbeat_proc.py"
    me, host = os.getpid(), socket.gethostname()
    cfg = {"size": 2, "timeout": 6.0, "hosts": [host, host], "pids": [me, me], "elastic": False, "status_dir": None,
           "secret": os.urandom(32).hex()}
    procs = [subprocess.Popen([sys.executable, "-I", "-S", str(program)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        procs[0].stdin.write(json.dumps({**cfg, "me": 0, "offers": ["127.0.0.1"]}) + "\n")
        procs[0].stdin.flush()
        addrs = json.loads(procs[0].stdout.readline())["listening"]
        address = tuple(addrs[0])
        before = attack.cost(procs[0].pid)
        held = attack.idle(address, 12)
        flood = attack.junk(address, 300)
        after = attack.cost(procs[0].pid)
        print(f"flood cost (rss bytes, threads): {before} -> {after}")  # shown with -rP
        procs[1].stdin.write(json.dumps({**cfg, "me": 1}) + "\n" + json.dumps({"addrs": addrs}) + "\n")
        procs[1].stdin.flush()
        assert json.loads(procs[1].stdout.readline()) == {"ok": True}
        assert json.loads(procs[0].stdout.readline()) == {"ok": True, "missing": []}
        assert after[0] - before[0] < 64 * MiB and after[1] - before[1] < 64, (before, after)
        attack.close(flood + held)
    finally:
        errs = [p.communicate(timeout=20)[1] for p in procs]  # their stdin closes: the heartbeats end
    assert errs[0].count("to heartbeat: not horo's handshake") == 1, errs[0]
    assert "refused a connection from 127.0.0.1 to heartbeat: not horo's handshake" in errs[0]


# --------------------------------------------------------------------- keys and the daemon's command line
def test_no_shell_runs_on_a_remote_start_request() -> None:
    for command in ("touch MARKER; : prted", "prted $(touch MARKER)",
                    "/usr/bin/env sh -c 'touch MARKER' prted"):
        with pytest.raises(ValueError, match="not Open MPI's daemon command"):
            daemon.parameters(command)
    for args, named in ((["--prtemca", "prte_fork_agent", "/bin/sh"], "prte_fork_agent"),
                        (["--prtemca", "ess_base_vpid", "1;touch"], "not of the form"),
                        (["--exec", "/bin/sh"], "an option horo does not pass"),
                        (["--prtemca", "prte_hnp_uri", "a@0.0;tcp://10.9.9.9:4000:24"], "other than the one")):
        with pytest.raises(ValueError, match=named):
            daemon.argv(args, "127.0.0.1", "agent")
    argv = daemon.argv(["--prtemca", "plm_ssh_agent", "./evil", "--prtemca", "prte_hnp_uri",
                        "prterun-x-1@0.0;tcp://10.0.0.1,127.0.0.1:4000:24,8"], "127.0.0.1", "horo-agent")
    assert argv[0] == daemon.prted() and argv[1:4] == ["--prtemca", "plm_ssh_agent", "horo-agent"]


def test_a_key_is_never_made_of_what_the_launcher_shows(tmp_path: Path, monkeypatch) -> None:
    torchrun = {"WORLD_SIZE": "4", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "10.1.2.3",
                "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none"}
    d = adopt.described(torchrun)
    assert d is not None and d.secret is None
    for name, value in torchrun.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(adopt.JoinError, match="HORO_JOIN_SECRET is not set") as err:
        adopt._key(d, time.monotonic() + 1)  # noqa: SLF001 - across hosts, no secret: no world
    assert "export HORO_JOIN_SECRET=" in str(err.value) and "never on a command line" in str(err.value)
    with pytest.raises(ValueError, match="at least 32 characters"):
        joinkey.from_environment({"HORO_JOIN_SECRET": "s3cret"})
    assert joinkey.one_host({"LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"}, "10.1.2.3")
    assert not joinkey.one_host({"LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "4"}, "10.1.2.3")


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory of another user needs root")
def test_a_key_directory_or_file_another_user_could_write_is_not_trusted(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    squatted = tmp_path / f"horo-{os.getuid()}"
    squatted.mkdir(mode=0o700)
    os.chown(squatted, 65534, 65534)  # made by another user before the job
    with pytest.raises(joinkey.NoKey, match="not a directory only this user can enter"):
        joinkey.local_file({"MASTER_PORT": "1"}, 1)
    os.chown(squatted, os.getuid(), os.getgid())
    squatted.chmod(0o777)
    with pytest.raises(joinkey.NoKey, match="mode 777"):
        joinkey.local_file({"MASTER_PORT": "1"}, 1)
    squatted.chmod(0o700)
    path = joinkey.local_file({"MASTER_PORT": "1"}, 1)
    key = joinkey.write_local(path)
    assert (path.stat().st_mode & 0o777) == 0o600 and joinkey.read_local(path, time.monotonic() + 1) == key
    path.chmod(0o644)
    with pytest.raises(joinkey.NoKey, match="not a file only this user can read"):
        joinkey.read_local(path, time.monotonic() + 1)
    joinkey.retire()
    assert not path.exists()


def test_a_secret_reaches_mpiexec_by_name_only() -> None:
    genv = {"HORO_TIMELINE": "/t.json", "HORO_JOIN_SECRET": "k" * 64, "HORO_ELASTIC_SECRET": "e" * 64}
    plan = LaunchPlan(mpiexec="/x/mpiexec", np=2, command=["python", "t.py"], flavor=OPENMPI, genv=genv, as_root=False)
    cmd = build_command(plan)
    assert "k" * 64 not in " ".join(cmd) and "e" * 64 not in " ".join(cmd)
    exported = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "-x"]
    assert exported[-3:] == ["HORO_TIMELINE=/t.json", "HORO_JOIN_SECRET", "HORO_ELASTIC_SECRET"]
    assert cmd[-2:] == ["python", "t.py"]
    plan.flavor = HYDRA
    cmd = build_command(plan)
    assert "k" * 64 not in " ".join(cmd)
    assert cmd[-6:] == ["-genv", "HORO_TIMELINE", "/t.json", "-genvlist", "HORO_JOIN_SECRET,HORO_ELASTIC_SECRET",
                        "python", "t.py"][-6:]


def _old_frame(key: bytes, obj: dict) -> bytes:
    """A message in a signed framing without freshness (length, HMAC of the body, the body)."""
    body = json.dumps(obj).encode()
    return struct.pack("!I", len(body)) + hmac.new(key, body, hashlib.sha256).digest() + body


# -------------------------------------------------------------------------------------------- real jobs
JOIN_APP = """
import json, os, sys, time
import numpy as np
if os.environ["RANK"] != "0":
    time.sleep(float(os.environ["RANK_DELAY"]))  # rank 0's rendezvous and server listen meanwhile
import horo
horo.init()
out = horo.allreduce(np.full(2, horo.rank() + 1.0), op=horo.Sum, name="x")
with open(os.path.join(sys.argv[1], f"rank{horo.rank()}.json"), "w") as f:
    json.dump({"rank": horo.rank(), "size": horo.size(), "out": out.tolist()}, f)
"""


@pytest.mark.timeout(200)
def test_a_torchrun_job_forms_while_a_stranger_floods_it_and_asks_for_a_shell(tmp_path: Path) -> None:
    """torchrun with a static rendezvous (its run id is ``none``: every part of the old derived key shows in
    ps). While rank 0 waits for rank 1: 12 idle and 300 junk connections to the rendezvous, and to rank 0's own
    server the command-injection attempt (an "exec" of a shell command, signed with the derived key, in the
    old framing and in the handshake). The job forms and computes; no command ran; no key on a command line."""
    pytest.importorskip("torch")
    (tmp_path / "app.py").write_text(JOIN_APP)
    out = tmp_path / "out"
    out.mkdir()
    marker = tmp_path / "MARKER"
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "HORO_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", RANK_DELAY="8",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH", "")) if p))
    scan = attack.PsScan()
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                             "--master_addr=127.0.0.1", f"--master_port={port}", str(tmp_path / "app.py"), str(out)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)
    derived = f"none|127.0.0.1|{port}|2".encode()
    held: list[socket.socket] = []
    try:
        deadline, rank0, servers = time.monotonic() + 60, None, []
        while time.monotonic() < deadline and not servers:
            for pid in attack._tree(proc.pid)[0] - {proc.pid}:  # noqa: SLF001
                addrs = _listening(pid)
                if ("127.0.0.1", port + 1) in addrs and len(addrs) >= 2:
                    rank0, servers = pid, [a for a in addrs if a[1] != port + 1]
            time.sleep(0.1)
        assert rank0 is not None, "rank 0 never listened"
        before = attack.cost(rank0)
        held = attack.idle(("127.0.0.1", port + 1), 12)
        flood = attack.junk(("127.0.0.1", port + 1), 300)
        after = attack.cost(rank0)
        print(f"flood cost (rss bytes, threads): {before} -> {after}")  # shown with -rP
        attack.close(flood)
        shell = {"kind": "exec", "command": f"touch {marker}; : prted"}
        for address in servers:
            with socket.create_connection(address, timeout=5) as s:
                s.sendall(_old_frame(derived, shell))
                s.settimeout(5)
                with contextlib.suppress(ConnectionResetError):  # closed with the request unread
                    assert s.recv(4096) == b""  # closed, unanswered
            with pytest.raises(signed.Refused, match="does not hold this job's key"):
                signed.connect(address, derived, adopt.SERVER, timeout=5)
        text, _ = proc.communicate(timeout=120)
    finally:
        attack.close(held)
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.communicate()
    keys = scan.check(expect=("HORO_JOIN_SECRET",))
    assert proc.returncode == 0, text[-6000:]
    records = sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda r: r["rank"])
    assert [(r["rank"], r["size"], r["out"]) for r in records] == [(0, 2, [3.0, 3.0]), (1, 2, [3.0, 3.0])], text
    assert not marker.exists(), "a command ran on a stranger's request"
    assert all(derived.decode() not in k for k in keys)
    assert after[0] - before[0] < 64 * MiB and after[1] - before[1] < 64, (before, after)
    assert text.count("to join-rendezvous: not horo's handshake") == 1, text[-6000:]
    assert "refused a connection from 127.0.0.1 to join-server: not horo's handshake" in text, text[-6000:]


@pytest.mark.timeout(200)
def test_an_elastic_job_finishes_while_its_driver_is_flooded(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "HORO_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO / "src"), ELASTIC_OUT=str(tmp_path),
               STEPS="30", STEP_SLEEP="0.2")
    scan = attack.PsScan()
    proc = subprocess.Popen([sys.executable, "-m", "horo.run", "-np", "2", "--min-np", "1", "--max-np", "2",
                             sys.executable, str(REPO / "tests" / "elastic_apps" / "numpy_train.py")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    held: list[socket.socket] = []
    try:
        deadline, driver = time.monotonic() + 30, []
        while time.monotonic() < deadline and not driver:
            driver = _listening(proc.pid)
            time.sleep(0.1)
        assert driver == [("127.0.0.1", driver[0][1])], driver  # loopback: the job is on this host
        before = attack.cost(proc.pid)
        held = attack.idle(driver[0], 12)
        flood = attack.junk(driver[0], 300)
        after = attack.cost(proc.pid)
        print(f"flood cost (rss bytes, threads): {before} -> {after}")  # shown with -rP
        attack.close(flood)
        text, _ = proc.communicate(timeout=150)
    finally:
        attack.close(held)
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.communicate()
    scan.check(expect=("HORO_ELASTIC_SECRET",))
    assert proc.returncode == 0, text[-6000:]
    results = [json.loads(p.read_text()) for p in tmp_path.glob("result.*.json")]
    assert sorted(r["rank"] for r in results) == [0, 1] and {r["total"] for r in results} == {60}, text[-4000:]
    assert after[0] - before[0] < 64 * MiB and after[1] - before[1] < 64, (before, after)
    assert text.count("to elastic: not horo's handshake") == 1, text[-6000:]


STATIC_APP = """
import os, time
import horo
horo.init()
print(f"rank {horo.rank()} sees {os.environ.get('HORO_TEST_SECRET') == os.environ['EXPECTED']}", flush=True)
time.sleep(4)
horo.shutdown()
"""


@pytest.mark.timeout(120)
def test_a_hororun_job_passes_no_secret_on_a_command_line_and_its_ranks_listen_on_nothing(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(STATIC_APP)
    secret = os.urandom(32).hex()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "HORO_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"), HORO_TEST_SECRET=secret, EXPECTED=secret)
    scan = attack.PsScan(names=("HORO_TEST_SECRET",))
    proc = subprocess.Popen([sys.executable, "-m", "horo.run", "-np", "2", sys.executable, str(tmp_path / "app.py")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    listening: dict[int, list] = {}
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        for pid in attack._tree(proc.pid)[0]:  # noqa: SLF001
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[0] == sys.executable.encode() and argv[1:2] == [str(tmp_path / "app.py").encode()]:
                listening.setdefault(pid, []).extend(_listening(pid))
        time.sleep(0.3)
    text, _ = proc.communicate(timeout=60)
    scan.check(expect=("HORO_TEST_SECRET",))
    assert proc.returncode == 0 and text.count(" sees True") == 2, text[-4000:]
    assert len(listening) == 2 and not any(listening.values()), listening  # no MPI transport on every address


def test_servers_bind_the_interface_facing_their_peers() -> None:
    from horo.core.transport import netif
    from horo.run.elastic_driver import bind_address

    assert bind_address({"localhost": 2, "127.0.0.1": 1}) == "127.0.0.1"  # a job on this host alone
    lo = next(ip for name, ip in netif.addresses() if ip.startswith("127."))
    assert bind_address({"node9": 2}, ["lo"]) == lo  # the interface --network-interface names
    try:
        facing = netif.facing("192.0.2.200")  # TEST-NET-1: routed (or not) like any other host; no packet is sent
    except OSError:
        pytest.skip("no route out of this host")
    assert bind_address({"192.0.2.200": 2}) == facing != "0.0.0.0"
    pytest.importorskip("pyspark")
    from horo.spark.settings import bind_host

    class Conf(dict):
        def getConf(self):  # noqa: N802 - SparkContext's name
            return self

    assert bind_host(Conf({"spark.driver.host": "10.0.0.5"})) == "10.0.0.5"
    assert bind_host(Conf({"spark.driver.host": "node1", "spark.driver.bindAddress": "10.0.0.7"})) == "10.0.0.7"
