"""hororun's command line: parsing and validation, with errors that name the value received."""

from __future__ import annotations

import argparse
import os
from typing import NoReturn

__all__ = ["UsageError", "autotune_env", "build_parser", "parse_args"]

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
    tune = parser.add_argument_group("autotune", "tune the engine's knobs while training (needs horo[autotune])")
    tune.add_argument("--autotune", action="store_true", help="turn autotune on (HORO_AUTOTUNE=1)")
    tune.add_argument("--autotune-log-file", metavar="FILE", help="CSV of every trial, written by rank 0")
    tune.add_argument("--autotune-warmup-samples", metavar="N",
                      help="samples discarded after each change of setting (default 3)")
    tune.add_argument("--autotune-steps-per-sample", metavar="N", help="steps per scored sample (default 10)")
    tune.add_argument("--autotune-bayes-opt-max-samples", metavar="N",
                      help="trials of the Bayesian search before the best setting is frozen (default 20)")
    tune.add_argument("--autotune-gaussian-process-noise", metavar="X",
                      help="noise level of the Gaussian process, in [0, 1] (default 0.8)")
    tune.add_argument("--autotune-cache", metavar="FILE",
                      help="reuse the setting tuned by an earlier run of the same job, and save new ones")
    parser.add_argument("--tag-output", action="store_true",
                        help="prefix every output line with the rank that printed it")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="print the exact mpiexec command line before running it")
    parser.add_argument("--mpiexec", metavar="PATH",
                        help="mpiexec to use (default: $HORO_MPIEXEC, else the one next to this Python, "
                             "else mpiexec on PATH)")
    parser.add_argument("--check-build", action="store_true",
                        help="print the frameworks and backends horo can use, then exit")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the program each rank runs, with its arguments")
    return parser


_AUTOTUNE_FLAGS = {
    "autotune_log_file": ("HORO_AUTOTUNE_LOG", "--autotune-log-file"),
    "autotune_warmup_samples": ("HORO_AUTOTUNE_WARMUP_SAMPLES", "--autotune-warmup-samples"),
    "autotune_steps_per_sample": ("HORO_AUTOTUNE_STEPS_PER_SAMPLE", "--autotune-steps-per-sample"),
    "autotune_bayes_opt_max_samples": ("HORO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "--autotune-bayes-opt-max-samples"),
    "autotune_gaussian_process_noise": ("HORO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "--autotune-gaussian-process-noise"),
    "autotune_cache": ("HORO_AUTOTUNE_CACHE", "--autotune-cache"),
}


def autotune_env(ns: argparse.Namespace) -> dict[str, str]:
    """The HORO_AUTOTUNE* variables the ranks get for the --autotune* flags (checked like the variables).

    Raises:
        UsageError: a bad value, named with its flag.
    """
    env: dict[str, str] = {"HORO_AUTOTUNE": "1"} if ns.autotune else {}
    for attr, (var, _flag) in _AUTOTUNE_FLAGS.items():
        value = getattr(ns, attr, None)
        if value is not None:
            env[var] = os.path.abspath(value) if var in ("HORO_AUTOTUNE_LOG", "HORO_AUTOTUNE_CACHE") else value
    from horo.core.autotune.settings import read_options

    try:
        read_options(env)
    except ValueError as exc:
        text = str(exc)
        for var, flag in _AUTOTUNE_FLAGS.values():
            text = text.replace(f"{var}=", f"{flag}=").replace(f"{var} ", f"{flag} ")
        raise UsageError(text.replace("HINT: unset it to use", "HINT: leave it out to use")) from None
    if env and not ns.autotune:
        raise UsageError(f"--autotune-* options need --autotune. Received: {sorted(env)} without --autotune. "
                         "HINT: add --autotune.")
    return env


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
    ns.autotune_env = autotune_env(ns)
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
