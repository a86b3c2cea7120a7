"""The documentation's own checks: the project speaks of itself only, the README stays a product page, every
example is run somewhere, and the API reference covers every public module.

The site itself is built by ``make docs`` (strict: broken links and unreadable docstrings fail), which CI runs;
these checks are the cheap ones that belong in the default suite.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
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

SCANNED_DIRS = ("docs", "src/horo", "tests", "examples", "tools", "compat")
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
                                    "horo.jax", "horo.elastic", "horo.ray", "horo.spark"])
def test_api_reference_covers(module: str) -> None:
    pages = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "docs" / "api").glob("*.md"))
    assert re.search(rf"^::: {re.escape(module)}$", pages, re.MULTILINE), f"no API reference page for {module}"


def test_facade_exports_are_spelled_out() -> None:
    """The API reference's generator reads ``__all__`` statically: horo._facade lists the shared names."""
    import horo._facade
    import horo.core

    assert horo._facade.__all__ == horo.core.SHARED


# ---- The guides: what a user reads must be short, current, consistent with the measurements, and runnable ----

BENCHMARKS = ROOT / "docs" / "benchmarks.md"
GUIDE_MAX_LINES = 150
#: Sections of mkdocs.yml's nav whose pages are not guides: internals, generated reference, the figures' page.
NOT_GUIDES = {"Design notes", "API reference"}
NOT_GUIDE_PAGES = {"benchmarks.md", "contributing.md"}


def _nav_pages() -> list[tuple[str, str]]:
    """(top-level nav section, page) for every page of mkdocs.yml's nav, read without a YAML parser."""
    pages, section, in_nav = [], "", False
    for line in (ROOT / "mkdocs.yml").read_text(encoding="utf-8").splitlines():
        if line.startswith("nav:"):
            in_nav = True
            continue
        if in_nav and line and not line.startswith(" "):
            break
        m = re.match(r"^(\s*)- ([^:]+):\s*(\S*)$", line) if in_nav else None
        if not m:
            continue
        if len(m.group(1)) == 2:
            section = m.group(2)
        if m.group(3).endswith(".md"):
            pages.append((section, m.group(3)))
    return pages


def _guides() -> list[Path]:
    return [ROOT / "docs" / page for section, page in _nav_pages()
            if section not in NOT_GUIDES and page not in NOT_GUIDE_PAGES]


#: Words that tell how the project got here instead of what is true now. Each is narrow enough to leave
#: legitimate uses alone ("is used to", "before the first step", "the best setting so far", "Horovod no longer
#: installs"); tests/test_docs.py checks both kinds of line below.
HISTORY: dict[str, re.Pattern[str]] = {
    "used to (of the past)": re.compile(r"(?<!\bis )(?<!\bare )(?<!\bbe )(?<!\bbeen )(?<!\bwas )(?<!\bwere )"
                                        r"(?<!\bget )(?<!\bgot )\bused to\b", re.IGNORECASE),
    "an earlier state of the code": re.compile(r"\b(?:the|horo's|its|an) earlier (?:code|order|version|behaviou?r|"
                                               r"implementation|design)\b", re.IGNORECASE),
    "Before, (a sentence about the past)": re.compile(r"(?:^|[.!?:;]\s+|\(\s*)Before,"),
    "a report of trying": re.compile(r"\b(?:tried|measured|ran) (?:here|on this machine)\b|\bthis project's\b|"
                                     r"\bwere tried\b", re.IGNORECASE),
    "a load average as a story": re.compile(r"\bload average (?:at|of|was) \d|\bkept its load\b", re.IGNORECASE),
    "a moment of the work": re.compile(r"\bin the same hour\b|\bsite note\b|\bbuilding the bed\b|"
                                       r"\buntil this was\b|\bhung on the\b|\bonce hung\b", re.IGNORECASE),
    "a change of behaviour": re.compile(r"\b(?:horo|hororun|it|this) (?:no longer|now does|used to)\b|"
                                        r"\b(?:lent|available|run|tested) so far\b|\bseed \d{3}\b|\bnow also\b",
                                        re.IGNORECASE),
    "a fix told as history": re.compile(r"\b(?:were|was) in the way\b|\bbugs?\b[^.]*\b(?:are|were|was) fixed\b|"
                                        r"\bwas fixed\b|\b(?:the|its) old code\b|\bthe code without (?:it|its|this)\b|"
                                        r"\btried and dropped\b|\btried first\b|\bwas tried\b|"
                                        r"\b(?:first|earlier|old|previous) version of the (?:test|code)\b|"
                                        r"\b(?:pass|passes|works?) again\b", re.IGNORECASE),
    "who had which machine": re.compile(r"\bno \w+(?: \w+){0,4} (?:was|were) available\b|"
                                        r"\b(?:was|were) not available\b|\buntested here\b", re.IGNORECASE),
    "a before and after": re.compile(r"\bwent (?:from )?[-+]?\d|\bas before\b", re.IGNORECASE),
}


@pytest.mark.parametrize(("line", "caught"), [
    ("Before, the job hung.", True),
    ("naming the ranks. Before, the job hung.", True),
    ("(a reduce op passed there, horo's earlier order, is still taken as `op`)", True),
    ("`tests/mpi/test_gpu_staged.py` hung on the earlier code", True),
    ("Three ways to exchange inside `jit` were tried on this machine", True),
    ("while other jobs kept its load average at 19", True),
    ("In the same hour the Keras bench's exchange took 3.1 ms", True),
    ("A site note from building the bed: SLURM's PMIx plugin", True),
    ("hororun no longer passes `--oversubscribe`", True),
    ("horo used to hang here", True),
    ("the one GPU lent so far", True),
    ("Do not scale it (seed 004 does exactly that).", True),
    ("Measured on this project's 2-core machine", True),
    ("variables are broadcast before the first step", False),
    ("the best setting so far, as Horovod chains its knobs", False),
    ("Horovod no longer installs with TensorFlow 2.16", False),
    ("the wheel is used to build the venv", False),
    ("an earlier layer of the model", False),
    ("the load average is given with each run", False),
    ("Before an eager collective horo calls jax.effects_barrier()", False),
    ("Two bugs were in the way and are fixed: elastic mode did not pass", True),
    ("A 1 ms grace was tried first. In one run of four it lost ~18 µs", True),
    ("call for any array (it used to take the general path above 64 KiB)", True),
    ("| several GPUs | not run: no machine with two GPUs was available |", True),
    ("**Not run: no Kubernetes cluster was available.**", True),
    ("each fails on the code without its fix", True),
    ("and fails on the old code in every trial", True),
    ("### Tried and dropped: a blocking exchange", True),
    ("`repeat.run` at one rank went 3.42 → 2.09 µs", True),
    ("Everything that notifies the engine now also counts", True),
    ("the caller waits for it as before, so work", True),
    ("Untested here (no GPU cluster).", True),
    ("and the first version of the test failed once on that order", True),
    ("After the core was split into layers all 16 runs pass again, slower", True),
    ("the first version of the file format is read as well", False),
    ("a rank that passes the barrier again waits for the next round", False),
    ("the name no longer waits, so no record outlives it", False),
    ("names that are not cached yet (first use)", False),
    ("the order is fixed at init and the sizes are fixed", False),
    ("when a GPU is available, each rank takes its own", False),
    ("a 4 MiB in-place call slowed down ~5x (452 → 2337 µs)", False),
])
def test_the_history_check_is_precise(line: str, caught: bool) -> None:
    assert any(p.search(line) for p in HISTORY.values()) is caught


def _history_pages() -> list[str]:
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p.relative_to(ROOT).as_posix() for p in pages]


@pytest.mark.parametrize("page", _history_pages())
def test_the_pages_state_what_is_true_now(page: str) -> None:
    """Every page, guides and design notes alike: how things work and what is tested, not how they came to be."""
    found = []
    for n, line in enumerate((ROOT / page).read_text(encoding="utf-8").splitlines(), 1):
        for what, pattern in HISTORY.items():
            m = pattern.search(line)
            if m:
                found.append(f"{page}:{n}: {what}: {m.group(0)!r} in {line.strip()[:100]!r}")
    assert not found, "a page narrates the project's history; state what is true now:\n" + "\n".join(found)


def test_the_guides_are_short() -> None:
    guides = _guides()
    assert {p.name for p in guides} >= {"keras.md", "torch-lightning.md", "pytorch.md", "tensorflow.md", "jax.md",
                                        "migrating.md", "cluster.md", "elastic.md", "nccl.md", "troubleshooting.md"}
    long = {p.name: n for p in guides if (n := len(p.read_text(encoding="utf-8").splitlines())) > GUIDE_MAX_LINES}
    assert not long, f"guides over {GUIDE_MAX_LINES} lines: {long}. HINT: internals go to a design-*.md page."


# A figure is a measured number: a ratio (a number, or a range of two, followed at once by x or ×: 1.30x,
# 0.82-0.91x; not 4x1024 or 2x2, which are shapes) or a decimal with a unit of time, rate or share (23.8 µs,
# 0.6-1.0 ms, 99.5 %). Code spans and blocks are left out: they hold commands and printed output, not figures.
_NUM = r"\d+(?:\.\d+)?"
FIGURE = re.compile(rf"(?<![\w.]){_NUM}(?:\s?[-–]\s?{_NUM})?[x×](?![\w])|"
                    rf"(?<![\w.])\d+\.\d+(?:\s?[-–]\s?\d+\.\d+)?\s?(?:ms|µs|us|ns|s|%|MB/s|GB/s|MiB/s|GiB/s|"
                    rf"samples/s)(?![\w/])")


def _prose(text: str) -> str:
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", text)


@pytest.mark.parametrize(("text", "figures"), [
    ("HoroStrategy 0.76x and without overlap 0.71x", ["0.76x", "0.71x"]),
    ("0.82-0.91x of the flat one, 1.81x faster", ["0.82-0.91x", "1.81x"]),
    ("+2.8 µs at 64 B; 0.6-1.0 ms (8-13 % of the step)", ["2.8 µs", "0.6-1.0 ms"]),
    ("MLP 4x1024 on 2x2 hosts, 3 hosts x 1 rank, x86_64", []),
    ("a heartbeat every 6 s, a warning after 60 s", []),
    ("`same parameters as one process on 2x the batch: True`", []),
])
def test_the_figure_check_is_precise(text: str, figures: list[str]) -> None:
    assert [m.group(0) for m in FIGURE.finditer(_prose(text))] == figures


def test_every_figure_of_a_guide_is_on_the_benchmarks_page() -> None:
    """Figures live once, in docs/benchmarks.md, with their command, machine, date and commit."""
    bench = BENCHMARKS.read_text(encoding="utf-8")
    missing = []
    for p in [ROOT / "README.md", *_guides()]:
        for m in FIGURE.finditer(_prose(p.read_text(encoding="utf-8"))):
            for num in re.findall(_NUM, m.group(0)):
                if not re.search(rf"(?<![\d.]){re.escape(num)}(?![\d])", bench):
                    missing.append(f"{p.relative_to(ROOT)}: {m.group(0)!r}")
    assert not missing, "figures that docs/benchmarks.md does not hold (link to it instead):\n" + "\n".join(missing)


def test_every_benchmark_table_says_when_and_where() -> None:
    """Each section of docs/benchmarks.md with figures names its run: command, machine, date and commit."""
    sections = re.split(r"^## ", BENCHMARKS.read_text(encoding="utf-8"), flags=re.MULTILINE)[1:]
    for section in sections:
        title = section.splitlines()[0]
        if "| --: |" not in section and "--:|" not in section and "| result |" not in section:
            continue  # no table of figures (the machines, how figures are taken)
        assert re.search(r"\| 20\d\d-\d\d-\d\d \| [0-9a-f]{7}", section), f"'{title}': no run row with date and commit"


# Install lines: the distribution is horo-mpi. `pip install horo` installs an unrelated project, and `.[extra]`
# works only inside a checkout, so error messages and guides name horo-mpi; the pages that say how to
# install from a checkout may show `'.[extra]'`.
BAD_INSTALL: dict[str, re.Pattern[str]] = {
    "pip install horo": re.compile(r"pip install\s+(?:-\S+\s+)*['\"]?horo(?![\w-])"),
    "a horo[extra] requirement": re.compile(r"['\"`(\s]horo\[[\w,-]+\]"),
    "a .[extra] hint": re.compile(r"['\"]\.\[[\w,-]+\]['\"]"),
}
CHECKOUT_INSTALL_PAGES = {"README.md", "docs/install.md", "docs/contributing.md", "Makefile"}


@pytest.mark.parametrize(("line", "caught"), [
    ("HINT: pip install 'horo[autotune]'", True),
    ("HINT: pip install horo[lightning]", True),
    ("(pip install horo) or drop --min-np", True),
    ("needs tf_keras ('horo[tf-keras]')", True),
    ("pip install '.[tensorflow]'", True),
    ("HINT: pip install 'horo-mpi[autotune]'", False),
    ("pip install --find-links dist 'horo-mpi[torch]'", False),
    ("t, d = horo[\"trainer\"], ddp[\"trainer\"]", False),
    ("pip install horovod", False),
])
def test_the_install_check_is_precise(line: str, caught: bool) -> None:
    assert any(p.search(line) for p in BAD_INSTALL.values()) is caught


def test_every_install_line_names_the_distribution() -> None:
    found = []
    files = [ROOT / "README.md", ROOT / "Makefile", *(ROOT / "docs").rglob("*.md")]
    files += [p for d in ("src/horo", "tests", "examples") for p in (ROOT / d).rglob("*.py")
              if p.resolve() != THIS_FILE]
    for p in files:
        rel = str(p.relative_to(ROOT))
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            for what, pattern in BAD_INSTALL.items():
                if what == "a .[extra] hint" and rel in CHECKOUT_INSTALL_PAGES:
                    continue
                if pattern.search(line):
                    found.append(f"{rel}:{n}: {what}: {line.strip()[:110]!r}")
    assert not found, "install lines must name the distribution horo-mpi:\n" + "\n".join(found)


# Every code block of a guide (and of the README) says how it is exercised, on the line before it:
#   <!-- runs in: PATH[, PATH] -->   an example or test that runs it (examples must be run by the suite);
#   <!-- needs: WHAT -->             what it needs that the suite does not have (a GPU, several hosts, ...).
# Blocks without a language are printed output or formulas.
MARKER = re.compile(r"^<!-- (runs in|needs): (.+?) -->$")
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks(p: Path) -> list[tuple[str, str, str]]:
    """(marker line, language, code) for every fenced block with a language."""
    text = p.read_text(encoding="utf-8")
    out = []
    for m in BLOCK.finditer(text):
        before = [ln for ln in text[:m.start()].splitlines() if ln.strip()]
        out.append((before[-1] if before else "", m.group(1), m.group(2)))
    return out


def test_every_snippet_is_run_or_says_what_it_needs() -> None:
    runners = [(ROOT / "Makefile").read_text(encoding="utf-8")]
    runners += [t.read_text(encoding="utf-8") for t in (ROOT / "tests").rglob("*.py") if t.resolve() != THIS_FILE]
    problems = []
    for p in [ROOT / "README.md", *_guides()]:
        for marker, lang, code in _blocks(p):
            where = f"{p.relative_to(ROOT)}: the {lang} block starting {code.splitlines()[0][:50]!r}"
            m = MARKER.match(marker.strip())
            if not m:
                problems.append(f"{where}: no <!-- runs in: ... --> or <!-- needs: ... --> line before it")
                continue
            if m.group(1) == "needs":
                continue
            for path in (s.strip() for s in m.group(2).split(",")):
                if not (ROOT / path).is_file():
                    problems.append(f"{where}: {path} does not exist")
                elif path.startswith("examples/") and not any(path in r or f'"{Path(path).name}"' in r
                                                               for r in runners):
                    problems.append(f"{where}: {path} is run by no test and not by make demo")
                elif path.startswith("examples/") and lang == "python":
                    example = (ROOT / path).read_text(encoding="utf-8")
                    names = set(re.findall(r"\bhvd\.([A-Za-z_]\w*)", code))
                    absent = sorted(n for n in names if f"hvd.{n}" not in example)
                    if absent:
                        problems.append(f"{where}: uses hvd.{', hvd.'.join(absent)}, which {path} does not")
    assert not problems, "\n".join(problems)


# ---- The snippets tests/test_docs.py runs itself ----

JOB_TIMEOUT = 240.0


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    return env


def _launch_line(line: str) -> list[str]:
    """A guide's `hororun ... python X` line as this interpreter runs it (hororun is `python -m horo.run`)."""
    words = line.split("#", 1)[0].split()
    assert words[0] == "hororun", line
    return [sys.executable, "-m", "horo.run", *[sys.executable if w == "python" else w for w in words[1:]]]


def _block(p: Path, containing: str, lang: str) -> str:
    return next(code for _, lg, code in _blocks(p) if lg == lang and containing in code)


@pytest.mark.mpi
@pytest.mark.timeout(2 * JOB_TIMEOUT)
def test_the_readme_quick_start_runs(tmp_path: Path) -> None:
    """The quick start's smoke run, as a reader types it in the checkout (the install lines are the wheel
    test's, tests/test_packaging.py)."""
    block = _block(ROOT / "README.md", "examples/collectives_demo.py", "bash")
    lines = [ln for ln in block.splitlines() if ln.startswith("hororun")]
    assert len(lines) == 2, lines
    for line in lines:
        res = subprocess.run(_launch_line(line), cwd=ROOT, env=_env(), capture_output=True, text=True,
                             timeout=JOB_TIMEOUT)
        out = res.stdout + res.stderr
        assert res.returncode == 0, out[-4000:]
        if "--check-build" in line:
            assert "Available frameworks:" in out and "[X] MPI" in out, out[-4000:]
        else:
            ranks = re.findall(r"rank (\d)/2: average=\[1.5, 1.5, 1.5, 1.5\]", out)
            assert sorted(ranks) == ["0", "1"], out[-4000:]


@pytest.mark.mpi
@pytest.mark.timeout(JOB_TIMEOUT + 30)
def test_the_migration_guides_script_runs_once_migrated(tmp_path: Path) -> None:
    """docs/migrating.md's whole Horovod script, with the guide's diff applied, trains on 2 ranks."""
    guide = ROOT / "docs" / "migrating.md"
    script = _block(guide, "import horovod.torch as hvd", "python")
    diff = _block(guide, "-import horovod.torch as hvd", "diff").splitlines()
    pairs = [(a[1:], b[1:]) for a, b in zip(diff, diff[1:]) if a.startswith("-") and b.startswith("+")]
    assert len(pairs) == 2, diff
    for old, new in pairs:
        if old.startswith("import"):
            assert old in script
            script = script.replace(old, new)
    launch = next(new for old, new in pairs if new.startswith("hororun"))
    (tmp_path / "train.py").write_text(script)
    res = subprocess.run(_launch_line(launch), cwd=tmp_path, env=_env(), capture_output=True, text=True,
                         timeout=JOB_TIMEOUT)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert re.search(r"^epoch 2: loss \d", out, re.MULTILINE), out[-4000:]


@pytest.mark.mpi
@pytest.mark.timeout(JOB_TIMEOUT + 30)
def test_a_stack_dump_of_every_rank_on_a_signal(tmp_path: Path) -> None:
    """docs/troubleshooting.md: the two lines in the script, SIGUSR1 to the job's mpiexec, and every rank of a
    job stuck in a collective prints its stacks; the job then goes on."""
    guide = ROOT / "docs" / "troubleshooting.md"
    setup = _block(guide, "faulthandler.register", "python")
    go = tmp_path / "go"
    (tmp_path / "train.py").write_text(setup + f"""
import os, time
import numpy as np
import horo

horo.init()
print("ready", horo.rank(), flush=True)
if horo.rank() == 1:
    while not os.path.exists({str(go)!r}):   # rank 1 keeps rank 0 waiting in the allreduce
        time.sleep(0.1)
print("sum", horo.allreduce(np.ones(2), op=horo.Sum).tolist(), flush=True)
""")
    launch = next(ln for ln in _block(guide, "kill -USR1", "bash").splitlines() if ln.startswith("hororun"))
    assert "--tag-output" in launch
    cmd = _launch_line(launch.replace(" &", ""))
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        lines: list[str] = []
        deadline = time.monotonic() + JOB_TIMEOUT
        while sum("ready" in ln for ln in lines) < 2 and time.monotonic() < deadline:
            lines.append(proc.stdout.readline())  # type: ignore[union-attr]
        time.sleep(1.0)  # rank 0 is now inside the allreduce
        # The job's mpiexec is hororun's child (the guide finds it with pgrep -f; here the child of this job).
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert children, "hororun started no mpiexec"
        for pid in children:
            os.kill(int(pid), signal.SIGUSR1)
        # Each rank's whole dump: rank 1's main thread (in its wait loop), rank 0's inside the allreduce.
        wanted = [re.compile(r"^\[1,1\]<stderr>:.*line \d+ in <module>"),
                  re.compile(r"^\[1,0\]<stderr>:.* in allreduce$")]
        while not all(any(w.match(ln) for ln in lines) for w in wanted) and time.monotonic() < deadline:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if not line:
                break
            lines.append(line.rstrip("\n") + "\n")
        go.touch()
        out = "".join(lines) + proc.communicate(timeout=JOB_TIMEOUT)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-4000:]
    for rank in (0, 1):
        assert re.search(rf"^\[1,{rank}\]<stderr>:.*most recent call first", out, re.MULTILINE), out[-4000:]
    assert re.search(r"^\[1,0\]<stderr>:.* in allreduce$", out, re.MULTILINE), out[-4000:]
    assert out.count("sum [2.0, 2.0]") == 2, out[-4000:]
