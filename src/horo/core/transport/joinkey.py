"""The key a joined world's processes authenticate each other with (docs/cluster.md, "Keys").

``HORO_JOIN_SECRET`` where the launcher's environment carries one (horo.ray and horo.spark draw one per job;
on a cluster, the job script exports one). Otherwise, for processes on one host, local rank 0 draws a random
key and writes it to a file only this user can read, in a directory only this user can enter; the other ranks
of the host read it there. Values a launcher shows on its command line (torchrun's run id, its address and
port) are never a key: anyone who can run ``ps`` knows them. Across hosts, with no ``HORO_JOIN_SECRET``, there
is no private channel to hand a key over, so joining refuses.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

__all__ = ["MIN_CHARS", "NoKey", "across_hosts_refusal", "from_environment", "local_file", "one_host", "read_local",
           "retire", "write_local"]

#: The shortest ``HORO_JOIN_SECRET`` taken: 32 hexadecimal digits are 128 random bits.
MIN_CHARS = 32
_HOW = ("export HORO_JOIN_SECRET=$(python -c 'import secrets; print(secrets.token_hex(32))') in the job script "
        "or the scheduler's environment of every process (never on a command line, where ps shows it)")


class NoKey(RuntimeError):
    """No key can be had for this world; the message says how to give one."""


def from_environment(environ: Mapping[str, str]) -> bytes | None:
    """``HORO_JOIN_SECRET``'s bytes, None when it is unset.

    Raises:
        ValueError: it is shorter than :data:`MIN_CHARS` characters.
    """
    value = environ.get("HORO_JOIN_SECRET", "")
    if not value:
        return None
    if len(value) < MIN_CHARS:
        raise ValueError(f"HORO_JOIN_SECRET must hold at least {MIN_CHARS} characters (128 random bits as hex). "
                         f"Received: HORO_JOIN_SECRET=<{len(value)} characters>. HINT: {_HOW}.")
    return value.encode()


def one_host(environ: Mapping[str, str], master: str) -> bool:
    """Whether the launcher describes processes on this host only (torchrun's ``LOCAL_WORLD_SIZE`` equals
    ``WORLD_SIZE``, or the master is a loopback address)."""
    local, world = environ.get("LOCAL_WORLD_SIZE", ""), environ.get("WORLD_SIZE", "")
    if local.isdigit() and local == world:
        return True
    return master in ("localhost", "::1") or master.startswith("127.")


def _private_dir() -> Path:
    """A directory only this user can enter: ``$XDG_RUNTIME_DIR`` if it is one, else ``TMPDIR/horo-UID``.

    Raises:
        NoKey: the directory exists but another user owns it or others may enter it.
    """
    uid = os.getuid()
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime:
        with contextlib.suppress(OSError):
            st = os.lstat(runtime)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077:
                return Path(runtime)
    path = Path(tempfile.gettempdir()) / f"horo-{uid}"
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        raise NoKey(f"{path} is not a directory only this user can enter (owner uid {st.st_uid}, mode "
                        f"{stat.S_IMODE(st.st_mode):o}): another user may have made it, so no key is kept there. "
                        f"HINT: remove it, or {_HOW}.")
    return path


def local_file(environ: Mapping[str, str], parent_pid: int) -> Path:
    """Where local rank 0 of this job keeps the key: named by what every process of the job on this host shares
    (the launcher's run id, address, size, restart count, and for torchrun the agent's pid, their parent)."""
    parts = [environ.get(k, "") for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "HORO_JOIN_PORT",
                                          "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT")]
    if "TORCHELASTIC_RUN_ID" in environ:
        parts.append(str(parent_pid))
    name = hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]
    return _private_dir() / f"join-{name}.key"


_written: list[tuple[Path, bytes]] = []


def write_local(path: Path) -> bytes:
    """Local rank 0: a fresh random key in ``path`` (mode 0600, replacing any left by an earlier run). It stays
    until :func:`retire` (every rank has taken it): a rank that reads it late still learns why joining failed."""
    key = secrets.token_hex(32).encode()
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key)
    os.replace(tmp, path)
    _written.append((path, key))
    return key


def retire() -> None:
    """Remove the key files this process wrote (every rank has proven it holds the key: none needs them)."""
    while _written:
        path, key = _written.pop()
        with contextlib.suppress(OSError):
            if path.read_bytes() == key:  # not a later run's
                path.unlink()


def read_local(path: Path, deadline: float, previous: bytes | None = None) -> bytes:
    """The other local ranks: the key local rank 0 wrote (other than ``previous``, one found stale), waiting for
    it until ``deadline`` (monotonic).

    Raises:
        NoKey: none came in time, or the file is not this user's alone.
    """
    while True:
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as fh:
                st = os.fstat(fh.fileno())
                if st.st_uid != os.getuid() or st.st_mode & 0o077 or not stat.S_ISREG(st.st_mode):
                    raise NoKey(f"{path} is not a file only this user can read; its key is not used. "
                                    f"HINT: remove it, or {_HOW}.")
                key = fh.read()
            if len(key) >= MIN_CHARS and key != previous:
                return key
        if time.monotonic() > deadline:
            raise NoKey(f"local rank 0 wrote no key to {path} in time (it keeps one there for a job on one "
                            f"host started without HORO_JOIN_SECRET). HINT: check rank 0's output, or {_HOW}.")
        time.sleep(0.05)


def across_hosts_refusal() -> str:
    """Why a job across hosts without ``HORO_JOIN_SECRET`` does not join, and what to do."""
    return ("its processes span hosts and HORO_JOIN_SECRET is not set, and values the launcher shows (its run id, "
            "address and port) are no secret: a key made of them would let anyone who can run ps act as one of "
            f"its processes. HINT: {_HOW}")
