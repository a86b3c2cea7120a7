"""One setting of horo: how a launch line, a config file and the environment name it (see ``settings``).

Kept apart from the table so that the table is data only. Values travel as text, as environment variables do.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GROUPS", "KINDS", "TOPICS", "Setting", "horovod_int"]

#: Horovod's ``horovodrun`` argument groups (its launch.py), in its order, with the titles ``--help`` shows; then
#: the settings that only a variable sets, and the variables horo sets for each rank.
GROUPS: dict[str, str] = {
    "general": "general",
    "ssh": "SSH",
    "params": "tuneable parameter",
    "autotune": "autotune",
    "elastic": "elastic",
    "timeline": "timeline",
    "stall_check": "stall check",
    "library": "library",
    "logging": "logging",
    "hosts": "host",
    "controller": "controller",
    "variables": "variables only",
    "rank": "set for each rank",
}
#: Sections of docs/configuration.md, which lists every ``HORO_`` variable of the table by its topic.
TOPICS: dict[str, str] = {
    "engine": "The engine and the collectives",
    "failures": "Failures and stalls",
    "gpus": "GPUs",
    "launching": "Launching",
    "timeline": "Timeline, autotune and logging",
}
#: int, float: a non-negative number; bool: 1 or 0; path: made absolute before it reaches the ranks; text: as
#: given; choice: one of ``choices``; list: names, comma-separated or given by a flag used several times;
#: pair: two numbers; switch: a flag without a value that the launcher acts on.
KINDS = ("int", "float", "bool", "path", "text", "choice", "list", "pair", "switch")


@dataclass(frozen=True)
class Setting:
    """A setting: its names on the launch line, in Horovod's config file and in the environment.

    ``flags`` take a value; ``consts`` are flags that set a fixed value (``--no-autotune`` sets ``0``). A flag or
    config-file value is in ``unit`` (``MB``: the variable holds bytes). ``fixed``: the only value horo can
    honour (its own behaviour, e.g. ``MPI`` for the controller); any other value of the setting is, per
    ``refuse``, refused on the launch line (exit 2) or warned about, naming ``why``. ``why`` alone (no
    ``fixed``) marks a setting with no meaning in horo: warned about whatever its value.
    """

    name: str  # the argparse destination; also the row's id
    group: str  # a key of GROUPS
    doc: str  # what it does in horo, one sentence for --help and the docs
    var: str | None = None  # the variable that carries it to the ranks (HORO_..., or another program's)
    horovod: str | None = None  # Horovod's variable of the same meaning (the same units as ``var``)
    flags: tuple[str, ...] = ()
    consts: tuple[tuple[str, str], ...] = ()
    key: str | None = None  # Horovod's config-file key, "section.name" ("!" first: the value is inverted)
    kind: str = "text"
    unit: str = ""
    default: str = ""  # the variable's default, as text ("": unset)
    note: str = ""  # shown after the default in the docs
    reader: str = ""  # what reads it
    fixed: str | None = None
    why: str = ""
    refuse: bool = False
    agreed: bool = False  # read on rank 0 and shared by every rank at init()
    choices: tuple[str, ...] = ()
    topic: str = ""  # a key of TOPICS, for a HORO_ variable
    metavar: str = ""
    autotune_only: bool = False  # Horovod ignores the flag unless autotune is on

    @property
    def forms(self) -> tuple[str, ...]:
        """Every flag form of the setting."""
        return self.flags + tuple(f for f, _v in self.consts)

    @property
    def scale(self) -> int:
        """Factor from the flag's unit to the variable's."""
        return 1 << 20 if self.unit == "MB" else 1

    def honoured(self, value: str) -> bool:
        """Whether horo honours ``value`` (the variable's text) for this setting."""
        if self.fixed is not None:
            if self.kind == "bool":  # on or off, as Horovod reads it: any non-zero integer is on
                return (horovod_int(value) != 0) == (self.fixed != "0")
            return value.strip().upper() == self.fixed.upper()
        return not self.why


def horovod_int(text: str) -> int:
    """An integer read as Horovod's C++ reads its variables (``strtol``): the leading digits, else 0."""
    text = text.strip()
    sign, digits = (-1, text[1:]) if text[:1] == "-" else (1, text.lstrip("+"))
    run = len(digits) - len(digits.lstrip("0123456789"))
    return sign * int(digits[:run]) if run else 0
