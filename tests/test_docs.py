"""The documentation's own checks: the project speaks of itself only, the README stays a product page, every
example is run somewhere, and the API reference covers every public module.

The site itself is built by ``make docs`` (strict: broken links and unreadable docstrings fail), which CI runs;
these checks are the cheap ones that belong in the default suite.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# What a reader of the project must never meet: traces of how it was developed. Each pattern is narrow enough
# to leave the project's own vocabulary alone (the engine's "rounds", helper functions, issue trackers of
# other projects written as owner/repo#N, paths inside an emulated host such as {state}/tmp/...).
FORBIDDEN: dict[str, re.Pattern[str]] = {
    "a numbered work session": re.compile(r"\bsessions? \d+", re.IGNORECASE),
    "a work period": re.compile(r"\bwork (?:period|session|round)s?\b", re.IGNORECASE),
    "a numbered round of work": re.compile(r"\bround \d+\b|\b(?:in|during|since|before|after|until|and) this round\b",
                                           re.IGNORECASE),
    "words to the project's lead": re.compile(r"\bthe lead\b", re.IGNORECASE),
    "a development helper": re.compile(r"\bhelpers? (?:sessions?|agents?|worktrees?|branch(?:es)?)\b|"
                                       r"\b(?:another|each|every|other) helper\b(?! (?:function|module|class|thread))",
                                       re.IGNORECASE),
    "an internal issue number": re.compile(r"\bissues? #?\d+\b", re.IGNORECASE),
    "a path of a development machine": re.compile(r"(?<![\w}.$/~-])/(?:tmp|work|check)/"),
    "an environment variable of the development machines": re.compile(r"\bOCI__\w+"),
    "a notes file of the development machines": re.compile(r"\bmeasured\.md\b"),
}

SCANNED_DIRS = ("docs", "src/horo", "tests", "examples", "tools")
SCANNED_FILES = ("README.md", "CHANGELOG.md", "Makefile", "pyproject.toml", "constraints.txt", "mkdocs.yml",
                 "MANIFEST.in", ".ci/run")
SKIPPED_PARTS = {"__pycache__", ".venv", ".venv-mpich", "site", "dist", "build"}
THIS_FILE = Path(__file__).resolve()


def _scanned() -> list[Path]:
    files = [ROOT / f for f in SCANNED_FILES if (ROOT / f).is_file()]
    for d in SCANNED_DIRS:
        for p in sorted((ROOT / d).rglob("*")):
            if p.is_file() and not SKIPPED_PARTS.intersection(p.relative_to(ROOT).parts) \
                    and not any(part.endswith(".egg-info") for part in p.parts) and p.resolve() != THIS_FILE:
                files.append(p)
    return files


def _text(p: Path) -> str | None:
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:  # images and other binary files
        return None


def test_the_project_speaks_of_itself_only() -> None:
    found = []
    for p in _scanned():
        text = _text(p)
        if text is None:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for what, pattern in FORBIDDEN.items():
                m = pattern.search(line)
                if m:
                    found.append(f"{p.relative_to(ROOT)}:{n}: {what}: {m.group(0)!r} in {line.strip()[:120]!r}")
    assert not found, "text about the project's development, not the project:\n" + "\n".join(found)


@pytest.mark.parametrize(("line", "caught"), [
    ("Measured in session 12 (2026-11-24).", True),
    ("Sessions 9 and 10 found it.", True),
    ("## README text (for the lead to merge)", True),
    ("the target of issue 15", True),
    ("(issue #18)", True),
    ("scripts in /tmp/s13 (not kept)", True),
    ("cd /work/main && make", True),
    ("os.environ.get('OCI__SYNC_DIR')", True),
    ("it was not built in this round", True),
    ("another helper landed it", True),
    ("from the next round on, every rank tunes", False),  # the engine's rounds
    ("this round's choice, read from rank 0", False),
    ("Helpers shared by the tests in tests/mpi", False),
    ("a per-rank helper thread", False),
    ("open-mpi/ompi#13261", False),
    ("f'{bed.state}/tmp/node3'", False),
    ("$TMPDIR/ompi.<pid>", False),
    ("the rounding of integer averages", False),
])
def test_the_text_check_is_precise(line: str, caught: bool) -> None:
    assert any(p.search(line) for p in FORBIDDEN.values()) is caught


def test_readme_is_a_product_page() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines. HINT: details belong in docs/."
    head = "\n".join(lines[:60])
    assert "pip install" in head, "install must be on the README's first screen"


def test_readme_links_resolve() -> None:
    """The README is read outside the site (the repository's front page, the package's description): its
    relative links must name files that exist."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\((?!https?://|#)([^)#\s]+)", text)
    assert targets, "the README links to nothing"
    missing = sorted({t for t in targets if not (ROOT / t).exists()})
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_every_example_is_run() -> None:
    """Examples are templates users copy: each one runs in the suite or in ``make demo``."""
    runners = [(ROOT / "Makefile").read_text(encoding="utf-8")]
    runners += [p.read_text(encoding="utf-8") for p in (ROOT / "tests").rglob("*.py") if p.resolve() != THIS_FILE]
    unrun = [p.name for p in sorted((ROOT / "examples").glob("*.py"))
             if not any(f"examples/{p.name}" in r or f'"{p.name}"' in r for r in runners)]
    assert not unrun, f"examples run by no test and not by `make demo`: {unrun}"


@pytest.mark.parametrize("module", ["horo", "horo.keras", "horo.tensorflow", "horo.torch", "horo.lightning",
                                    "horo.jax", "horo.elastic", "horo.spark"])
def test_api_reference_covers(module: str) -> None:
    pages = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "docs" / "api").glob("*.md"))
    assert re.search(rf"^::: {re.escape(module)}$", pages, re.MULTILINE), f"no API reference page for {module}"


def test_facade_exports_are_spelled_out() -> None:
    """The API reference's generator reads ``__all__`` statically: horo._facade lists the shared names."""
    import horo._facade
    import horo.core

    assert horo._facade.__all__ == horo.core.SHARED
