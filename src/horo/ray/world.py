"""How Ray's workers become one horo world: ranks by host, the joining variables, and each worker's part.

Ray starts each worker as an actor; no MPI launcher started them. The driver orders the workers by host (the
ranks of a host consecutive, so ``local_rank`` and ``cross_rank`` come out right), asks rank 0's worker for a
free port, and gives every worker the ``HORO_JOIN_*`` variables with a fresh secret. ``horo.init()`` in the
workers then joins them into one MPI world (``horo.core.transport.adopt``, docs/design-join.md). MPI starts
once per process: the world lasts as long as the actors, and a new world needs new actors.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..core.api.runtime import is_initialized, shutdown
from ..core.transport import adopt

__all__ = ["Member", "free_port", "join_envs", "leave", "member", "prepare", "rank_order"]

#: What makes ``horo.init()`` believe an MPI launcher or srun started the process (a Ray cluster started under
#: ``srun`` or ``mpiexec`` passes them to every worker): the joined world describes the worker instead.
_LAUNCHER_PREFIXES = ("OMPI_COMM_WORLD_", "PMIX_", "PMI_", "MV2_COMM_WORLD_")
_LAUNCHER_NAMES = ("MPI_LOCALRANKID", "SLURM_STEP_ID", "SLURM_PROCID")


@dataclass(frozen=True)
class Member:
    """Where one worker runs: its Ray node, address, host name, process and the GPUs Ray gave it."""

    node_id: str
    ip: str
    hostname: str
    pid: int
    gpu_ids: tuple[str, ...] = field(default=())


def member() -> Member:
    """This worker's :class:`Member` (runs in the worker)."""
    import ray

    gpus = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
    return Member(node_id=ray.get_runtime_context().get_node_id(), ip=ray.util.get_node_ip_address(),
                  hostname=socket.gethostname(), pid=os.getpid(), gpu_ids=tuple(str(g) for g in gpus))


def free_port(ip: str) -> int:
    """A port free now on ``ip`` (runs in rank 0's worker: the rendezvous listens there)."""
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def rank_order(members: Sequence[Member]) -> list[int]:
    """Indices of ``members`` in rank order: host by host (in order of first appearance), and on a host by
    the lowest GPU Ray gave each (so local rank k holds the k-th of the host's GPUs), else as given."""
    hosts: dict[str, list[int]] = {}
    for i, m in enumerate(members):
        hosts.setdefault(m.node_id, []).append(i)

    def gpu_key(i: int) -> tuple[int, ...]:
        ids = [int(g) for g in members[i].gpu_ids if g.isdigit()]
        return (min(ids),) if ids else ()

    return [i for group in hosts.values() for i in sorted(group, key=lambda i: (gpu_key(i), i))]


def join_envs(ordered: Sequence[Member], port: int, timeout_s: float, launcher: str,
              share_gpus: bool = False) -> list[dict[str, str]]:
    """The environment of each worker, in rank order, for one world of ``ordered`` (see the module docstring).

    ``share_gpus``: every worker of a host sees all the GPUs Ray gave that host's workers, local rank k's own
    first at index k (Horovod's convention: ``torch.cuda.set_device(hvd.local_rank())``)."""
    secret = secrets.token_hex(32)
    master = ordered[0].ip
    local: dict[str, int] = {}
    gpus: dict[str, list[str]] = {}
    for m in ordered:
        gpus.setdefault(m.node_id, []).extend(m.gpu_ids)
    envs = []
    for rank, m in enumerate(ordered):
        env = {"HORO_JOIN_SIZE": str(len(ordered)), "HORO_JOIN_RANK": str(rank),
               "HORO_JOIN_LOCAL_RANK": str(local.get(m.node_id, 0)), "HORO_JOIN_ADDR": master,
               "HORO_JOIN_PORT": str(port), "HORO_JOIN_SECRET": secret, "HORO_JOIN_LAUNCHER": launcher,
               "HORO_JOIN_TIMEOUT": f"{float(timeout_s):g}"}
        local[m.node_id] = local.get(m.node_id, 0) + 1
        if share_gpus and gpus[m.node_id]:
            # Workers sharing a GPU (fractional gpus_per_worker) name it once.
            env["CUDA_VISIBLE_DEVICES"] = ",".join(dict.fromkeys(gpus[m.node_id]))
        envs.append(env)
    return envs


def prepare(env: dict[str, str]) -> None:
    """Set a worker's environment for its world (runs in the worker, before ``horo.init()``)."""
    for name in [n for n in os.environ if n.startswith(_LAUNCHER_PREFIXES) or n in _LAUNCHER_NAMES]:
        del os.environ[name]
    os.environ.update({k: str(v) for k, v in env.items()})


def leave() -> None:
    """End this worker's part of its world (runs in every worker of it at once): horo's shutdown, then MPI's
    end and the placeholder told. The actor is killed next; this keeps its end from looking like a failure."""
    if is_initialized():
        shutdown()
    adopt.leave()
