"""The effective value of each setting of a launch, with its source (a flag, the config file, a ``HORO_`` or
``HOROVOD_`` variable, the default), and what hororun hands on: the ranks' variables and the MPI launcher's
extra arguments. Precedence: a flag, then the config file, then ``HORO_<X>``, then ``HOROVOD_<X>``, then the
default (Horovod's own order, with horo's name first among the variables)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from horo.core.base.config import warn_once
from horo.core.base.setting import Setting, horovod_int
from horo.core.base.settings import SETTINGS
from horo.core.scheduling.autotune.settings import read_options
from horo.run.args import UsageError

__all__ = ["Effective", "print_settings", "resolve"]

_WORDS = ("0", "1", "true", "false", "yes", "no", "on", "off")


@dataclass
class Effective:
    """A launch's settings: ``values`` (setting, value as the variable holds it, source), the variables the
    ranks get (``rank_env``), the MPI launcher's extra arguments and ssh options, and the start timeout."""

    values: list[tuple[Setting, str, str]] = field(default_factory=list)
    rank_env: dict[str, str] = field(default_factory=dict)
    launcher_args: list[str] = field(default_factory=list)
    ssh_args: list[str] = field(default_factory=list)
    start_timeout: float | None = None


def _text(setting: Setting, value: Any) -> str:
    """A flag's or config-file value as its variable holds it (MB to bytes, paths absolute, ...)."""
    if setting.kind == "int":
        return str(int(value) * setting.scale)
    if setting.kind == "float":
        return f"{float(value):g}"
    if setting.kind == "path":
        return value if setting.name == "timeline" and value == "DYNAMIC" else os.path.abspath(value)
    if setting.kind == "list":
        return ",".join(value)
    if setting.kind == "pair":
        return " ".join(f"{v:g}" for v in value)
    if setting.kind == "choice":
        return str(value).upper()
    return "1" if value is True else str(value)


def _check(setting: Setting, name: str, raw: str) -> None:
    """Refuse a variable's value the ranks would refuse, before anything starts."""
    text = raw.strip()
    if setting.kind in ("int", "float"):
        try:
            ok = float(text) >= 0
        except ValueError:
            ok = False
        what, hint = "a number >= 0", f"unset it to use the default {setting.default or '(none)'}"
    elif setting.kind == "bool":  # Horovod's names are read as Horovod reads them: any text is some integer
        ok, what, hint = name.startswith("HOROVOD_") or text.lower() in _WORDS, "0 or 1", f"{name}=1 turns it on"
    elif setting.kind == "choice":
        ok, what, hint = text.upper() in (c.upper() for c in setting.choices), " or ".join(setting.choices), \
            f"e.g. {name}={setting.choices[0]}"
    else:
        return
    if not ok:
        raise UsageError(f"Environment variable {name} must be {what}. Received: {name}={raw!r}. HINT: {hint}.")


def _autotune_on(ns: argparse.Namespace, environ: Mapping[str, str]) -> bool:
    if ns.autotune is not None:
        return ns.autotune == "1"
    raw = environ.get("HORO_AUTOTUNE", "").strip().lower()
    if raw:
        return raw in ("1", "true", "yes", "on")
    return horovod_int(environ.get("HOROVOD_AUTOTUNE", "0")) != 0


def _split(flag: str, text: str | None) -> list[str]:
    try:
        return shlex.split(text or "")
    except ValueError as exc:
        raise UsageError(f"{flag} is not a valid shell argument list ({exc}). Received: {flag}={text!r}. "
                         f"HINT: {flag}=\"--map-by ppr:2:node\"") from None


def _given(setting: Setting, ns: argparse.Namespace, eff: Effective, autotune: bool) -> None:
    """A setting a flag or the config file gave: its variables for the ranks, and warnings where it does nothing."""
    value = getattr(ns, setting.name)
    text = _text(setting, value)
    if setting.name in ns.given:
        form = ns.given[setting.name]
        source = form if setting.consts or setting.kind == "switch" else f"{form} {_shown(value)}"
    else:
        form = source = f"config file {ns.config_file}: {ns.from_config[setting.name]}: {_shown(value)}"
    if setting.kind == "choice" and setting.choices and text not in setting.choices:
        raise UsageError(f"{form} takes {', '.join(setting.choices)}. Received: {form}={value!r}. "
                         f"HINT: e.g. {form} {setting.choices[-1]}.")
    eff.values.append((setting, text, source))
    if not setting.honoured(text):
        warn_once(setting.horovod or setting.name, f"{source} is ignored: {setting.why}.")
    if setting.autotune_only and not autotune:
        warn_once(setting.name, f"{source} has no effect without --autotune (as in Horovod). HINT: add --autotune.")
        return
    if setting.var and setting.reader != "hororun":
        eff.rank_env[setting.var] = text
    if setting.horovod and setting.key and setting.group != "controller":
        eff.rank_env[setting.horovod] = text  # as horovodrun sets it, so scripts reading it see the value


def _shown(value: Any) -> str:
    """A flag's value as the user wrote it (numbers without a needless ``.0``)."""
    if isinstance(value, (list, tuple)):
        return " ".join(map(_shown, value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def resolve(ns: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Effective:
    """The effective settings of the launch ``ns`` (from :func:`horo.run.args.parse_args`).

    Raises:
        UsageError: a variable's value the ranks would refuse, or a bad value list for the MPI launcher.
    """
    environ = os.environ if environ is None else environ
    eff = Effective()
    autotune = _autotune_on(ns, environ)
    for setting in SETTINGS:
        if setting.group == "rank" or setting.name == "version":
            continue
        if setting.name in ns.given or setting.name in ns.from_config:
            _given(setting, ns, eff, autotune)
            continue
        for name in (setting.var, setting.horovod):
            if name and environ.get(name, "").strip():
                _check(setting, name, environ[name])
                eff.values.append((setting, environ[name], name))
                break
        else:
            if setting.default:
                eff.values.append((setting, setting.default, "default"))
    try:
        read_options({**environ, **eff.rank_env})  # autotune's own ranges (counts >= 1, noise in [0, 1], ...)
    except ValueError as exc:
        text = str(exc)
        for setting in SETTINGS:
            if setting.var and setting.name in ns.given:
                text = text.replace(f"{setting.var}=", f"{ns.given[setting.name]}=")
        raise UsageError(text) from None
    if ns.max_np is not None and not ns.elastic:
        warn_once("max_np", f"--max-np {ns.max_np} alone does not make the job elastic (as in Horovod): {ns.np} "
                  "ranks run. HINT: add --min-np or --host-discovery-script for an elastic job.")
    if ns.network_interface and not environ.get("NCCL_SOCKET_IFNAME"):
        eff.rank_env["NCCL_SOCKET_IFNAME"] = ",".join(ns.network_interface)  # NCCL's traffic too, as Horovod
    eff.launcher_args = _split("--binding-args", ns.binding_args) + _split("--mpi-args", ns.mpi_args)
    if ns.ssh_port is not None:
        eff.ssh_args += ["-p", str(ns.ssh_port)]
    if ns.ssh_identity_file is not None:
        eff.ssh_args += ["-i", os.path.abspath(ns.ssh_identity_file)]
    timeout = next((float(v) for s, v, _src in eff.values if s.name == "start_timeout"), None)
    eff.start_timeout = timeout if timeout else None
    return eff


def print_settings(eff: Effective, prog: str = "hororun", stream: TextIO | None = None) -> None:
    """``--verbose``: every setting in effect, its value as the ranks get it, and where it came from."""
    out = sys.stderr if stream is None else stream
    lines = [f"{prog}: settings in effect (value, source):"]
    for setting, value, source in eff.values:
        label = setting.var or setting.horovod or setting.forms[0]
        why = "" if setting.honoured(value) else f"; ignored: {setting.why}"
        lines.append(f"{prog}:   {label}={value}  ({source}{why})")
    print("\n".join(lines), file=out, flush=True)
