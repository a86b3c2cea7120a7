"""``horo.elastic.run``: call the training function again on a re-formed world after a failure or growth.

The reset sequence (see docs/design-elastic.md):

1. a peer dies: every survivor's pending collective raises ``HoroInternalError`` (core.fault revokes
   horo's communicators, so none waits on the dead one);
2. each survivor restores its last commit and joins a fault-tolerant agreement (``Agree``), which also
   catches ranks that had returned from the function when the failure hit;
3. ``Shrink`` gives the world of the survivors; horo is re-initialised on it (ranks renumbered in order);
4. the reset callbacks run, then ``state.sync()`` broadcasts rank 0's committed state, and the function is
   called again.

A lost host: Open MPI ends the whole MPI job. In a job across hosts rank 0 hands every commit to hororun,
which starts a new job on the hosts left (``HORO_ELASTIC_RESUME=1``): there rank 0 takes that commit back,
the reset callbacks run, and ``sync()`` spreads it before the first step.

Host changes: ``commit()`` raises ``HostsUpdatedInterrupt`` on every rank when hororun's driver has free
slots or a host of the job was removed or excluded. The workers of a removed host leave (``leave.depart``);
for new slots the ranks ``Spawn`` the new workers together and ``Merge`` with them, and the new workers
receive the state through the same ``sync()`` before their first step.

A worker whose function raises an ordinary exception leaves the job alone (``leave.fail_alone``).
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from .. import core
from ..core.base.errors import HoroInternalError
from ..core.base.fault import is_process_failure
from ..core.base.state import state as rt
from . import client, world
from .errors import ElasticError, HostsUpdatedInterrupt
from .growth import end_for_restart, log
from .leave import depart, fail_alone, unlink_shared_segments
from .state import State

__all__ = ["run", "reset_count"]

F = TypeVar("F", bound=Callable[..., Any])
# A job hororun restarted after a lost host continues the count (HORO_ELASTIC_RESET_BASE).
_resets = {"count": int(os.environ.get("HORO_ELASTIC_RESET_BASE") or 0), "failures": 0, "atexit": 0, "resumed": 0}


def reset_count() -> int:
    """How many resets this process has gone through."""
    return _resets["count"]


def _env_int(name: str, default: int | None) -> int | None:
    raw = os.environ.get(name)
    return int(raw) if raw not in (None, "") else default


def _check_reset_limit() -> None:
    _resets["count"] += 1
    limit = _env_int("HORO_ELASTIC_RESET_LIMIT", None)
    if limit is not None and _resets["count"] > limit:
        raise ElasticError(
            f"horo.elastic: the job was reset {_resets['count']} times, more than --reset-limit allows. Received: "
            f"reset_limit={limit}. HINT: raise --reset-limit, or find why workers keep failing (hororun names "
            "the failed hosts)."
        )


def _exit_without_finalize() -> None:
    """At a normal exit after a peer died: leave without ``MPI_Finalize``.

    Open MPI's finalize waits in a job-wide PMIx fence, which (measured here) can wait forever for processes
    that were SIGKILLed earlier. horo's own shutdown still runs first, with the surviving ranks.

    Every worker also tells hororun it is ending: once the whole world has, hororun gives mpiexec a while
    to finish and then ends it (prterun has been seen to stay after every worker had ended, once workers
    had failed or left).
    """
    client.report_bye()
    if not _resets["failures"]:
        return
    try:
        core.shutdown()
    except Exception as exc:  # noqa: BLE001 - report, and exit all the same
        sys.stderr.write(f"horo.elastic: error during shutdown at exit: {exc}\n")
    unlink_shared_segments()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S112 - a closed stream must not stop the exit
            continue
    os._exit(0)


def _after_failure() -> None:
    _resets["failures"] += 1
    t0 = time.perf_counter()
    old = core.size() if rt.world is not None else -1
    world.shrink()
    world.timings["recover_s"] = time.perf_counter() - t0
    log(f"rank {core.rank()}: a worker failed; world re-formed from {old} to {core.size()} processes in "
        f"{world.timings['recover_s'] * 1e3:.0f} ms (shrink {world.timings.get('shrink_s', 0) * 1e3:.0f} ms)")
    _report_world()
    _ensure_min_np()


def _ensure_min_np() -> None:
    min_np = _env_int("HORO_ELASTIC_MIN_NP", 1) or 1
    if core.size() < min_np:
        _wait_for_min(min_np)


def _report_world() -> None:
    """Collective: report the world to hororun's driver; the workers it names leave (their host was removed
    or excluded), and the others report again. The ranks agree on the highest reset count."""
    while True:
        leave, fatal, resets = client.report_world(_resets["count"])
        _resets["count"] = max(_resets["count"], resets)
        if not depart(leave, fatal):
            return
        _resets["failures"] += 1  # workers ended without MPI_Finalize: the others must not wait for them in it


def _update_hosts() -> bool:
    """Collective, after ``HostsUpdatedInterrupt``: workers of removed hosts leave, new ones are spawned on
    free slots. Returns whether new workers joined (they need the state)."""
    _report_world()
    grew = grow()
    _ensure_min_np()
    return grew


def _wait_for_min(min_np: int) -> None:
    """Grow back to ``min_np`` within ``--elastic-timeout``, or fail naming the hosts that are left.

    Free slots on this machine: spawn there. Enough only with other hosts' (a job across hosts): end at the
    commit just restored, for hororun to start the job again with them (``end_for_restart``).
    """
    timeout = float(os.environ.get("HORO_ELASTIC_TIMEOUT", "600"))
    deadline = time.monotonic() + timeout
    while True:
        flag = np.zeros(1, dtype=np.int64)
        if core.rank() == 0 and client.enabled():
            need = min_np - core.size()
            flag[0] = 1 if client.free_slots() >= need else 2 if client.free_slots(remote=True) >= need else 0
        kind = core.broadcast(flag, 0, name="horo.elastic.min_np")[0]
        if kind == 1:
            grow()
            if core.size() >= min_np:
                return
        elif kind == 2:
            end_for_restart()
        if time.monotonic() >= deadline or not client.enabled():
            hosts = client.hosts_left() if client.enabled() else "unknown (no hororun elastic driver)"
            msg = (f"horo.elastic: only {core.size()} workers are left, fewer than --min-np={min_np}, for "
                   f"{timeout:g} s (--elastic-timeout). Hosts left: {hosts}. HINT: add hosts to the discovery "
                   "script, or lower --min-np.")
            if core.rank() == 0:
                client.report_fatal(msg)
            raise ElasticError(msg)
        time.sleep(1.0)


def _resume(state: Any) -> None:
    """Collective, in a job hororun restarted after a lost host: continue from the last commit it kept."""
    import pickle

    value, status, why = None, np.zeros(1, dtype=np.int64), ""
    if core.rank() == 0:
        try:
            blob = client.committed_state()
            if blob is not None:
                value = pickle.loads(blob)  # noqa: S301 - from hororun, signed with the job's secret
                status[0] = 1
        except Exception as exc:  # noqa: BLE001 - every rank must learn of it, below
            status[0], why = 2, f"{type(exc).__name__}: {exc}"
    status = core.broadcast(status, 0, name="horo.elastic.resume")
    if status[0] == 2:
        raise ElasticError(f"horo.elastic: this job was restarted after a lost host, but the committed state "
                           f"could not be fetched from hororun{': ' + why if why else ''}. HINT: see hororun's "
                           "messages above.")
    if value is not None:
        state.load_committed(value)
        state.restore()
    state.on_reset()
    log(f"rank {core.rank()}: restarted by hororun on {core.size()} processes, from "
        f"{'the last commit' if status[0] else 'the start (nothing was committed)'}")


def grow() -> bool:
    """Collective over the current world: spawn workers on the driver's free slots and merge with them.

    Returns whether the world grew.
    """
    t0 = time.perf_counter()
    hosts: list[str] = client.claim_slots(core.size()) if core.rank() == 0 else []
    hosts = core.broadcast_object(hosts, 0, name="horo.elastic.grow")
    if not hosts:
        return False
    old = core.size()
    world.spawn([(client.mpi_host(h), h) for h in hosts])
    client.set_new_hosts(hosts)
    world.timings["grow_s"] = time.perf_counter() - t0
    log(f"rank {core.rank()}: world grew from {old} to {core.size()} processes in "
        f"{world.timings['grow_s'] * 1e3:.0f} ms (new workers on {hosts})")
    _report_world()
    return True


def run(func: F) -> F:
    """Decorate ``func(state, ...)``: on a failure or new hosts, reset the world and call it again.

    Raises:
        HoroError: before anything runs, when the MPI cannot survive a failure (no ULFM).
        ElasticError: more resets than ``--reset-limit``, or fewer than ``--min-np`` workers for too long.
    """
    if not callable(func):
        raise TypeError(f"horo.elastic.run decorates a function. Received: func={func!r}. HINT: @hvd.elastic.run")

    @functools.wraps(func)
    def wrapper(state: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(state, State):
            raise TypeError(f"{func.__name__}: the first argument of an @elastic.run function must be a "
                            f"horo.elastic.State. Received: state of type {type(state).__name__}. HINT: "
                            "train(hvd.elastic.TorchState(model, optimizer, epoch=0)).")
        if core.size() > 1:
            world.require_ft("horo.elastic.run")
        if not _resets["atexit"]:
            atexit.register(_exit_without_finalize)  # after mpi4py's: runs before MPI_Finalize
            _resets["atexit"] = 1
        client.start()
        world.join_spawn()  # a spawned worker helps spawn the workers after it
        _report_world()  # collective: spawned workers meet the others here, before the first sync
        if os.environ.get("HORO_ELASTIC_RESUME") == "1" and not _resets["resumed"]:
            _resets["resumed"] = 1
            _resume(state)
        reset: str | None = None
        skip_sync = False
        while True:
            ok = True
            result = None
            try:
                if reset is not None:
                    _check_reset_limit()
                    if reset == "failure":
                        _after_failure()
                    elif _update_hosts():
                        skip_sync = False  # new workers need the state
                    reset = None
                    state.on_reset()
                if not skip_sync:
                    state.sync()
                skip_sync = False
                result = func(state, *args, **kwargs)
            except ElasticError as exc:
                client.report_fatal(str(exc))
                raise
            except HostsUpdatedInterrupt as exc:
                reset, skip_sync = "hosts", exc.skip_sync
                continue
            except Exception as exc:
                # Frameworks may wrap our error (a TF op raising inside a graph): what counts is that this
                # rank saw a peer fail (core.fault recorded it), or MPI reported one during a reset.
                if not isinstance(exc, HoroInternalError) and rt.failed is None and not is_process_failure(exc):
                    if client.enabled():
                        fail_alone(exc)  # this worker's own error: it leaves, the others go on
                    raise
                log(f"rank {core.rank()} caught {type(exc).__name__} at t={time.time():.3f}: {str(exc)[:300]}")
                ok = False
            # Every live rank takes part, so a rank that returned just as a peer died is not left behind.
            if core.size() > 1 and not world.agree(ok):
                ok = False
            if ok:
                if core.rank() == 0:
                    client.report_done()
                return result
            state.restore()
            reset = "failure"

    return wrapper  # type: ignore[return-value]
