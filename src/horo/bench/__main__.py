"""``python -m horo.bench NAME [args]``: run benchmark ``horo.bench.NAME``; see ``horo.bench``."""

from __future__ import annotations

import importlib
import importlib.util
import sys

from horo.bench import BENCHES
from horo.core.base.config import launcher_rank0 as _is_rank0


def _present(name: str) -> bool:
    return importlib.util.find_spec(f"horo.bench.{name}") is not None


def _usage() -> str:
    width = max(len(n) for n in BENCHES)
    lines = "\n".join(f"  {name:<{width}}  {what}" for name, what in BENCHES.items())
    return (
        "usage: hororun -np N python -m horo.bench NAME [args]   (NAME --help for its options)\n\n"
        f"benchmarks:\n{lines}\n"
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        if _is_rank0():
            print(_usage(), end="")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in BENCHES:
        if _is_rank0():
            print(f"horo.bench: unknown benchmark. Received: NAME={name!r}. "
                  f"HINT: choose one of {', '.join(BENCHES)}.\n\n{_usage()}", end="", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(f"horo.bench.{name}")  # lazy: a bench may import its framework
    except ModuleNotFoundError as exc:
        if _is_rank0():
            missing = exc.name or "?"
            if missing == f"horo.bench.{name}":
                why = (f"the module horo.bench.{name} is not part of this installation. HINT: update horo; "
                       f"available here: {', '.join(n for n in BENCHES if _present(n))}")
            else:
                why = (f"it needs the package {missing!r}, which is not installed. HINT: install horo's extras "
                       "(pip install 'horo-mpi[tensorflow]', 'horo-mpi[tensorflow-cpu]' or "
                       "'horo-mpi[lightning]')")
            print(f"horo.bench: cannot run benchmark {name!r}: {why}.", file=sys.stderr)
        return 2
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
