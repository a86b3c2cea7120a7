"""hororun's command line: parsing and validation, with errors that name the value received."""

from __future__ import annotations

import argparse
from typing import NoReturn

__all__ = ["UsageError", "build_parser", "parse_args"]

_EXAMPLE = "hororun -np 2 python train.py"


class UsageError(Exception):
    """A bad hororun command line; main prints it and exits with status 2."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of exiting, so ``main`` returns its status."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _positive_int(flag: str) -> object:
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(
                f"must be a positive integer. Received: {flag}={text!r}. HINT: e.g. {flag} 2"
            )
        return value

    return convert


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser for ``hororun``."""
    parser = _Parser(
        prog="hororun",
        description="Launch a horo (Horovod-style) training job on N processes through mpiexec.",
        epilog=f"example: {_EXAMPLE}   |   hororun -np 4 -H host1:2,host2:2 python train.py",
        allow_abbrev=False,
    )
    parser.add_argument("-np", "-n", "--num-proc", dest="np", type=_positive_int("-np"), metavar="N",
                        help="number of processes (ranks) to start; may exceed the number of cores")
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", dest="hosts", metavar="HOST:SLOTS,...",
                       help="hosts and slots, e.g. host1:2,host2:2 (default: this machine)")
    hosts.add_argument("--hostfile", "-hostfile", dest="hostfile", metavar="FILE",
                       help="file with one 'host slots=N' (or 'host:N') per line")
    parser.add_argument("--timeline-filename", dest="timeline", metavar="FILE",
                        help="record a timeline: sets HORO_TIMELINE=FILE on every rank")
    parser.add_argument("--tag-output", action="store_true",
                        help="prefix every output line with the rank that printed it")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="print the exact mpiexec command line before running it, and let the "
                             "frameworks' start-up banners through (TF_CPP_MIN_LOG_LEVEL)")
    parser.add_argument("--mpiexec", metavar="PATH",
                        help="mpiexec to use (default: $HORO_MPIEXEC, else the one next to this Python, "
                             "else mpiexec on PATH)")
    parser.add_argument("--check-build", action="store_true",
                        help="print the frameworks and backends horo can use, then exit")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the program each rank runs, with its arguments")
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse and cross-check hororun's arguments.

    Raises:
        UsageError: the message names the offending value and gives a hint.
        SystemExit: for ``--help`` (argparse prints the help and exits 0).
    """
    parser = build_parser()
    try:
        ns = parser.parse_args(argv)
    except UsageError as exc:
        text = str(exc)
        if text.startswith("unrecognized arguments: "):
            text = (f"unrecognized hororun option. Received: {text.split(': ', 1)[1]}. HINT: hororun options "
                    f"go before the command, e.g. {_EXAMPLE}; see hororun --help.")
        elif "HINT" not in text:
            text += ". HINT: see hororun --help."
        raise UsageError(text) from None
    if ns.command and ns.command[0] == "--":
        ns.command = ns.command[1:]  # "hororun -np 2 -- cmd" separates a command that starts with "-"
    if ns.check_build:
        return ns
    if ns.np is None:
        raise UsageError(f"the number of processes is required. Received: -np=None. HINT: {_EXAMPLE}")
    if not ns.command:
        raise UsageError(f"no command to run. Received: command=[]. HINT: {_EXAMPLE}")
    if ns.command[0].startswith("-"):
        # Only reachable after "--"; mpiexec would take it for one of its own options.
        raise UsageError(
            f"the command must start with a program name. Received: command[0]={ns.command[0]!r}. "
            f"HINT: {_EXAMPLE}"
        )
    return ns
