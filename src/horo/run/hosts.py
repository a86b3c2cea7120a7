"""Host lists for hororun: parse ``-H``/``--hostfile`` and render what each MPI launcher accepts."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass

__all__ = [
    "HostParseError",
    "HostSpec",
    "any_remote",
    "is_local_host",
    "parse_hostfile",
    "parse_hosts_arg",
    "to_hydra_hostfile",
    "to_hydra_hosts_arg",
    "to_openmpi_hostfile",
]

# A host name or address: letters, digits, dots, dashes, underscores; IPv6 needs brackets-free colons,
# which clash with ``host:slots``, so IPv6 literals are not supported here (same as Horovod).
_HOST_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


class HostParseError(ValueError):
    """A host list or hostfile entry that hororun cannot understand."""


@dataclass(frozen=True)
class HostSpec:
    """One host and its slot count (``None``: let the launcher decide, normally one per core)."""

    host: str
    slots: int | None = None


def _slots(value: str, where: str, hint: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise HostParseError(f"{where}: slot count must be a positive integer. Received: slots={value!r}. {hint}")
    return int(value)


def _host(value: str, where: str, hint: str) -> str:
    if not _HOST_RE.match(value):
        raise HostParseError(f"{where}: invalid host name. Received: host={value!r}. {hint}")
    return value


def parse_hosts_arg(text: str) -> list[HostSpec]:
    """Parse ``-H host1:2,host2:2`` (slot counts optional) into host specs.

    Raises:
        HostParseError: an empty list, a bad host name or a slot count that is not a positive integer.
    """
    hint = "HINT: use comma-separated host[:slots] entries, e.g. -H host1:2,host2:2"
    where = f"-H {text!r}"
    specs = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise HostParseError(f"{where}: empty host entry. Received: -H={text!r}. {hint}")
        name, sep, count = item.partition(":")
        specs.append(HostSpec(_host(name, where, hint), _slots(count, where, hint) if sep else None))
    return specs


def parse_hostfile(text: str, source: str = "hostfile") -> list[HostSpec]:
    """Parse a hostfile in Horovod/Open MPI style (``host slots=2``) or hydra style (``host:2``).

    Blank lines and ``#`` comments are ignored; a line may also name a bare host.

    Raises:
        HostParseError: a line that is none of the forms above (the message names file, line and text).
    """
    hint = "HINT: each line must be 'host', 'host slots=N' or 'host:N'."
    specs = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source} line {lineno} ({raw.strip()!r})"
        first, *rest = line.split()
        name, sep, count = first.partition(":")
        slots = _slots(count, where, hint) if sep else None
        for token in rest:
            key, eq, value = token.partition("=")
            if key != "slots" or not eq or sep or slots is not None:
                raise HostParseError(f"{where}: unexpected token. Received: {token!r}. {hint}")
            slots = _slots(value, where, hint)
        specs.append(HostSpec(_host(name, where, hint), slots))
    if not specs:
        raise HostParseError(f"{source}: no hosts found. Received: an empty hostfile. {hint}")
    return specs


def _hydra_entry(spec: HostSpec) -> str:
    return spec.host if spec.slots is None else f"{spec.host}:{spec.slots}"


def to_hydra_hosts_arg(specs: list[HostSpec]) -> str:
    """Render specs as hydra's ``-hosts`` value, e.g. ``host1:2,host2:2``."""
    return ",".join(_hydra_entry(s) for s in specs)


def to_hydra_hostfile(specs: list[HostSpec]) -> str:
    """Render specs as a hydra machine file (``-f``): one ``host:slots`` per line."""
    return "".join(_hydra_entry(s) + "\n" for s in specs)


def to_openmpi_hostfile(specs: list[HostSpec]) -> str:
    """Render specs as an Open MPI hostfile: one ``host slots=N`` per line."""
    return "".join(s.host + ("" if s.slots is None else f" slots={s.slots}") + "\n" for s in specs)


def is_local_host(host: str) -> bool:
    """Whether ``host`` names this machine (by name only: no DNS lookup, which could hang)."""
    name = host.lower()
    if name in ("localhost", "::1") or name.startswith("127."):
        return True
    here = socket.gethostname().lower()
    return name in (here, here.split(".", 1)[0])


def any_remote(specs: list[HostSpec] | None) -> bool:
    """Whether any spec names another machine, so environment must be forwarded explicitly."""
    return bool(specs) and not all(is_local_host(s.host) for s in specs)
