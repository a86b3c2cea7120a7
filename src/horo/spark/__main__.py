"""``python -m horo.spark keep CMD... | remote-start HOST CMD | worker``: the programs of an elastic job on
Spark (see ``horo.spark.agent``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from horo.spark.agent import keep, remote_start, worker


def main(argv: Sequence[str]) -> int:
    if argv[:1] == ["keep"] and len(argv) > 1:
        return keep(argv[1:])
    if argv[:1] == ["remote-start"]:
        return remote_start(argv[1:])
    if argv[:1] == ["worker"]:
        return worker()
    sys.stderr.write(f"usage: python -m horo.spark keep CMD... | remote-start HOST CMD | worker. "
                     f"Received: {list(argv)!r}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
