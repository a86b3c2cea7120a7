"""Start-up, shut-down and topology queries (Horovod's names and meanings)."""

from __future__ import annotations

import atexit
import importlib.util
import os
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

from ..base.config import check_srun_world, config, share
from ..base.errors import HoroInternalError
from ..base.fault import horo_comms
from ..base.state import require_init, state
from ..base.timeline import timeline
from ..base.worlds import end as end_world
from ..scheduling.autotune import explicit_knobs
from ..scheduling.autotune import setup as autotune_setup
from ..scheduling.engine import Engine
from ..scheduling.negotiation import agree
from ..transport import adopt, heartbeat, mpi_env, mpi_ops, nccl
from ..transport.comms import connect_pairs, duplicate, singleton_segments
from .process_sets import ProcessSet, add_process_set, global_process_set, initial_sets, release, sets_arg

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size",
    "cross_rank", "is_homogeneous", "drop_runtime", "mpi_threads_supported", "mpi_built", "mpi_enabled", "nccl_built",
    "cuda_built", "gloo_built", "gloo_enabled", "rocm_built", "ddl_built", "ccl_built",
]

_atexit_registered = False
_aborting = False
_original_excepthook = sys.excepthook


def init(comm: Any = None, process_sets: Sequence[ProcessSet] | str | None = None) -> None:
    """Initialise horo on ``comm`` (default: all MPI processes). Calling it again is a no-op.

    Starts MPI when nobody has (``mpi4py.rc.initialize = False``), and then finalizes it at exit.

    Args:
        comm: an mpi4py communicator, or a list of global ranks to build one from.
        process_sets: process sets to register right away (same list on every rank; ids 1, 2, ... in list
            order), or ``"dynamic"`` (none now).
    """
    global _atexit_registered
    if state.initialized:
        return
    sets = sets_arg(process_sets)
    if comm is None:
        _join_described_world()
    mpi_env.before_init()  # Open MPI reads it in MPI_Init, which this import may run
    from mpi4py import MPI

    mpi_env.start(MPI)  # a script may have set mpi4py.rc.initialize = False
    made = comm is None or not isinstance(comm, MPI.Comm)  # base is horo's own, unless it is COMM_WORLD
    if comm is None:
        base = MPI.COMM_WORLD
        check_srun_world(base.Get_size())  # srun without PMIx: a world of singletons (docs/cluster.md)
        parent = MPI.Comm.Get_parent()
        if parent != MPI.COMM_NULL:
            # Spawned by an elastic world that grows (horo.elastic): join it; its ranks come first.
            base = parent.Merge(high=True)
    elif isinstance(comm, MPI.Comm):
        base = comm
    elif isinstance(comm, (list, tuple)) and all(isinstance(r, int) for r in comm):
        group = MPI.COMM_WORLD.Get_group().Incl(sorted(comm))
        base = MPI.COMM_WORLD.Create_group(group)
        group.Free()
    else:
        raise TypeError(
            f"init(comm=...) takes an mpi4py communicator or a list of ranks. Received: comm={comm!r}. "
            "HINT: horo.init(comm=MPI.COMM_WORLD.Split(color, key))."
        )
    connect_pairs(base)  # the first exchange, so each direction between two hosts gets its own TCP connection
    try:
        initial_sets(sets, base)
    except BaseException:
        if made and base != MPI.COMM_WORLD and base != MPI.COMM_NULL:
            base.Free()
        raise
    world = duplicate(base)
    # Errors as exceptions, whatever the caller's handler: a dead peer must surface (see core.fault).
    world.Set_errhandler(MPI.ERRORS_RETURN)
    share(world)  # before any engine exists: they read the agreed values
    me = world.Get_rank()
    mpi_ops.use_wrapping_sums(world.allreduce(not mpi_env.integer_sums_wrap(MPI), op=MPI.LOR))
    local = world.Split_type(MPI.COMM_TYPE_SHARED, key=me)
    cross = world.Split(local.Get_rank(), key=me)
    local_sizes = world.allgather(local.Get_size())
    _network_defaults(world, local_sizes)
    try:
        tune_opts, tuner = autotune_setup(world, Engine.configured_knobs())
        heartbeat.start(world)  # collective: a silent peer is known within seconds from here on
    except BaseException:
        for comm in (cross, local, world):
            comm.Free()
        raise

    state.world, state.local, state.cross = world, local, cross
    state.homogeneous = len(set(local_sizes)) == 1
    global_process_set.ranks = list(range(world.Get_size()))
    global_process_set.comm = world
    global_process_set.engine_comm = duplicate(world)
    # Only the global process set's engine is tuned: it carries the gradients.
    global_process_set.engine = Engine(global_process_set.engine_comm, global_process_set.ranks,
                                       autotune=tune_opts.enabled, tuner=tuner)
    state.process_sets = {0: global_process_set}
    state.next_process_set_id = 1
    state.initialized = True
    for ps in sets:
        add_process_set(ps)
    path = os.environ.get("HORO_TIMELINE")
    if path and world.Get_rank() == 0:
        timeline.start(path, mark_cycles=config["HORO_TIMELINE_MARK_CYCLES"] > 0)

    if world.Get_size() > 1 and os.environ.get("HORO_ABORT_ON_ERROR", "1") != "0":
        sys.excepthook = _abort_on_uncaught
    if not _atexit_registered:
        segments = singleton_segments(MPI)
        if segments:
            atexit.register(_unlink, segments)  # runs after the shut-down below: the last registered runs first
        atexit.register(_shutdown_at_exit)
        _atexit_registered = True


def _join_described_world() -> None:
    """A process that torchrun (or horo.ray, horo.spark, ...) started as one of N joins the world of N
    (transport.adopt) before MPI starts; never a silent world of one."""
    described = adopt.described()
    if described is None:
        return
    if os.environ.get("HORO_JOIN", "1").strip() in ("0", "off", "false"):
        raise adopt.refusal(described, "joining is turned off (HORO_JOIN=0)")
    adopt.join(described)


#: Communicators of former worlds. Never freed: ``MPI_Comm_free`` on a comm with dead members may wait on them.
retired: list[Any] = []


def drop_runtime(join_timeout: float = 5.0) -> None:
    """Forget horo's current world without talking to any peer; ``init`` may then run on a new comm."""
    err = state.failed or HoroInternalError("horo's world was re-formed (elastic reset).")
    for ps in list(state.process_sets.values()):
        eng = ps.engine
        if eng is not None:
            eng.fail_all(err)  # callers blocked on its ops must see the failure
            eng.thread.join(join_timeout)  # it ends once its (revoked) communicator fails
        if ps is not global_process_set:
            ps.invalidated = ("this process set belonged to a world that has been re-formed by an elastic reset.")
            ps.process_set_id = None
        ps.comm = ps.engine_comm = ps.engine = None
    retired.extend(horo_comms())
    heartbeat.stop()
    global_process_set.ranks = []
    sys.excepthook = _original_excepthook
    state.reset()
    end_world()  # the next world starts from nothing this one agreed on (core.base.worlds)


def _abort_on_uncaught(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
    # Without this, the other ranks would wait forever in their next collective. The process's own stderr: a hook
    # that wraps this one may have put a buffer in its place (torch.distributed's prefixes the lines afterwards,
    # which an abort never reaches).
    err = sys.__stderr__ or sys.stderr
    traceback.print_exception(exc_type, exc, tb, file=err)
    err.write(f"horo: rank {state.world.Get_rank() if state.world else '?'} raised an uncaught "
              f"{exc_type.__name__}; aborting the MPI job so the other ranks do not hang.\n")
    err.flush()
    sys.stdout.flush()
    global _aborting
    _aborting = True
    hook = sys.modules.get("sitecustomize")  # hororun's rank hook: record the exit code, since under ULFM
    if hook is not None and hasattr(hook, "_report"):  # mpiexec may exit 0 after an MPI_Abort
        hook._report(1)  # noqa: SLF001
    # Give the launcher a moment to forward this traceback before MPI_Abort kills the job's output.
    time.sleep(0.5)
    from mpi4py import MPI

    MPI.COMM_WORLD.Abort(1)


def _shutdown_at_exit() -> None:
    if _aborting:
        return
    try:
        shutdown()
    except Exception as exc:  # noqa: BLE001 - report, then make sure no peer waits for us forever
        sys.stderr.write(f"horo: error during shutdown at exit: {exc}\n")
        sys.stderr.flush()
        if state.world is not None and state.world.Get_size() > 1:
            from mpi4py import MPI

            MPI.COMM_WORLD.Abort(1)


def _unlink(paths: list[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass  # gone already, or never ours to remove


NETWORK_CHUNK_BYTES = 16 << 20


def _network_defaults(world: Any, local_sizes: list[int]) -> None:
    """Across hosts, defaults for a network (collective), each unless the user set it:

    - large allreduces go in 16 MiB pieces (HORO_CHUNK_BYTES). The 1 MiB default keeps each call cache-sized
      on shared memory; over TCP every piece costs round trips. On the emulated 1 Gbit/s cluster a 16 MiB
      allreduce in 1 MiB pieces ran at 0.50-0.73x raw MPI, in 16 MiB pieces at 1.01x (docs/multihost.md);
    - out-of-place allreduces keep MPI's algorithm (HORO_RING_MIN_BYTES=0). horo's flat ring knows nothing
      of hosts: at 2 hosts x 2 ranks it sent 1.5x the bytes of Open MPI's host-aware allreduce across the
      link and ran at 0.55x its speed; at 2 x 1 it was level (docs/multihost.md, "Out-of-place allreduces
      across hosts").
    """
    spans_hosts = local_sizes[0] < world.Get_size()  # the same on every rank
    if not spans_hosts:
        return
    mine = ("chunk_bytes" not in explicit_knobs(), not os.environ.get("HORO_RING_MIN_BYTES"))
    chunk, ring = world.bcast(mine if world.Get_rank() == 0 else None, root=0)
    if chunk:
        config["HORO_CHUNK_BYTES"] = float(max(config.int("HORO_CHUNK_BYTES"), NETWORK_CHUNK_BYTES))
    if ring:
        config["HORO_RING_MIN_BYTES"] = 0.0


def shutdown() -> None:
    """Stop the engines and free horo's communicators. ``init()`` may be called again afterwards."""
    if not state.initialized:
        return
    if state.fatal is None and state.failed is None:
        # A rank still issuing collectives meets this one here and both raise, instead of hanging. One waiting
        # on a process set never meets it: the engines see this rank leaving and end that wait (engine.py).
        state.leaving = True
        try:
            agree(state.world, (("collective", "shutdown"),), ranks=global_process_set.ranks)
        except BaseException:
            state.leaving = False  # still initialised: the caller may go on
            raise
    if state.failed is not None:
        # Peers died: freeing communicators could wait on them. Drop everything locally instead.
        timeline.stop()
        drop_runtime(join_timeout=1.0)
        return
    try:
        for ps in sorted(state.process_sets.values(), key=lambda p: -int(p.process_set_id or 0)):
            release(ps)
        nccl.release_all()
        for comm in (state.local, state.cross, state.world):
            if comm is not None:
                comm.Free()
    finally:
        timeline.stop()
        heartbeat.stop()
        global_process_set.ranks = []
        sys.excepthook = _original_excepthook
        state.reset()
        end_world()


def is_initialized() -> bool:
    """True between ``init()`` and ``shutdown()``."""
    return state.initialized


def size() -> int:
    """Number of processes in the job."""
    return require_init("size()").world.Get_size()


def rank() -> int:
    """This process's rank in the job, 0 .. size()-1."""
    return require_init("rank()").world.Get_rank()


def local_size() -> int:
    """Number of processes on this node."""
    return require_init("local_size()").local.Get_size()


def local_rank() -> int:
    """This process's rank on its node (use it to pick a GPU)."""
    return require_init("local_rank()").local.Get_rank()


def cross_size() -> int:
    """Number of nodes that have a process with this local rank."""
    return require_init("cross_size()").cross.Get_size()


def cross_rank() -> int:
    """This node's index among the processes of the same local rank."""
    return require_init("cross_rank()").cross.Get_rank()


def is_homogeneous() -> bool:
    """True when every node runs the same number of processes."""
    return require_init("is_homogeneous()").homogeneous


def mpi_threads_supported() -> bool:
    """True when MPI runs with MPI_THREAD_MULTIPLE."""
    require_init("mpi_threads_supported()")
    from mpi4py import MPI

    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def mpi_built() -> bool:
    """True when mpi4py is installed (horo's collectives run on MPI)."""
    return importlib.util.find_spec("mpi4py") is not None


def mpi_enabled() -> bool:
    """As ``mpi_built()``: MPI is horo's one controller."""
    return mpi_built()


def gloo_built() -> bool:
    """False: horo has no such backend (Horovod's query, kept for scripts that ask)."""
    return False


def gloo_enabled() -> bool:
    """False: horo has no such backend (Horovod's query, kept for scripts that ask)."""
    return False


def rocm_built() -> bool:
    """False: horo has no such backend (Horovod's query, kept for scripts that ask)."""
    return False


def ddl_built() -> bool:
    """False: horo has no such backend (Horovod's query, kept for scripts that ask)."""
    return False


def ccl_built() -> bool:
    """False: horo has no such backend (Horovod's query, kept for scripts that ask)."""
    return False


def cuda_built() -> bool:
    """True when CuPy is installed and sees a CUDA device."""
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no driver / no device both mean "not available"
        return False


def nccl_built() -> bool:
    """True when CuPy's NCCL bindings are usable (the ``nccl`` extra on a GPU machine)."""
    if not cuda_built():
        return False
    try:
        from cupy.cuda import nccl

        return bool(nccl.available) if hasattr(nccl, "available") else True
    except Exception:  # noqa: BLE001
        return False
