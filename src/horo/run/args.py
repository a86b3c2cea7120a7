"""hororun's (and horovodrun's) command line, built from the settings table: Horovod's groups and flags, with
errors that name the value received."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from typing import Any, NoReturn

import horo
from horo.core.base.setting import GROUPS, Setting
from horo.core.base.settings import SETTINGS
from horo.run.config_file import apply_config_file

__all__ = ["UsageError", "build_parser", "parse_args"]

_EXAMPLE = "hororun -np 2 python train.py"
_POSITIVE = ("np", "min_np", "max_np", "slots_per_host")  # counts of processes or slots: 1 at least


class UsageError(Exception):
    """A bad hororun command line; main prints it and exits with status 2."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of exiting, so ``main`` returns its status."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _converter(setting: Setting) -> Any:
    """The argparse ``type`` of a value flag: a number checked like the variable it sets, else the text."""
    flag = setting.flags[0]
    if setting.kind not in ("int", "float", "pair"):
        return str
    low = 1 if setting.name in _POSITIVE else 0

    def convert(text: str) -> int | float:
        try:
            value: int | float = int(text) if setting.kind == "int" else float(text)
        except ValueError:
            value = -1
        if value < low:
            what = "a positive integer" if low else "an integer >= 0" if setting.kind == "int" else "a number >= 0"
            raise argparse.ArgumentTypeError(f"must be {what}. Received: {flag}={text!r}. HINT: e.g. {flag} 2")
        return value

    return convert


class _Value(argparse.Action):
    """Stores a flag's value and notes the form given (``ns.given``: where ``--verbose`` says it came from)."""

    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if self.dest == "network_interface":  # repeated or comma-separated: all of them, as Horovod
            names = [n.strip() for n in str(values).split(",")]
            values = list(dict.fromkeys([*(getattr(ns, self.dest) or []), *names]))
        setattr(ns, self.dest, values)
        ns.given[self.dest] = option_string


class _Const(_Value):
    """A flag without a value that sets its setting to a fixed value (``--no-autotune``: 0)."""

    def __init__(self, option_strings: list[str], dest: str, const: Any, help: str | None = None) -> None:  # noqa: A002
        super().__init__(option_strings, dest, nargs=0, const=const, default=None, help=help)

    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        super().__call__(parser, ns, self.const, option_string)


def _add(section: Any, setting: Setting) -> None:
    """Add ``setting``'s flags to ``section``; the help says what horo does with them, or why it cannot."""
    # The docs' markup out: [Autotune](autotune.md) -> Autotune, `x` -> x.
    doc = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", setting.doc).replace("`", "").replace("%", "%%")
    label = setting.var or setting.horovod
    if setting.why and setting.fixed is None:
        doc += f" (ignored in horo: {setting.why})"
    if setting.name == "version":
        section.add_argument(*setting.flags, action="version", version=horo.__version__, help=doc)
    elif setting.kind == "switch" and setting.flags:
        section.add_argument(*setting.flags, dest=setting.name, action=_Const, const=True, help=doc)
    elif setting.flags:
        section.add_argument(*setting.flags, dest=setting.name, action=_Value, type=_converter(setting),
                             nargs=2 if setting.kind == "pair" else None, metavar=setting.metavar or None,
                             help=doc + (f" ({label})" if label else ""))
    by_value: dict[str, list[str]] = {}
    for form, value in setting.consts:
        by_value.setdefault(value, []).append(form)
    for i, (value, forms) in enumerate(by_value.items()):
        if setting.fixed is not None and not setting.honoured(value):
            text = f"{'refused' if setting.refuse else 'ignored'} in horo: {setting.why}"
        elif setting.kind == "choice":
            text = f"{doc}: {value}"
        else:
            text = (doc if i == 0 else "") + (f" ({label}={value})" if label else "")
        section.add_argument(*forms, dest=setting.name, action=_Const, const=value, help=text.strip() or doc)


def build_parser(prog: str = "hororun") -> argparse.ArgumentParser:
    """The argparse parser of ``hororun``/``horovodrun``: the settings with flags, in Horovod's groups."""
    parser = _Parser(
        prog=prog,
        description=f"Launch a horo (Horovod-style) training job on N processes through mpiexec. {prog} takes "
                    "horovodrun's flags; HOROVOD_* variables work as under Horovod (docs/api/launcher.md).",
        epilog=f"example: {_EXAMPLE}   |   {prog} -np 4 -H host1:2,host2:2 python train.py",
        allow_abbrev=False,
    )
    sections: dict[str, Any] = {"general": parser}
    for key, title in GROUPS.items():
        if key not in ("general", "variables", "rank"):
            sections[key] = parser.add_argument_group(f"{title} arguments")
    sections["hosts"] = sections["hosts"].add_mutually_exclusive_group()  # -H or --hostfile, as Horovod
    for setting in SETTINGS:
        if setting.forms:
            _add(sections[setting.group], setting)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the program each rank runs, with its arguments")
    return parser


def _check_elastic(ns: argparse.Namespace) -> None:
    """Cross-check the elastic flags (Horovod's rules: -np defaults to --min-np, MIN <= np <= MAX)."""
    if ns.hostfile:
        raise UsageError(f"elastic mode takes -H or --host-discovery-script, not --hostfile. Received: "
                         f"--hostfile={ns.hostfile!r}. HINT: print the hosts from a discovery script.")
    if ns.np is None:
        ns.np = ns.min_np or ns.max_np
    if ns.np is None:
        raise UsageError(f"elastic mode needs -np or --min-np. Received: -np=None, --min-np=None, --max-np=None. "
                         f"HINT: hororun -np 2 --min-np 2 --host-discovery-script {ns.discovery or 'SCRIPT'} ...")
    if ns.min_np is None:
        ns.min_np = ns.np
    if ns.max_np is None and not (ns.hosts or ns.discovery):
        ns.max_np = max(ns.np, ns.min_np) if ns.np else ns.min_np  # this machine only: as many as asked for
    # With -H or a discovery script and no --max-np, every slot offered is used (Horovod: unbounded).
    if not ns.min_np <= (ns.np or ns.min_np) <= (ns.max_np or ns.np or ns.min_np):
        raise UsageError(f"elastic mode needs --min-np <= -np <= --max-np. Received: --min-np={ns.min_np}, "
                         f"-np={ns.np}, --max-np={ns.max_np}. HINT: hororun -np 3 --min-np 2 --max-np 4 ...")
    if ns.elastic_timeout <= 0:
        raise UsageError(f"--elastic-timeout must be positive. Received: --elastic-timeout={ns.elastic_timeout:g}. "
                         "HINT: e.g. --elastic-timeout 600.")
    if ns.cooldown is not None and not 0 <= ns.cooldown[0] <= ns.cooldown[1]:
        raise UsageError(f"--blacklist-cooldown-range needs 0 <= LO <= HI. Received: "
                         f"--blacklist-cooldown-range={ns.cooldown[0]:g} {ns.cooldown[1]:g}. HINT: e.g. 60 300.")
    if ns.discovery and not os.access(ns.discovery, os.X_OK):
        raise UsageError(f"the host discovery script is not an executable file. Received: "
                         f"--host-discovery-script={ns.discovery!r}. HINT: chmod +x it.")


def _elastic_timeout(ns: argparse.Namespace, environ: Mapping[str, str]) -> float:
    """Horovod's precedence: the flag, else ``HORO_ELASTIC_TIMEOUT`` or ``HOROVOD_ELASTIC_TIMEOUT``, else 600."""
    if ns.elastic_timeout is not None:
        return float(ns.elastic_timeout)
    for var in ("HORO_ELASTIC_TIMEOUT", "HOROVOD_ELASTIC_TIMEOUT"):
        raw = environ.get(var, "").strip()
        if raw:
            try:
                return float(raw)
            except ValueError:
                raise UsageError(f"{var} must be a number of seconds. Received: {var}={raw!r}. "
                                 "HINT: e.g. 600, or unset it.") from None
    return 600.0


def _refuse(ns: argparse.Namespace) -> None:
    """Refuse, in one line, a flag or config-file value that cannot apply in horo (``Setting.refuse``)."""
    for setting in SETTINGS:
        value = getattr(ns, setting.name, None) if setting.refuse else None
        if value is None or setting.honoured(str(value)):
            continue
        form = ns.given.get(setting.name) or f"{ns.config_file}: {setting.key}={value}"
        raise UsageError(f"{form} cannot apply: {setting.why}. Received: {form}. HINT: drop it from the launch "
                         "line; docs/api/launcher.md lists what each Horovod flag does in horo.")


def parse_args(argv: list[str], environ: Mapping[str, str] | None = None, prog: str = "hororun") -> argparse.Namespace:
    """Parse and cross-check hororun's arguments (with ``--config-file``'s values where no flag gave one).

    Raises:
        UsageError: the message names the offending value and gives a hint.
        SystemExit: for ``--help`` and ``--version`` (argparse prints them and exits 0).
    """
    environ = os.environ if environ is None else environ
    parser = build_parser(prog)
    try:
        ns = parser.parse_args(argv, namespace=argparse.Namespace(given={}, from_config={}))
    except UsageError as exc:
        text = str(exc)
        if text.startswith("unrecognized arguments: "):
            text = (f"unrecognized {prog} option. Received: {text.split(': ', 1)[1]}. HINT: {prog} options "
                    f"go before the command, e.g. {_EXAMPLE}; see {prog} --help.")
        elif "HINT" not in text:
            text += f". HINT: see {prog} --help."
        raise UsageError(text) from None
    if ns.command and ns.command[0] == "--":
        ns.command = ns.command[1:]  # "hororun -np 2 -- cmd" separates a command that starts with "-"
    if ns.check_build:
        return ns
    if ns.config_file:
        try:
            apply_config_file(ns, ns.config_file)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    _refuse(ns)
    # Horovod's rule: a discovery script or --min-np makes the job elastic; --max-np alone does not.
    ns.elastic = ns.min_np is not None or ns.discovery is not None
    ns.elastic_timeout = _elastic_timeout(ns, environ)
    if ns.elastic:
        _check_elastic(ns)
    if ns.network_interface is not None:
        names = ns.network_interface
        if not all(names) or any(c.isspace() or c in "/:" for n in names for c in n):
            raise UsageError(
                f"--network-interface takes comma-separated interface names. Received: "
                f"--network-interface={','.join(names)!r}. HINT: --network-interface eth0"
            )
    if ns.ssh_command is not None and not ns.ssh_command.strip():
        raise UsageError(f"--ssh-command is empty. Received: --ssh-command={ns.ssh_command!r}. "
                         "HINT: --ssh-command /path/to/ssh-wrapper")
    if ns.np is None:
        raise UsageError(f"the number of processes is required. Received: -np=None. HINT: {_EXAMPLE}")
    if not ns.command:
        raise UsageError(f"no command to run. Received: command=[]. HINT: {_EXAMPLE}")
    if ns.command[0].startswith("-"):
        # Only reachable after "--"; mpiexec would take it for one of its own options.
        raise UsageError(
            f"the command must start with a program name. Received: command[0]={ns.command[0]!r}. "
            f"HINT: {_EXAMPLE}"
        )
    return ns
