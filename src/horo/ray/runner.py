"""``horo.ray.RayExecutor``: Horovod's Ray API (``horovod.ray.RayExecutor``) on horo.

The executor places its workers (``placement``), starts one actor per worker, orders them by host and gives
each the variables of one world (``world``); ``horo.init()`` in a function the workers run joins them into one
MPI world, which later calls on the same workers reuse. Failures (``_gather``): the first worker that raises or
dies ends the call with its error in the driver; workers still running a moment later (waiting for it in a
collective, or in the rendezvous) are stopped, as a launcher ends a job one of whose ranks failed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from . import world
from .placement import Placement, place
from .worker import HoroWorker

__all__ = ["RayExecutor", "Settings", "WorkerDiedError"]

#: Seconds the other workers get to end once one died (half that once one raised), before they are stopped.
FAILURE_GRACE_S = 5.0
#: Seconds to wait for Ray to count killed workers dead.
KILL_S = 30.0
#: Seconds ``shutdown()`` gives the workers to leave their world before their actors are killed.
LEAVE_S = 15.0


class WorkerDiedError(RuntimeError):
    """A worker's process ended during a call (killed, crashed, or its node lost)."""


@dataclass
class Settings:
    """What :meth:`RayExecutor.create_settings` makes (Horovod's ``MiniSettings``).

    Attributes:
        timeout_s: seconds the workers wait for each other to form their world (``HORO_JOIN_TIMEOUT``).
        placement_group_timeout_s: seconds to wait for the cluster to hold the workers.
        ssh_identity_file: kept for Horovod's signature; horo starts nothing over ssh.
    """

    timeout_s: float = 30
    placement_group_timeout_s: float = 100
    ssh_identity_file: str | None = None


def _positive(name: str, value: Any, *, allow_none: bool = False, number: bool = False) -> None:
    kinds = (int, float) if number else (int,)
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, kinds) or value <= 0:
        raise ValueError(f"horo.ray: {name} must be a positive {'number' if number else 'integer'}. Received: "
                         f"{name}={value!r}. HINT: RayExecutor(settings, num_workers=2).")


class RayExecutor:
    """Runs functions on workers that form one horo world (Horovod's ``RayExecutor``).

    Args:
        settings: from :meth:`create_settings`.
        num_workers: number of workers, packed on as few nodes as fit. Or:
        num_hosts: number of nodes, each with ``num_workers_per_host`` workers.
        num_workers_per_host: workers on each of ``num_hosts`` nodes.
        cpus_per_worker: CPUs Ray reserves for each worker.
        use_gpu: reserve GPUs; each worker of a node sees all the node's workers' GPUs, its own at index
            ``local_rank`` (``CUDA_VISIBLE_DEVICES``).
        gpus_per_worker: GPUs for each worker (1 when ``use_gpu`` and unset).
        use_current_placement_group: inside a placement group, place the workers in it.
    """

    @classmethod
    def create_settings(cls, timeout_s: float = 30, ssh_identity_file: str | None = None, ssh_str: str | None = None,
                        placement_group_timeout_s: float = 100, nics: set[str] | None = None) -> Settings:
        """Settings for an executor (Horovod's signature).

        Args:
            timeout_s: seconds the workers wait for each other when they form their world.
            ssh_identity_file: accepted for Horovod's signature; horo starts nothing over ssh (Open MPI's
                daemons start through the workers themselves).
            ssh_str: as ``ssh_identity_file``.
            placement_group_timeout_s: seconds to wait for the cluster to hold the workers.
            nics: not taken: the workers use the interface through which they reach rank 0's node.
        """
        _positive("timeout_s", timeout_s, number=True)
        _positive("placement_group_timeout_s", placement_group_timeout_s, number=True)
        if nics:
            raise ValueError(f"horo.ray does not take nics. Received: nics={nics!r}. HINT: leave it unset; each "
                             "worker uses the interface through which it reaches rank 0's node (Ray's node address).")
        del ssh_str  # Horovod wrote it to ssh_identity_file for its ssh; nothing here uses ssh
        return Settings(timeout_s=timeout_s, placement_group_timeout_s=placement_group_timeout_s,
                        ssh_identity_file=ssh_identity_file)

    def __init__(self, settings: Settings, num_workers: int | None = None, num_hosts: int | None = None,
                 num_workers_per_host: int = 1, cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: float | None = None, use_current_placement_group: bool = True) -> None:
        if not hasattr(settings, "timeout_s") or not hasattr(settings, "placement_group_timeout_s"):
            raise TypeError(f"horo.ray: settings must come from RayExecutor.create_settings(). Received: "
                            f"settings={settings!r}. HINT: RayExecutor(RayExecutor.create_settings(timeout_s=30), "
                            "num_workers=2).")
        if (num_workers is None) == (num_hosts is None):
            raise ValueError(f"horo.ray: give num_workers, or num_hosts with num_workers_per_host. Received: "
                             f"num_workers={num_workers!r}, num_hosts={num_hosts!r}. HINT: RayExecutor(settings, "
                             "num_workers=4), or RayExecutor(settings, num_hosts=2, num_workers_per_host=2).")
        _positive("num_workers", num_workers, allow_none=True)
        _positive("num_hosts", num_hosts, allow_none=True)
        _positive("num_workers_per_host", num_workers_per_host)
        _positive("cpus_per_worker", cpus_per_worker, number=True)
        _positive("gpus_per_worker", gpus_per_worker, allow_none=True, number=True)
        self.settings = settings
        self.num_workers = num_workers if num_workers is not None else num_hosts * num_workers_per_host  # type: ignore[operator]
        self._shape = {"num_workers": num_workers, "num_hosts": num_hosts, "num_workers_per_host": num_workers_per_host}
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.use_gpu = use_gpu
        self.use_current_placement_group = use_current_placement_group
        self.workers: list[Any] = []  # actor handles, in rank order
        self.members: list[world.Member] = []
        self._placement: Placement | None = None
        self._stopped: str | None = None  # why the workers were stopped, once one failed

    @property
    def placement_group(self) -> Any:
        """The placement group the workers are in (None before ``start``)."""
        return self._placement.group if self._placement else None

    # ------------------------------------------------------------------------------------------- start
    def start(self, executable_cls: type | None = None, executable_args: Sequence[Any] | None = None,
              executable_kwargs: Mapping[str, Any] | None = None,
              extra_env_vars: Mapping[str, Any] | None = None) -> None:
        """Start the workers: place them, give them their world, and make ``executable_cls(*executable_args,
        **executable_kwargs)`` in each (the object :meth:`execute` passes to its function).

        ``extra_env_vars`` are set in every worker first. Raises ``TimeoutError`` where the cluster cannot hold
        the workers within ``placement_group_timeout_s``.
        """
        if self.workers:
            raise RuntimeError("horo.ray: the executor's workers are running already. HINT: call shutdown() "
                               "before start() again.")
        self._stopped = None
        self._placement = place(**self._shape, cpus_per_worker=self.cpus_per_worker,
                                gpus_per_worker=self.gpus_per_worker, use_current=self.use_current_placement_group,
                                timeout_s=self.settings.placement_group_timeout_s)
        try:
            actor = ray.remote(HoroWorker)
            workers = [actor.options(num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker, max_restarts=0,
                                     scheduling_strategy=PlacementGroupSchedulingStrategy(
                                         placement_group=self._placement.group, placement_group_bundle_index=b,
                                         placement_group_capture_child_tasks=False)).remote()
                       for b in self._placement.bundles]
            self.workers = workers
            members = self._started([w.member.remote() for w in workers])
            order = world.rank_order(members)
            self.workers, self.members = [workers[i] for i in order], [members[i] for i in order]
            port = ray.get(self.workers[0].free_port.remote(self.members[0].ip))
            envs = world.join_envs(self.members, port, self.settings.timeout_s, "horo.ray", share_gpus=self.use_gpu)
            extra = {k: str(v) for k, v in (extra_env_vars or {}).items()}
            ray.get([w.update_env_vars.remote({**env, **extra}) for w, env in zip(self.workers, envs)])
            self._gather([w.start_executable.remote(executable_cls, executable_args, executable_kwargs)
                          for w in self.workers], "start()")
        except BaseException:
            self._stopped = self._stopped or "start() failed."  # no world to leave: end the workers at once
            self.shutdown()
            raise

    def _started(self, refs: list[Any]) -> list[world.Member]:
        """Each new worker's place, once all are up (a placement group we did not make may lack room)."""
        limit = self.settings.placement_group_timeout_s
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=limit)
        if len(ready) < len(refs):
            raise TimeoutError(f"horo.ray: only {len(ready)} of {len(refs)} workers started within {limit:g} s "
                               f"(placement_group_timeout_s), each asking for {self.cpus_per_worker} CPU and "
                               f"{self.gpus_per_worker} GPU in placement group {self._placement.group.id.hex()}. "
                               "HINT: make room in the placement group, or use_current_placement_group=False.")
        return ray.get(refs)

    # -------------------------------------------------------------------------------------------- calls
    def run(self, fn: Callable[..., Any], args: Sequence[Any] | None = None,
            kwargs: Mapping[str, Any] | None = None) -> list[Any]:
        """``fn(*args, **kwargs)`` on every worker; the results in rank order."""
        return self._gather(self._submit(_call(fn, args, kwargs), "run()"), "run()")

    def run_remote(self, fn: Callable[..., Any], args: Sequence[Any] | None = None,
                   kwargs: Mapping[str, Any] | None = None) -> list[Any]:
        """As :meth:`run`, without waiting: Ray object references to the results, in rank order (``ray.get``).

        A worker that fails ends the others as in :meth:`run`: each reference then resolves, to a result or
        an error, never a wait on a worker stuck in a collective."""
        refs = self._submit(_call(fn, args, kwargs), "run_remote()")
        threading.Thread(target=self._watch, args=(refs,), name="horo-ray-watch", daemon=True).start()
        return refs

    def execute(self, fn: Callable[[Any], Any]) -> list[Any]:
        """``fn(executable)`` on every worker (the object ``start`` made there, or None); results in rank order."""
        return self._gather(self._submit(fn, "execute()"), "execute()")

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` on the rank 0 worker; its result."""
        self._check("execute_single()")
        return self._gather([self.workers[0].execute.remote(fn)], "execute_single()", len(self.workers))[0]

    def _check(self, what: str) -> None:
        if self._stopped:
            raise RuntimeError(f"horo.ray: {what} refused: {self._stopped} HINT: call shutdown(), then start() "
                               "for new workers.")
        if not self.workers:
            raise RuntimeError(f"horo.ray: {what} needs running workers. HINT: call start() first.")

    def _submit(self, fn: Callable[[Any], Any], what: str) -> list[Any]:
        self._check(what)
        return [w.execute.remote(fn) for w in self.workers]

    def _watch(self, refs: list[Any]) -> None:
        try:
            self._gather(refs, "run_remote()")
        except BaseException:  # noqa: BLE001 - the caller gets it from the references themselves
            pass

    def _gather(self, refs: list[Any], what: str, n: int | None = None) -> list[Any]:
        """The results of ``refs`` (ranks 0, 1, ... of ``n`` workers), or the failure of a worker (``_failed``)."""
        results: list[Any] = [None] * len(refs)
        pending = {ref: rank for rank, ref in enumerate(refs)}
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            rank = pending.pop(ref)
            try:
                results[rank] = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - a worker's own error, or Ray's word that it is gone
                self._failed([(rank, exc)], pending, n or len(refs), what)
        return results

    def _failed(self, failures: list[tuple[int, Exception]], pending: dict[Any, int], n: int, what: str) -> None:
        """End a call one of whose workers failed; raises the failure that explains it.

        The other workers get a moment to end: those waiting for the failed one in a collective end only when
        the job of their world does (a death ends it; a raise does not), and whichever are still running then
        are stopped. Of the failures seen meanwhile, the one raised is a worker's own error, else a worker
        Ray could no longer reach (its node is gone: the others then died because their job ended), else the
        first death."""
        grace = FAILURE_GRACE_S if isinstance(failures[0][1], RayActorError) else FAILURE_GRACE_S / 2
        deadline = time.monotonic() + grace
        while pending and time.monotonic() < deadline:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(deadline - time.monotonic(), 0))
            for ref in ready:
                rank = pending.pop(ref)
                try:
                    ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - collected, then ranked below
                    failures.append((rank, exc))
        rank, exc = min(failures, key=lambda f: (0 if not isinstance(f[1], RayActorError)
                                                 else 1 if isinstance(f[1], ActorUnavailableError) else 2))
        if isinstance(exc, RayActorError):
            m = self.members[rank] if rank < len(self.members) else None
            where = f" (pid {m.pid} on {m.hostname}, {m.ip})" if m else ""
            how = ("could no longer be reached (its process, its node or the network to it is gone)"
                   if isinstance(exc, ActorUnavailableError) else "died")
            why = f"worker rank {rank} {how.split(' (')[0]} during {what}."
            error: Exception = WorkerDiedError(f"horo.ray: worker rank {rank} of {n}{where} {how} during {what}; "
                                               f"its world is over. Ray's account: {exc}")
        else:
            cause = getattr(exc, "cause", None) or exc  # Ray's RayTaskError wraps the worker's own error
            why, error = f"worker rank {rank} raised {type(cause).__name__} in {what}.", exc
        if pending or any(isinstance(e, RayActorError) for _, e in failures):
            self._stopped = f"its workers were stopped after {why}"
            self._kill(self.workers)
        if error is exc:
            raise exc
        raise error from exc

    # ------------------------------------------------------------------------------------------ shutdown
    def shutdown(self) -> None:
        """Stop the workers and remove the placement group the executor made. Leaves no worker, no process of
        their world and no placement group behind; the executor may ``start`` again."""
        workers, self.workers, self.members = self.workers, [], []
        if workers and not self._stopped:
            leaving = [w.leave.remote() for w in workers]
            ray.wait(leaving, num_returns=len(leaving), timeout=LEAVE_S)
        self._kill(workers)
        if self._placement is not None:
            self._placement.remove()
            self._placement = None
        self._stopped = None

    @staticmethod
    def _kill(workers: list[Any]) -> None:
        for w in workers:
            ray.kill(w, no_restart=True)
        # Wait until Ray counts them dead: their processes are gone, and so are their world's placeholders.
        pings = [w.__ray_ready__.remote() for w in workers]
        if pings:
            ray.wait(pings, num_returns=len(pings), timeout=KILL_S)


def _call(fn: Callable[..., Any], args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None) -> Callable[[Any], Any]:
    args, kwargs = list(args or ()), dict(kwargs or {})
    return lambda _executable: fn(*args, **kwargs)
