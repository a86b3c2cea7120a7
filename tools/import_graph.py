"""Print the import graph of ``src/horo``, look for cycles in it, and check where horo modules are imported.

Reads the source only (``ast``): nothing is imported. Every ``import`` of a ``horo`` module is an edge: at module
level, inside a function, or under ``if TYPE_CHECKING:``; ``--module-level`` counts only the ones that run when
the module is imported. A package's ``__init__`` is a module of its own; ``from .pkg import name`` depends on
``pkg/__init__.py`` when ``name`` is defined there, on ``pkg/name.py`` when that is a module.

The rule checked besides: a horo module is imported at module level, never inside a function, except one that
loads a heavy optional dependency (a framework, CuPy, matplotlib, scikit-learn) when imported, and then with a
``# lazy: <why>`` comment on the import (or the line above it). Dynamic imports (``importlib.import_module``,
``__import__``) need that comment too, unless they name a module outside horo. ``TYPE_CHECKING`` imports count
as imports inside functions: the layers make them needless.

Exit status 1 on a cycle or a broken rule, so ``make test`` can run it (tests/test_layers.py).

    python tools/import_graph.py            # the graph, its cycles (every import, then module level), the rule
    python tools/import_graph.py --quiet    # cycles and rule breaks only
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "src"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


#: Third-party packages too heavy (or too optional) to import with horo itself.
HEAVY = frozenset({"torch", "tensorflow", "keras", "jax", "jaxlib", "cupy", "pytorch_lightning", "lightning",
                   "lightning_fabric", "matplotlib", "sklearn", "scipy", "ray"})
#: horo's framework facades: each imports its framework, some through a function they call when imported.
FACADES = ("horo.keras", "horo.tensorflow", "horo.torch", "horo.jax", "horo.strategies", "horo.lightning",
           "horo.callbacks")
LAZY_MARK = "# lazy:"


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement with whether it runs at import time (not inside a function)."""

    def walk(node: ast.AST, in_function: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for sub in child.body:  # never runs: an edge all the same, not a module-level one
                    yield from walk(ast.Module(body=[sub], type_ignores=[]), True)
                for sub in child.orelse:
                    yield from walk(ast.Module(body=[sub], type_ignores=[]), in_function)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, not in_function
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from walk(child, True)
            else:
                yield from walk(child, in_function)

    yield from walk(tree, False)


def _resolve(name: str, modules: set[str]) -> str | None:
    """The longest prefix of ``name`` that is a horo module."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def targets(node: ast.Import | ast.ImportFrom, me: str, package: bool, modules: set[str]) -> set[str]:
    out: set[str] = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] == "horo":
                hit = _resolve(alias.name, modules)
                if hit:
                    out.add(hit)
        return out
    if node.level:
        base = me.split(".") if package else me.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    if source.split(".")[0] != "horo":
        return out
    subs = {f"{source}.{alias.name}" for alias in node.names} & modules
    out |= subs
    if len(subs) < len(node.names):  # a name read from the module itself, not only its submodules
        hit = _resolve(source, modules)
        if hit:
            out.add(hit)
    return out


def graph(root: Path = ROOT, module_level: bool = False) -> dict[str, set[str]]:
    files = {module_name(p, root): p for p in sorted((root / "horo").rglob("*.py"))}
    modules = set(files)
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for me, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        for node, top in imports(tree):
            if module_level and not top:
                continue
            edges[me] |= targets(node, me, is_package(path), modules) - {me}
    return edges


def _ancestors(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted.

    A module that reads names from a package it sits in (``from . import Compression`` in ``horo.x.y``) while
    that package imports it is a circle like any other: it sees the package half made, and works only as long
    as the package happens to define the name first. ``from . import y`` names a submodule, an edge to it alone
    (:func:`targets`).
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


def _externals(node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.Import):
        return {a.name.split(".")[0] for a in node.names}
    return set() if node.level or not node.module else {node.module.split(".")[0]}


def heavy_modules(root: Path = ROOT) -> set[str]:
    """The horo modules whose import (theirs, an enclosing package's or a module-level dependency's) imports a
    :data:`HEAVY` package."""
    files = {module_name(p, root): p for p in sorted((root / "horo").rglob("*.py"))}
    modules = set(files)
    deps: dict[str, set[str]] = {}
    heavy = {m for m in modules if any(m == f or m.startswith(f + ".") for f in FACADES)}
    for me, path in files.items():
        deps[me] = _ancestors(me) & modules
        for node, top in imports(ast.parse(path.read_text(), str(path))):
            if not top:
                continue
            if _externals(node) & HEAVY:
                heavy.add(me)
            deps[me] |= targets(node, me, is_package(path), modules) - {me}
    changed = True
    while changed:
        changed = False
        for me, ds in deps.items():
            if me not in heavy and ds & heavy:
                heavy.add(me)
                changed = True
    return heavy


def rule_breaks(root: Path = ROOT) -> list[str]:
    """Function-level (or TYPE_CHECKING) imports of horo modules that break the rule, and unmarked dynamic ones."""
    files = {module_name(p, root): p for p in sorted((root / "horo").rglob("*.py"))}
    modules = set(files)
    heavy = heavy_modules(root)
    out: list[str] = []
    for me, path in files.items():
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text, str(path))

        def marked(node: ast.AST, lines: list[str] = lines) -> bool:
            here = lines[node.lineno - 1:node.end_lineno]  # type: ignore[attr-defined]
            above = lines[node.lineno - 2] if node.lineno > 1 else ""
            return any(LAZY_MARK in ln for ln in here) or above.strip().startswith(LAZY_MARK)

        where = f"{path.relative_to(root.parent) if root.parent in path.parents else path}"
        for node, top in imports(tree):
            hits = targets(node, me, is_package(path), modules) - {me}
            if top or not hits:
                continue
            light = sorted(h for h in hits if h not in heavy and not any(h in _ancestors(x) for x in hits - {h}))
            if light:
                out.append(f"{where}:{node.lineno}: imports {', '.join(light)} inside a function (or under "
                           "TYPE_CHECKING): import it at module level")
            elif not marked(node):
                out.append(f"{where}:{node.lineno}: a lazy import of {', '.join(sorted(hits))} needs a "
                           f"'{LAZY_MARK} <why>' comment")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
                arg = node.args[0] if node.args else None
                named = isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                if name in ("import_module", "__import__") and not (named and not arg.value.startswith("horo")) \
                        and not marked(node):
                    out.append(f"{where}:{node.lineno}: a dynamic import needs a '{LAZY_MARK} <why>' comment")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module-level", action="store_true", help="only imports that run at import time")
    parser.add_argument("--quiet", action="store_true", help="print the cycles only")
    parser.add_argument("--root", type=Path, default=ROOT, help="the folder holding the horo package")
    args = parser.parse_args(argv)
    status = 0
    for module_level in ([True] if args.module_level else [False, True]):
        edges = graph(args.root, module_level)
        what = "module-level imports" if module_level else "all imports (module level and inside functions)"
        if not args.quiet:
            print(f"# {what}: {len(edges)} modules, {sum(map(len, edges.values()))} edges")
            for m in sorted(edges):
                print(f"{m} -> {', '.join(sorted(edges[m])) or '-'}")
        found = cycles(edges)
        for comp in found:
            print(f"cycle ({what}): {' <-> '.join(comp)}")
        if not found:
            print(f"no cycle ({what})")
        status |= bool(found)
    breaks = [] if args.module_level else rule_breaks(args.root)
    for line in breaks:
        print(f"rule: {line}")
    if not args.module_level and not breaks:
        print("no function-level import of a horo module without a reason")
    return status | bool(breaks)


if __name__ == "__main__":
    sys.exit(main())
