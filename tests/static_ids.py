"""The test ids of a test file, worked out without importing or running it.

The documentation names tests (``tests/test_x.py::test_name[id]``) as the evidence for what it claims, and
tests/test_support_matrix.py checks that every test named exists. Importing the test files would import
every framework (minutes on a small machine) and running them is the suite's job, so this module reads them
with :mod:`ast`: test functions and ``Test*`` classes' test methods, their ``@pytest.mark.parametrize``
ids as pytest builds them (values, ``ids=`` lists or callables, ``pytest.param(..., id=)``, stacked
decorators), and which cases are marked ``slow``. Argument values are evaluated with the module's own
top-level constants in scope; where that fails (a value computed at import time from the machine), or where a
test takes a fixture with ``params``, its ids are unknown (None) and only its name can be cited.
"""

from __future__ import annotations

import ast
import builtins
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Case", "collect"]


@dataclass(frozen=True)
class Case:
    """One collected case: its id inside the brackets ("" when not parametrized) and whether it is slow."""

    id: str
    slow: bool


class _Mark:
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> _Mark:
        return self


class _Marks:
    def __getattr__(self, name: str) -> _Mark:
        return _Mark(name)


class _Param:
    def __init__(self, *values: Any, marks: Any = (), id: str | None = None) -> None:  # noqa: A002 - pytest's name
        self.values, self.id = values, id
        marks = marks if isinstance(marks, (list, tuple)) else [marks]
        self.slow = any(getattr(m, "name", "") == "slow" for m in marks)


class _Pytest:
    """What a module-level value or a parametrize argument may use of pytest."""

    mark = _Marks()
    param = _Param


_BUILTINS = {name: getattr(builtins, name) for name in (
    "range", "len", "str", "int", "float", "bool", "list", "tuple", "dict", "set", "zip", "enumerate", "sorted",
    "reversed", "min", "max", "any", "all", "map")}


class _Unknown(Exception):
    """An id pytest would build from something this module cannot evaluate."""


def _eval(node: ast.expr, scope: dict[str, Any]) -> Any:
    try:
        code = compile(ast.Expression(node), "<test file>", "eval")
        # One namespace (globals): a comprehension's body does not see eval's separate locals.
        return eval(code, {**scope, "__builtins__": _BUILTINS, "pytest": _Pytest})  # noqa: S307 - the repository's own tests
    except Exception as exc:  # noqa: BLE001 - anything not computable from the file alone
        raise _Unknown(ast.unparse(node)) from exc


def _module_scope(tree: ast.Module) -> dict[str, Any]:
    """The module's top-level constants that evaluate from the file alone, in order."""
    scope: dict[str, Any] = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign) and node.value is not None else []
        for target in targets:
            if isinstance(target, ast.Name):
                try:
                    scope[target.id] = _eval(node.value, scope)  # type: ignore[union-attr, arg-type]
                except _Unknown:
                    scope.pop(target.id, None)
    return scope


def _is_mark(node: ast.expr, name: str) -> bool:
    """``pytest.mark.NAME``, called or not."""
    node = node.func if isinstance(node, ast.Call) else node
    return isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.value, ast.Attribute) \
        and node.value.attr == "mark"


def _marked_slow(nodes: list[ast.expr]) -> bool:
    return any(_is_mark(n, "slow") or any(_is_mark(e, "slow") for e in getattr(n, "elts", [])) for n in nodes)


def _pytestmark(body: list[ast.stmt]) -> list[ast.expr]:
    for node in body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return [node.value]
    return []


def _value_id(value: Any, argname: str, index: int) -> str:
    """pytest's default id of one argument value."""
    if isinstance(value, (str, int, float, bool, complex)) or value is None:
        return str(value)
    return f"{argname}{index}"


def _parametrize(call: ast.Call, scope: dict[str, Any]) -> list[tuple[str, bool]]:
    """(id, slow) for each parameter set of one ``@pytest.mark.parametrize(...)``."""
    args = {**dict(zip(("argnames", "argvalues"), call.args)), **{k.arg: k.value for k in call.keywords if k.arg}}
    names = _eval(args["argnames"], scope)
    names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
    values = list(_eval(args["argvalues"], scope))
    ids = _eval(args["ids"], scope) if "ids" in args else None
    out = []
    for i, value in enumerate(values):
        param = value if isinstance(value, _Param) else None
        row = param.values if param else (value,) if len(names) == 1 else tuple(value)
        if param and param.id is not None:
            case_id = param.id
        elif isinstance(ids, (list, tuple)) and ids[i] is not None:
            case_id = str(ids[i])
        else:
            parts = []
            for name, v in zip(names, row):
                made = ids(v) if callable(ids) else None
                parts.append(str(made) if made is not None else _value_id(v, name, i))
            case_id = "-".join(parts)
        out.append((case_id, bool(param and param.slow)))
    return out


def _fixtures_with_params(body: list[ast.stmt]) -> set[str]:
    found = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for dec in node.decorator_list:
                if isinstance(dec, ast.Call) and any(k.arg == "params" for k in dec.keywords):
                    found.add(node.name)
    return found


def _cases(fn: ast.FunctionDef | ast.AsyncFunctionDef, scope: dict[str, Any], slow: bool,
           param_fixtures: set[str]) -> list[Case] | None:
    slow = slow or _marked_slow(fn.decorator_list)
    if param_fixtures & {a.arg for a in fn.args.args}:
        return None
    sets: list[list[tuple[str, bool]]] = []
    for dec in reversed(fn.decorator_list):  # pytest applies the lowest decorator first: its id comes first
        if isinstance(dec, ast.Call) and _is_mark(dec, "parametrize"):
            try:
                sets.append(_parametrize(dec, scope))
            except (_Unknown, KeyError, TypeError, IndexError):
                return None
    if not sets:
        return [Case("", slow)]
    return [Case("-".join(i for i, _ in combo), slow or any(s for _, s in combo))
            for combo in itertools.product(*sets)]


def _conftest_param_fixtures(path: Path) -> set[str]:
    found: set[str] = set()
    for folder in path.parents:
        conftest = folder / "conftest.py"
        if conftest.is_file():
            found |= _fixtures_with_params(ast.parse(conftest.read_text(encoding="utf-8")).body)
        if folder.name == "tests":
            break
    return found


def _tests(body: list[ast.stmt]) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            yield node.name, node


def collect(path: Path) -> dict[str, list[Case] | None]:
    """Every test of ``path``, as pytest names it after ``::`` (``Class::method`` for methods), with its
    cases; None where its ids cannot be worked out from the file alone."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    scope = _module_scope(tree)
    module_slow = _marked_slow(_pytestmark(tree.body))
    fixtures = _fixtures_with_params(tree.body) | _conftest_param_fixtures(path)
    found: dict[str, list[Case] | None] = {}
    for name, fn in _tests(tree.body):
        found[name] = _cases(fn, scope, module_slow, fixtures)
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.startswith("Test")):
        cls_slow = module_slow or _marked_slow(cls.decorator_list) or _marked_slow(_pytestmark(cls.body))
        cls_fixtures = fixtures | _fixtures_with_params(cls.body)
        for name, fn in _tests(cls.body):
            found[f"{cls.name}::{name}"] = _cases(fn, scope, cls_slow, cls_fixtures)
    return found

