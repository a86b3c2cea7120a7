"""Self-launch: ``python train.py`` with ``Trainer(strategy="horo", devices=N)`` starts N MPI ranks itself.

On one node the launching process becomes rank 0 and MPI spawns the N - 1 others (``MPI_Comm_spawn``, then
one world of them all), as DDP's launcher makes its process rank 0: the code before ``Trainer()`` runs N times.
Across nodes, inside a SLURM allocation (whose nodes hororun places the ranks on; Open MPI 5 spawns on one host
only), or with ``HORO_LAUNCHER=hororun`` (or ``mpiexec``), the script runs again on N ranks through that launcher
and the launching process waits for them.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import signal
import subprocess
import sys
from typing import NoReturn

from horo.run.mpiexec import MpiexecError, find_mpiexec, local_command
from horo.run.slurm import allocation

from .. import core
from .._launcher import launcher_rank, started_by_mpi
from ..core.transport import adopt, mpi_env

__all__ = ["check_nodes", "join_parent", "launcher_rank", "relaunch", "relaunch_command", "spawn", "start_ranks",
           "started_by_mpi", "started_with_ranks"]

_SPAWNED = "spawn"  # HORO_SELF_LAUNCHED's value in the ranks a self-launch spawned


def started_with_ranks() -> bool:
    """True where a launcher started this process as one rank of several: an MPI launcher, or one that describes
    its world (torchrun's ``WORLD_SIZE``/``RANK``, which ``horo.init()`` joins): nothing to start then."""
    return started_by_mpi() or adopt.described() is not None


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


def _refuse_interactive(nprocs: int) -> None:
    if hasattr(sys, "ps1") or sys.flags.interactive or "ipykernel" in sys.modules:
        raise RuntimeError(
            f"Trainer(strategy='horo', devices={nprocs}) outside MPI starts {nprocs} processes by re-running "
            "the script, which an interactive session cannot do. HINT: run a script (python train.py), or "
            "start the ranks yourself: hororun -np N python train.py."
        )


def start_ranks(nprocs: int, num_nodes: int = 1) -> None:
    """Outside MPI, make this script ``nprocs`` ranks: returns in this process as rank 0 of them (one node), or
    never (across nodes, in a SLURM allocation, or ``HORO_LAUNCHER`` set to ``hororun``/``mpiexec``: see
    ``relaunch``)."""
    _refuse_interactive(nprocs)
    how = os.environ.get("HORO_LAUNCHER", _SPAWNED)
    if how not in (_SPAWNED, "hororun", "mpiexec"):
        raise ValueError(f"HORO_LAUNCHER must be spawn, hororun or mpiexec. Received: HORO_LAUNCHER={how!r}. "
                         "HINT: unset it (spawn: this process becomes rank 0).")
    if num_nodes > 1 or how != _SPAWNED or allocation():
        relaunch(nprocs)
    spawn(nprocs)


def spawn(nprocs: int) -> None:
    """Make this process rank 0 of ``nprocs``: MPI spawns ``nprocs - 1`` more runs of this command line on this
    machine, and horo starts on the world of them all (they join it from ``horo.init()``)."""
    try:
        bindir = os.path.dirname(find_mpiexec())
    except MpiexecError as err:
        raise RuntimeError(f"horo could not find Open MPI to start the ranks: {err} (or start the job yourself: "
                           "hororun -np N python train.py).") from err
    # MPI's spawn starts Open MPI's runtime daemon (prte), which sits next to mpiexec.
    os.environ["PATH"] = os.pathsep.join([bindir, os.environ.get("PATH", "")])
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers often run as root; Open MPI refuses unless told
        for var in ("PRTE_ALLOW_RUN_AS_ROOT", "PRTE_ALLOW_RUN_AS_ROOT_CONFIRM", "OMPI_ALLOW_RUN_AS_ROOT",
                    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"):
            os.environ.setdefault(var, "1")
    if "OMP_NUM_THREADS" not in os.environ:  # the ranks share this machine's cores, as under hororun
        os.environ["OMP_NUM_THREADS"] = "1"
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)
    mpi_env.before_init()
    from mpi4py import MPI

    mpi_env.start(MPI)
    argv = list(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))[1:]
    sys.stderr.write(f"horo: starting {nprocs - 1} more rank{'s' if nprocs > 2 else ''} (this process is rank 0): "
                     f"{sys.executable} {' '.join(argv)}\n")
    sys.stderr.flush()
    info = MPI.Info.Create()
    info.Set("wdir", os.getcwd())  # the command line may hold paths relative to it
    info.Set("PMIX_ENVAR", f"HORO_SELF_LAUNCHED={_SPAWNED}")
    inter = MPI.COMM_SELF.Spawn(sys.executable, argv, nprocs - 1, info, root=0)
    info.Free()
    core.init(comm=inter.Merge(high=False))


def join_parent() -> bool:
    """In a rank a self-launch spawned: join the launching process's world now (horo's ranks are then known
    before the Trainer exists). True if this process is such a rank."""
    # A worker process of this rank (a DataLoader's, started by "spawn") imports the script again: not a rank.
    if os.environ.get("HORO_SELF_LAUNCHED") != _SPAWNED or multiprocessing.parent_process() is not None:
        return False
    if not core.is_initialized():
        core.init()  # the parent waits in its merge for this
    return True


def relaunch(nprocs: int) -> NoReturn:
    """Run this script again on ``nprocs`` MPI ranks, wait for them, and exit with their status."""
    _refuse_interactive(nprocs)
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
