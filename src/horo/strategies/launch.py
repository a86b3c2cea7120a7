"""Self-launch: ``python train.py`` with ``Trainer(strategy="horo", devices=N)`` starts N MPI ranks itself."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from typing import NoReturn

from horo.run.mpiexec import MpiexecError, local_command
from horo.run.slurm import allocation

from .._launcher import launcher_rank, started_by_mpi

__all__ = ["check_nodes", "launcher_rank", "relaunch", "relaunch_command", "started_by_mpi"]


def check_nodes(num_nodes: int, devices: int) -> None:
    """Refuse a self-launch over ``num_nodes`` > 1 that horo cannot place: outside a SLURM allocation, or on
    one with fewer nodes or fewer tasks per node than asked for.

    Raises:
        ValueError: the message names the values and what to run instead.
    """
    if num_nodes <= 1:
        return
    alloc = allocation()
    hint = (f"HINT: run the script inside sbatch/salloc -N {num_nodes} --ntasks-per-node={devices}, or start the "
            f"ranks yourself: hororun -np {num_nodes * devices} -H host1:{devices},host2:{devices},... "
            "python train.py.")
    if not alloc:
        raise ValueError(f"Trainer(strategy='horo', num_nodes={num_nodes}) outside MPI starts its ranks itself, but "
                         f"on one machine only: no SLURM allocation names other nodes. Received: num_nodes="
                         f"{num_nodes}. {hint}")
    short = [f"{s.host}:{s.slots}" for s in alloc[:num_nodes] if (s.slots or 1) < devices]
    if len(alloc) < num_nodes or short:
        raise ValueError(f"the SLURM allocation ({','.join(f'{s.host}:{s.slots}' for s in alloc)}) has no room for "
                         f"{num_nodes} nodes x {devices} devices. Received: num_nodes={num_nodes}, devices={devices}. "
                         f"{hint}")


def relaunch_command(nprocs: int) -> list[str]:
    """The command that re-runs this script's command line on ``nprocs`` ranks (hororun, else mpiexec)."""
    argv = list(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))[1:]
    rank_cmd = [sys.executable, *argv]
    if os.environ.get("HORO_LAUNCHER", "hororun") != "mpiexec" and importlib.util.find_spec("horo.run"):
        return [sys.executable, "-m", "horo.run", "-np", str(nprocs), *rank_cmd]

    try:
        return local_command(nprocs, rank_cmd)
    except MpiexecError as err:
        raise RuntimeError(f"horo could not find mpiexec to start the ranks: {err} (or start the job yourself: "
                           "hororun -np N python train.py).") from err


def relaunch(nprocs: int) -> NoReturn:
    """Run this script again on ``nprocs`` MPI ranks, wait for them, and exit with their status."""
    if hasattr(sys, "ps1") or sys.flags.interactive or "ipykernel" in sys.modules:
        raise RuntimeError(
            f"Trainer(strategy='horo', devices={nprocs}) outside MPI starts {nprocs} processes by re-running "
            "the script, which an interactive session cannot do. HINT: run a script (python train.py), or "
            "start the ranks yourself: hororun -np N python train.py."
        )
    cmd = relaunch_command(nprocs)
    env = dict(os.environ, HORO_SELF_LAUNCHED="1")
    env.setdefault("OMP_NUM_THREADS", "1")
    sys.stderr.write(f"horo: starting {nprocs} ranks: {' '.join(cmd)}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    proc = subprocess.Popen(cmd, env=env)
    forward = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, lambda s, _f: proc.send_signal(s)) for sig in forward}
    try:
        rc = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    sys.exit(rc if rc >= 0 else 128 - rc)
