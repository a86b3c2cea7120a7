"""Write the documentation's tables of settings from the settings table (``horo.core.base.settings``).

Each table sits in its page between ``<!-- settings table: NAME -->`` and ``<!-- end of settings table -->``:
docs/configuration.md's tables of ``HORO_`` variables (one per topic), and docs/api/launcher.md's tables of
horovodrun's flags (one per Horovod argument group) and of Horovod's variables. tests/test_launch_line.py fails
when a page differs from what this writes.

    python tools/settings_tables.py           # rewrite the tables in the pages
    python tools/settings_tables.py --check   # exit 1, naming the pages, when one is out of date
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from horo.core.base.setting import GROUPS, TOPICS, Setting  # noqa: E402 - from the checkout's src
from horo.core.base.settings import BUILD_VARIABLES, SETTINGS  # noqa: E402

PAGES = (ROOT / "docs" / "configuration.md", ROOT / "docs" / "api" / "launcher.md")
_BLOCK = re.compile(r"(<!-- settings table: (\S+) -->\n)(.*?)(<!-- end of settings table -->)", re.S)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(s: Setting) -> str:
    shown = s.default or "unset"
    return f"{shown} ({s.note})" if s.note else shown


def _in_horo(s: Setting, value: str | None = None) -> str:
    """What horo does with the setting (with ``value``, for a flag that sets one)."""
    if s.fixed is not None and value is not None and not s.honoured(value):
        return f"{'refused (exit 2)' if s.refuse else 'ignored, with a warning'}: {s.why}"
    if s.why and s.fixed is None:
        return f"ignored, with a warning: {s.why}"
    if s.fixed is not None:
        return f"{s.fixed}: what horo always does"
    unit = {"MB": " (MB on the launch line, bytes in the variable)", "ms": " (ms)"}.get(s.unit, "")
    return s.doc + unit


def variables_table(topic: str) -> list[str]:
    """docs/configuration.md: the ``HORO_`` variables of ``topic``."""
    rows = ["| variable | Horovod's name | default | meaning |", "| --- | --- | --- | --- |"]
    for s in SETTINGS:
        if s.topic == topic and s.var:
            alias = f"`{s.horovod}`" if s.horovod else ""
            rows.append(f"| `{s.var}` | {alias} | {_default(s)} | {_cell(s.doc)} |")
    return rows


def flags_table(group: str) -> list[str]:
    """docs/api/launcher.md: the flags of one of Horovod's argument groups."""
    rows = ["| flag | Horovod's config file | sets | in horo |", "| --- | --- | --- | --- |"]
    for s in SETTINGS:
        if s.group != group:
            continue
        key = f"`{s.key.lstrip('!')}`" + (" (inverted)" if s.key.startswith("!") else "") if s.key else ""
        if s.flags:
            sets = f"`{s.var or s.horovod}`" if (s.var or s.horovod) else ""
            rows.append(f"| `{'`, `'.join(s.flags)}` | {key} | {sets} | {_cell(_in_horo(s))} |")
        for form, value in s.consts:
            label = s.var or s.horovod
            sets = f"`{label}={value}`" if label and s.kind != "choice" else ""
            rows.append(f"| `{form}` | {key} | {sets} | {_cell(_in_horo(s, value))} |")
    return rows


def horovod_variables_table() -> list[str]:
    """docs/api/launcher.md: every ``HOROVOD_`` variable and what horo does with it."""
    rows = ["| Horovod's variable | horo's | in horo |", "| --- | --- | --- |"]
    for s in sorted((s for s in SETTINGS if s.horovod), key=lambda s: s.horovod or ""):
        if s.group == "rank":
            what = f"set for each rank: {s.doc}"
        else:
            what = _in_horo(s)
        mine = f"`{s.var}`" if s.var and s.var.startswith("HORO_") else ""
        rows.append(f"| `{s.horovod}` | {mine} | {_cell(what)} |")
    build = ", ".join(f"`{n}`" for n in BUILD_VARIABLES)
    rows.append(f"| {build} | | ignored, with a warning: Horovod's build options; horo has nothing to compile |")
    return rows


def render(name: str) -> list[str]:
    """The table named ``name`` in a page: ``topic-<topic>``, ``flags-<group>`` or ``horovod-variables``."""
    kind, _, arg = name.partition("-")
    if kind == "topic" and arg in TOPICS:
        return variables_table(arg)
    if kind == "flags" and arg in GROUPS:
        return flags_table(arg)
    if name == "horovod-variables":
        return horovod_variables_table()
    raise ValueError(f"unknown settings table. Received: name={name!r}. HINT: topic-<{'|'.join(TOPICS)}>, "
                     f"flags-<{'|'.join(GROUPS)}> or horovod-variables.")


def rewritten(text: str, page: Path) -> str:
    """``text`` (of ``page``) with each of its settings tables written anew; the settings' links to other pages
    are made relative to ``page``."""
    up = "../" * (len(page.relative_to(ROOT / "docs").parts) - 1)

    def table(m: re.Match[str]) -> str:
        rows = "\n".join(render(m.group(2)))
        return m.group(1) + re.sub(r"\]\((?!https?:)", f"]({up}", rows) + "\n" + m.group(4)

    return _BLOCK.sub(table, text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="only say which pages are out of date")
    args = parser.parse_args()
    stale = [p for p in PAGES if rewritten(p.read_text(encoding="utf-8"), p) != p.read_text(encoding="utf-8")]
    if args.check:
        for p in stale:
            print(f"{p.relative_to(ROOT)}: its settings tables are out of date; run python tools/settings_tables.py")
        return 1 if stale else 0
    for p in stale:
        p.write_text(rewritten(p.read_text(encoding="utf-8"), p), encoding="utf-8")
        print(f"rewrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
