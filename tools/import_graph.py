"""Print the import graph of ``src/horo`` and look for cycles in it.

Reads the source only (``ast``): nothing is imported. Every ``import`` of a ``horo`` module is an edge, at module
level or inside a function; ``--module-level`` counts only the ones that run when the module is imported, and
``if TYPE_CHECKING:`` blocks never count (they never run). A package's ``__init__`` is a module of its own, and
``from .pkg import name`` depends on ``pkg/__init__.py`` (and on ``pkg/name.py`` when that is a module).

Exit status 1 when a cycle exists, so ``make test`` can run it.

    python tools/import_graph.py            # every import, the graph and the cycles
    python tools/import_graph.py --module-level
    python tools/import_graph.py --quiet    # cycles only
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


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement with whether it runs at import time (not inside a function)."""

    def walk(node: ast.AST, in_function: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
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
    hit = _resolve(source, modules)
    if hit:
        out.add(hit)
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        if sub in modules:
            out.add(sub)
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

    An edge from a module to a package it sits in (``horo.core.x`` -> ``horo.core``) is not counted: Python
    has already imported every enclosing package before the module runs, so such an import cannot start a
    circle; the reverse edges (a package importing its own modules) are the ordinary ones.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def succ(v: str) -> set[str]:
        return edges[v] - _ancestors(v)

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(succ(v)):
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
    return status


if __name__ == "__main__":
    sys.exit(main())
