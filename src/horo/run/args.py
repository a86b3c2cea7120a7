"""hororun's command line: parsing and validation, with errors that name the value received."""

from __future__ import annotations

import argparse
import os
from typing import NoReturn

from horo.core.scheduling.autotune.settings import read_options

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
    tune = parser.add_argument_group("autotune", "tune the engine's knobs while training (needs horo-mpi[autotune])")
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
                        help="print the exact mpiexec command line before running it, and let the "
                             "frameworks' start-up banners through (TF_CPP_MIN_LOG_LEVEL)")
    parser.add_argument("--ssh-command", dest="ssh_command", metavar="CMD",
                        help="program the MPI launcher runs instead of ssh to start its daemons on other hosts, "
                             "called as 'CMD [options] HOST COMMAND...' (default: $HORO_SSH, else ssh)")
    parser.add_argument("--network-interface", dest="network_interface", metavar="IFACE[,IFACE]",
                        help="network interface(s) MPI traffic and the launcher's control traffic must use, "
                             "e.g. eth0 (hydra takes one)")
    parser.add_argument("--hierarchical-allreduce", action="store_true",
                        help="allreduce within each host first, then across one rank per host "
                             "(sets HORO_HIERARCHICAL_ALLREDUCE=1)")
    parser.add_argument("--hierarchical-allgather", action="store_true",
                        help="allgather within each host first, then across one rank per host "
                             "(sets HORO_HIERARCHICAL_ALLGATHER=1)")
    parser.add_argument("--mpiexec", metavar="PATH",
                        help="mpiexec to use (default: $HORO_MPIEXEC, else the one next to this Python, "
                             "else mpiexec on PATH)")
    el = parser.add_argument_group("elastic training (Horovod's flags; needs the embedded Open MPI's ULFM)")
    el.add_argument("--min-np", dest="min_np", type=_positive_int("--min-np"), metavar="MIN",
                    help="fewest workers to go on with; below it for --elastic-timeout, the job fails")
    el.add_argument("--max-np", dest="max_np", type=_positive_int("--max-np"), metavar="MAX",
                    help="most workers; new hosts beyond it stay unused (default: every slot of -H or the "
                         "discovery script; else -np)")
    el.add_argument("--host-discovery-script", dest="discovery", metavar="SCRIPT",
                    help="executable printing 'host:slots' lines; polled about once a second")
    el.add_argument("--slots-per-host", dest="slots_per_host", type=_positive_int("--slots-per-host"),
                    metavar="K", help="slots for discovered hosts printed without ':slots' (default 1)")
    el.add_argument("--elastic-timeout", dest="elastic_timeout", type=float, default=600.0, metavar="SEC",
                    help="seconds to wait for --min-np slots (at start and after failures; default 600)")
    el.add_argument("--reset-limit", dest="reset_limit", type=int, metavar="R",
                    help="fail the job after more than R resets (default: no limit)")
    el.add_argument("--blacklist-cooldown-range", dest="cooldown", type=float, nargs=2, metavar=("LO", "HI"),
                    help="a failed host returns after a random LO..HI seconds (default: never)")
    parser.add_argument("--check-build", action="store_true",
                        help="print the frameworks and backends horo can use, then exit")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the program each rank runs, with its arguments")
    return parser


def _check_elastic(ns: argparse.Namespace) -> None:
    """Cross-check the elastic flags (Horovod's rules: -np defaults to --min-np, MIN <= np <= MAX)."""
    if ns.hostfile:
        raise UsageError(f"elastic mode takes -H or --host-discovery-script, not --hostfile. Received: "
                         f"--hostfile={ns.hostfile!r}. HINT: print the hosts from a discovery script.")
    if ns.discovery and ns.hosts:
        raise UsageError(f"give either -H or --host-discovery-script. Received: -H={ns.hosts!r}, "
                         f"--host-discovery-script={ns.discovery!r}.")
    if ns.np is None:
        ns.np = ns.min_np or ns.max_np
    if ns.np is None:
        raise UsageError(f"elastic mode needs -np or --min-np. Received: -np=None, --min-np=None, --max-np=None. "
                         f"HINT: hororun -np 2 --min-np 2 --host-discovery-script {ns.discovery or 'SCRIPT'} ...")
    if ns.min_np is None:
        ns.min_np = ns.np
    if ns.max_np is None and not (ns.hosts or ns.discovery):
        ns.max_np = max(ns.np, ns.min_np) if ns.np else ns.min_np  # this machine only: as many as asked for
    # With -H or a discovery script and no --max-np, every slot offered is used (Horovod: unbounded).
    if not ns.min_np <= (ns.np or ns.min_np) <= (ns.max_np or ns.np or ns.min_np):
        raise UsageError(f"elastic mode needs --min-np <= -np <= --max-np. Received: --min-np={ns.min_np}, "
                         f"-np={ns.np}, --max-np={ns.max_np}. HINT: hororun -np 3 --min-np 2 --max-np 4 ...")
    if ns.elastic_timeout <= 0:
        raise UsageError(f"--elastic-timeout must be positive. Received: --elastic-timeout={ns.elastic_timeout}.")
    if ns.reset_limit is not None and ns.reset_limit < 0:
        raise UsageError(f"--reset-limit must be >= 0. Received: --reset-limit={ns.reset_limit}.")
    if ns.cooldown is not None and not 0 <= ns.cooldown[0] <= ns.cooldown[1]:
        raise UsageError(f"--blacklist-cooldown-range needs 0 <= LO <= HI. Received: "
                         f"--blacklist-cooldown-range={ns.cooldown[0]:g} {ns.cooldown[1]:g}.")
    if ns.discovery and not os.access(ns.discovery, os.X_OK):
        raise UsageError(f"the host discovery script is not an executable file. Received: "
                         f"--host-discovery-script={ns.discovery!r}. HINT: chmod +x it.")


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
    ns.elastic = any(v is not None for v in (ns.min_np, ns.max_np, ns.discovery))
    if ns.elastic:
        _check_elastic(ns)
    ns.autotune_env = autotune_env(ns)
    if ns.network_interface is not None:
        names = [n.strip() for n in ns.network_interface.split(",")]
        if not all(names) or any(c.isspace() or c in "/:" for n in names for c in n):
            raise UsageError(
                f"--network-interface takes comma-separated interface names. Received: "
                f"--network-interface={ns.network_interface!r}. HINT: --network-interface eth0"
            )
        ns.network_interface = names
    if ns.ssh_command is not None and not ns.ssh_command.strip():
        raise UsageError(f"--ssh-command is empty. Received: --ssh-command={ns.ssh_command!r}. "
                         "HINT: --ssh-command /path/to/ssh-wrapper")
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
