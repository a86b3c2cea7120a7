"""Checks across the documentation's pages: what one page says of another, and of the code, holds.

- a link names the page it goes to by that page's title (its title in mkdocs.yml's nav, or its first
  heading), or by the heading of the section it goes to; a link in running prose (its text starts in lower
  case) may say what it likes;
- a guide that shows how to install `horo-mpi` says where it comes from (it is not on the package index: a
  checkout or a wheel, which docs/install.md shows);
- docs/install.md lists every extra pyproject.toml declares;
- docs/configuration.md names every `HORO_`/`HOROVOD_` variable the code reads, with the code's default;
- `make demo` runs every example, as the pages that mention it say; no guide but the support matrix holds a
  status table.
"""

from __future__ import annotations

import ast
import importlib
import re
import unicodedata
from pathlib import Path

import pytest
import tomllib

pytestmark = pytest.mark.unit  # no MPI job, no cluster: make test-quick runs it

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _nav() -> tuple[dict[str, str], dict[str, str]]:
    """{page: its nav title} and {page: the nav section it opens}, read from mkdocs.yml."""
    titles, opens, section = {}, {}, None
    for line in (ROOT / "mkdocs.yml").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^(\s*)- ([^:]+):\s*(\S*)$", line)
        if not m:
            continue
        if len(m.group(1)) == 2 and not m.group(3):
            section = m.group(2)
        elif m.group(3).endswith(".md"):
            titles[m.group(3)] = m.group(2)
            if section:
                opens[m.group(3)] = section
                section = None
    return titles, opens


def _plain(text: str) -> str:
    return " ".join(text.replace("`", "").split())


def _slug(heading: str) -> str:
    """The anchor MkDocs gives a heading (Python-Markdown's toc slugify)."""
    text = unicodedata.normalize("NFKD", _plain(heading)).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def _headings(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return [m.group(1) for m in re.finditer(r"^#+ (.+?)\s*$", text, re.MULTILINE)]


def _link_problems(page: Path, text: str | None = None) -> list[str]:
    """Links of ``page`` (or of ``text``, read as if it were ``page``) whose text is not their target's title."""
    titles, opens = _nav()
    problems = []
    text = FENCE.sub("", page.read_text(encoding="utf-8") if text is None else text)
    for m in LINK.finditer(text):
        label, target = _plain(m.group(1)), m.group(2)
        path, _, anchor = target.partition("#")
        if re.match(r"[a-z]+:", target) or not path.endswith(".md") or label[:1].islower():
            continue
        dest = (page.parent / path).resolve()
        if not dest.is_file():
            continue  # the strict site build reports broken links
        rel = dest.relative_to(DOCS).as_posix() if DOCS in dest.parents else dest.name
        heads = _headings(dest)
        names = {_plain(n) for n in (titles.get(rel), opens.get(rel), heads[0] if heads else None) if n}
        section = next((_plain(h) for h in heads if _slug(h) == anchor), None) if anchor else None
        base = label[:-2] if label.endswith("'s") else label
        if base in names or (section and base == section) or any(base.startswith(f"{n}, ") for n in names):
            continue
        problems.append(f"{page.relative_to(ROOT)}: [{label}]({target}): the page is {sorted(names)}"
                        + (f", the section {section!r}" if section else ""))
    return problems


LINK_PAGES = sorted(p.relative_to(ROOT).as_posix() for p in [ROOT / "README.md", *DOCS.rglob("*.md")])


@pytest.mark.parametrize("page", LINK_PAGES)
def test_links_name_their_pages_by_title(page: str) -> None:
    problems = _link_problems(ROOT / page)
    assert not problems, "links whose text is not the title of the page (or section) they go to:\n" \
        + "\n".join(problems)


@pytest.mark.parametrize(("label", "target", "ok"), [
    ("Keras model.fit", "keras.md", True),
    ("Keras `model.fit` on several ranks", "keras.md", True),
    ("Keras and TensorFlow", "keras.md", False),
    ("Design notes", "design-engine.md", True),
    ("Lightning Trainer and Fabric, elastic training", "torch-lightning.md#elastic-training", True),
    ("Elastic training", "torch-lightning.md#elastic-training", True),
    ("Gradient buckets", "design-gpu.md#gradient-buckets-and-prepared-calls", False),
    ("the design note", "design-engine.md", True),
])
def test_the_link_check_is_precise(label: str, target: str, ok: bool) -> None:
    assert (not _link_problems(DOCS / "probe.md", f"# probe\n\nSee [{label}]({target}).\n")) is ok


# ---- Where horo-mpi comes from ----

INSTALL_LINE = re.compile(r"pip install\s+(?:-\S+\s+)*['\"]?horo-mpi\b")


def _install_pages() -> list[str]:
    pages = [p for p in DOCS.glob("*.md") if p.name not in ("install.md", "contributing.md")]
    return sorted(p.relative_to(ROOT).as_posix() for p in pages if INSTALL_LINE.search(p.read_text(encoding="utf-8")))


@pytest.mark.parametrize("page", _install_pages())
def test_an_install_line_says_where_horo_mpi_comes_from(page: str) -> None:
    """`horo-mpi` is not on the package index: a page that installs it links to Install (a checkout or a wheel)."""
    assert re.search(r"\]\(install\.md[#)]", (ROOT / page).read_text(encoding="utf-8")), \
        f"{page} installs horo-mpi without a link to install.md, which says where it comes from"


def test_install_lists_every_extra() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    page = (DOCS / "install.md").read_text(encoding="utf-8")
    missing = sorted(e for e in extras if f"`{e}`" not in page)
    assert not missing, f"extras pyproject.toml declares that docs/install.md does not list: {missing}"


# ---- Every variable the code reads is in configuration.md, with its default ----

ENV_NAME = re.compile(r"^HORO(?:VOD)?_[A-Z0-9]+(?:_[A-Z0-9]+)*$")
#: Variables horo's launchers set for the processes they start; a user never sets them.
SET_BY_HORO = {
    "HORO_ELASTIC_ASSIGN", "HORO_ELASTIC_DRIVER", "HORO_ELASTIC_SECRET", "HORO_ELASTIC_MIN_NP", "HORO_ELASTIC_MAX_NP",
    "HORO_ELASTIC_RESET_LIMIT", "HORO_ELASTIC_RESET_BASE", "HORO_ELASTIC_RESUME", "HORO_ELASTIC_KEEP_STATE",
    "HORO_HOSTNAME", "HOROVOD_HOSTNAME", "HORO_SELF_LAUNCHED", "HORO_JOIN_RANK", "HORO_JOIN_SIZE",
    "HORO_JOIN_LOCAL_RANK", "HORO_JOIN_ADDR", "HORO_JOIN_SECRET", "HORO_JOIN_LAUNCHER", "HORO_JOIN_TABLE",
    "HORO_JOIN_AGENTS", "HORO_SETTINGS_CHECKED", "HORO_START_MARK",
}
#: The section of the launcher's reference that lists every Horovod variable; configuration.md links to it.
HOROVOD_VARIABLES = "api/launcher.md#horovods-variables"


def _docstring_ids(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            found.add(id(first.value))
    return found


def _exported_ids(tree: ast.Module) -> set[int]:
    """The strings of a module's `__all__`: names of its own, not variables (`HOROVOD_API`)."""
    return {id(e) for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, (ast.List, ast.Tuple))
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets) for e in n.value.elts}


def _constants(tree: ast.Module) -> dict[str, object]:
    return {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
            for t in n.targets if isinstance(t, ast.Name)}


def read_variables() -> dict[str, set[str]]:
    """Every `HORO_`/`HOROVOD_` name in src/horo's code (not its docstrings), with the defaults its readers give
    (`.get(NAME, default)`, a module constant as the default included, and the core's table of defaults)."""
    names: dict[str, set[str]] = {}
    for path in sorted((ROOT / "src" / "horo").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs, constants = _docstring_ids(tree) | _exported_ids(tree), _constants(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs \
                    and ENV_NAME.match(node.value):
                names.setdefault(node.value, set())
            if isinstance(node, ast.Call) and len(node.args) == 2 and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "get" and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str) and ENV_NAME.match(node.args[0].value):
                default = node.args[1]
                value = default.value if isinstance(default, ast.Constant) else \
                    constants.get(default.id, ...) if isinstance(default, ast.Name) else ...
                if value is not ...:
                    names.setdefault(node.args[0].value, set()).add(str(value))
    config = importlib.import_module("horo.core.base.config")
    for name, default in config._DEFAULTS.items():
        names[name] = {str(int(default)) if float(default).is_integer() else str(default)}
    return names


def _documented(page: str) -> dict[str, str]:
    """{variable: its default cell} for each table row of a page naming one in its first cell (the cell of the
    column headed "default", empty where the table has none); families (`X_*`) and names in prose too."""
    found: dict[str, str] = {}
    column = None
    for line in page.splitlines():
        if not line.startswith("|"):
            column = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if column is None:  # a table's header row
            column = cells.index("default") if "default" in cells else -1
            continue
        for name in re.findall(r"`(HORO(?:VOD)?_[A-Z0-9_]+\*?)`", cells[0]):
            found[name] = cells[column] if 0 < column < len(cells) else ""
    for name in re.findall(r"`(HORO(?:VOD)?_[A-Z0-9_]+\*?)`", page):
        found.setdefault(name, "")
    return found


def _default_matches(cell: str, defaults: set[str]) -> bool:
    """Whether a page's default cell is the code's. A reader's empty default (`.get(NAME, "")`) says only that
    the variable may be unset, with the default applied further on: it matches any cell."""
    first = cell.replace("`", "").split(" ")[0] if cell else ""
    if first == "unset":
        return defaults <= {"", "None"}
    defaults = defaults - {"", "None"}
    if not first or not defaults:
        return True
    try:
        return any(float(first) == float(d) for d in defaults)
    except ValueError:
        return first in defaults


@pytest.mark.parametrize(("cell", "defaults", "ok"), [
    ("1048576 (16 MiB across hosts)", {"1048576"}, True),
    ("0 (off)", {"0"}, True),
    ("`spawn`", {"hororun", "spawn"}, True),
    ("unset", {"NCCL"}, False),
    ("unset", set(), True),
    ("5", {"6"}, False),
    ("", {"120"}, True),
    ("WARNING", {""}, True),
    ("WARNING", {"", "INFO"}, False),
])
def test_the_default_check_is_precise(cell: str, defaults: set[str], ok: bool) -> None:
    assert _default_matches(cell, defaults) is ok


def test_the_variables_the_code_reads_are_found_with_their_defaults() -> None:
    """The reader behind the configuration check finds variables, and defaults, wherever the code keeps them."""
    found = read_variables()
    assert found["HORO_JOIN_TIMEOUT"] == {"120"} and found["HORO_TF_KERNEL"] == {"auto"}  # .get(NAME, literal)
    assert found["HORO_LAUNCHER"] == {"hororun", "spawn"}  # .get(NAME, a module constant) too
    assert found["HORO_FUSION_THRESHOLD"] == {"1048576"} and found["HORO_CYCLE_TIME"] == {"50"}  # the core's table
    assert {"HORO_JOIN_PORT", "HORO_CACHE_DIR", "HOROVOD_SPARK_START_TIMEOUT"} <= set(found)
    assert not [n for n in found if n.startswith("HORO_KERAS_BENCH")], "a printed marker is not a variable"
    assert "HOROVOD_API" not in found, "a name in a module's __all__ is not a variable"


@pytest.mark.parametrize(("page", "found"), [
    ("| variable | Horovod's name | default | meaning |\n| --- | --- | --- | --- |\n"
     "| `HORO_X` | `HOROVOD_X` | 5 | m |\n",
     {"HORO_X": "5", "HOROVOD_X": ""}),
    ("| Horovod's variable | horo's | in horo |\n| --- | --- | --- |\n| `HOROVOD_Y` | `HORO_Y` | what |\n",
     {"HOROVOD_Y": "", "HORO_Y": ""}),
    ("Set `HORO_Z*` in prose.\n", {"HORO_Z*": ""}),
])
def test_the_table_reader_takes_the_default_column(page: str, found: dict[str, str]) -> None:
    assert _documented(page) == found


def test_configuration_names_every_variable_with_its_default() -> None:
    """Every `HORO_` variable the code reads is in configuration.md with the code's default; every `HOROVOD_`
    one there or in the launcher reference's list of Horovod's variables, which configuration.md links to."""
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert f"]({HOROVOD_VARIABLES})" in page, f"configuration.md does not link to {HOROVOD_VARIABLES}"
    documented = _documented(page)
    horovod = _documented((DOCS / HOROVOD_VARIABLES.split("#")[0]).read_text(encoding="utf-8"))
    families = [n[:-1] for n in documented if n.endswith("*")]

    def named(name: str) -> bool:
        return name in documented or any(name.startswith(f) for f in families) \
            or (name.startswith("HOROVOD_") and name in horovod)

    missing, wrong = [], []
    for name, defaults in sorted(read_variables().items()):
        if name in SET_BY_HORO:
            continue
        if not named(name):
            missing.append(name)
        elif name in documented and not _default_matches(documented[name], defaults):
            wrong.append(f"{name}: the page says {documented[name]!r}, the code {sorted(defaults)}")
    assert not missing and not wrong, f"variables the code reads that configuration.md lacks: {missing}\n" \
        f"defaults that differ from the code's: {wrong}"


# ---- What the code says of the pages ----

#: A page named in the code's strings (messages, HINTs, docstrings): `docs/PAGE.md`, an optional `#anchor`, and
#: an optional section title in quotes after it (`docs/cluster.md, "Keys"`).
CODE_REF = re.compile(r"docs/([\w/-]+\.md)(?:#([\w-]+))?(?:,?\s*\(?[\"'“]([^\"'”]{3,80})[\"'”])?")


def _code_ref_problems(where: str, text: str) -> list[str]:
    problems = []
    for m in CODE_REF.finditer(text):
        page, anchor, section = DOCS / m.group(1), m.group(2), m.group(3)
        if not page.is_file():
            problems.append(f"{where}: {m.group(0)!r}: no page docs/{m.group(1)}")
            continue
        heads = [_plain(h) for h in _headings(page)]
        leads = [_plain(b) for b in re.findall(r"^[*-]? ?\*\*(.+?)\.?\*\*", FENCE.sub("", page.read_text(
            encoding="utf-8")), re.MULTILINE)]  # a paragraph's bold lead names a section too
        if anchor and anchor not in {_slug(h) for h in heads}:
            problems.append(f"{where}: {m.group(0)!r}: docs/{m.group(1)} has no section #{anchor}")
        if section and not any(h.startswith(_plain(section)) for h in heads + leads):
            problems.append(f"{where}: {m.group(0)!r}: docs/{m.group(1)} has no section {section!r}; its sections: "
                            f"{heads}")
    return problems


@pytest.mark.parametrize(("text", "ok"), [
    ('see docs/cluster.md, "Keys"', True),
    ("(docs/design-join.md, 'Threat model')", True),
    ("docs/configuration.md#horovods-names", True),
    ('(docs/multihost.md, "short engine tick")', False),
    ('docs/autotune.md, "The final check"', True),
    ("docs/no-such-page.md", False),
    ("docs/cluster.md#no-such-section", False),
])
def test_the_code_reference_check_is_precise(text: str, ok: bool) -> None:
    assert (not _code_ref_problems("probe", text)) is ok


def test_the_code_names_pages_and_sections_that_exist() -> None:
    """Error messages, HINTs and docstrings that send a reader to a page (and a section of it) name ones that
    exist."""
    problems = []
    for path in sorted((ROOT / "src" / "horo").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "docs/" in node.value:
                problems += _code_ref_problems(f"{path.relative_to(ROOT)}:{node.lineno}", node.value)
    assert not problems, "the code names pages or sections that do not exist:\n" + "\n".join(problems)


# ---- make demo, and status tables ----

def test_make_demo_runs_every_example() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    demo = makefile.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    left_out = sorted(p.name for p in (ROOT / "examples").glob("*.py") if f"examples/{p.name}" not in demo)
    assert not left_out, f"examples `make demo` does not run: {left_out}"


STATUS_HEADER = re.compile(r"^(?:status|tested on|tested)$", re.IGNORECASE)


@pytest.mark.parametrize("page", [p for p in sorted(q.relative_to(ROOT).as_posix() for q in DOCS.glob("*.md"))
                                  if p != "docs/support.md"])
def test_only_the_support_matrix_holds_a_status_table(page: str) -> None:
    headers = [line for line in (ROOT / page).read_text(encoding="utf-8").splitlines()
               if line.startswith("|") and any(STATUS_HEADER.match(c.strip()) for c in line.strip("|").split("|"))]
    assert not headers, f"{page} holds a status table ({headers[0]!r}): link to support.md instead"
