"""Cross-rank agreement before each collective: mismatches raise on every rank instead of deadlocking.

Every collective first allgathers a 16-byte header per rank: an 8-byte hash of its signature (the
collective, name, dtype, shape, op, root, scale factors, ...) and one integer of payload (dim 0 for
allgather). Signature hashes are cached, so the steady-state cost is one tiny allgather. When hashes
differ, all ranks take the slow path together: they allgather the full signatures, and every rank raises
the same MismatchError naming each rank's values. A rank inside ``join()`` takes part with the JOIN
signature: allreduces then proceed with that rank contributing zeros.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from ..base import worlds
from ..base.errors import MismatchError
from ..base.ops import Average, Sum
from ..base.watchdog import guarded

__all__ = ["Signature", "JOIN", "BLOCKED", "agree", "agree_reduce", "exchange", "format_mismatch", "joinable",
           "sig_hash", "agree_prepared", "agree_prepared_reduce", "prepared", "agree_choice", "MARK"]

Signature = tuple  # tuple of (field, value) pairs, hashable and picklable

JOIN: Signature = (("collective", "join"),)

class _Blocked:
    """Which communicator the caller's thread waits in for an agreement, read by the engines' rounds: a peer
    that leaves (shutdown, exit) while another rank waits for it here on a process set would hang the job."""

    comm: Any = None
    seq = 0  # counts agreements, so a wait seen twice is known to be the same wait


BLOCKED = _Blocked()

_HASHES: dict[Signature, int] = {}
_CACHE_LIMIT = 1 << 16


def sig_hash(sig: Signature) -> int:
    """The signature's 64-bit digest, the same on every rank (what the agreement compares)."""
    return _hash(sig)


def _hash(sig: Signature) -> int:
    h = _HASHES.get(sig)
    if h is None:
        if len(_HASHES) >= _CACHE_LIMIT:  # unbounded unique names must not grow memory
            _HASHES.clear()
        digest = hashlib.blake2b(_canonical(sig).encode(), digest_size=8).digest()
        h = _HASHES[sig] = int.from_bytes(digest, "little", signed=True)
    return h


_BUFFERS: dict[int, tuple[int, np.ndarray, np.ndarray, list[Any], list[Any]]] = worlds.cache("agreement buffers")


def _buffers(comm: Any) -> tuple[int, np.ndarray, np.ndarray, list[Any], list[Any]]:
    # Reused per communicator: this runs before every synchronous collective. The typed buffer specs spare
    # mpi4py a format parse per call (~0.4 µs).
    key = comm.py2f()
    bufs = _BUFFERS.get(key)
    size = comm.Get_size()
    if bufs is None or bufs[0] != size:
        from mpi4py import MPI

        send, recv = np.empty(2, dtype=np.int64), np.empty(2 * size, dtype=np.int64)
        bufs = _BUFFERS[key] = (size, send, recv, [send, MPI.INT64_T], [recv, MPI.INT64_T])
    return bufs


def _canonical(sig: Signature) -> str:
    # repr() of a dtype or an enum is stable across processes, unlike hash(); str keeps it short.
    return repr(tuple((k, str(v) if isinstance(v, np.dtype) else v) for k, v in sig))


@guarded("the agreement step before a collective")
def exchange(comm: Any, sig: Signature, payload: int = 0,
             h: int | None = None) -> tuple[list[int], list[Signature] | None]:
    """Allgather (hash, payload); on disagreement also allgather the full signatures.

    Args:
        h: ``sig``'s hash when the caller kept it from an earlier call (see collectives' repeat calls).

    Returns:
        The per-rank payloads, and the per-rank signatures when they differ (else None).
    """
    if h is None:
        h = _hash(sig)
    values = _allgather_hash(comm, h, payload)
    payloads = values[1::2]
    if values[0::2].count(h) == len(payloads):
        return payloads, None
    return payloads, comm.allgather(sig)


def _allgather_hash(comm: Any, h: int, payload: int) -> list[int]:
    """Every rank's (hash, payload), flattened: the one MPI call of an agreement."""
    _, send, recv, send_spec, recv_spec = _buffers(comm)
    send[0] = h
    send[1] = payload
    _gather(comm, send_spec, recv_spec)
    return recv.tolist()


def _gather(comm: Any, send_spec: list[Any], recv_spec: list[Any]) -> None:
    """The agreement's ``Allgather``, with this thread's wait recorded in ``BLOCKED`` for the engines."""
    BLOCKED.seq += 1
    BLOCKED.comm = comm
    try:
        comm.Allgather(send_spec, recv_spec)
    finally:
        BLOCKED.comm = None


MARK = 2  # payload bit: this rank takes the first rank's choice of form (agree_choice)


def prepared(comm: Any, h: int, payload: int = 0) -> tuple[list[Any], list[Any], np.ndarray, bytes]:
    """The buffers of :func:`agree_prepared` (or, with ``payload=MARK``, :func:`agree_choice`) for one signature
    hash on ``comm``, made once per repeat entry."""
    from mpi4py import MPI

    send = np.array([h, payload], dtype=np.int64)
    recv = np.empty(2 * comm.Get_size(), dtype=np.int64)
    return [send, MPI.INT64_T], [recv, MPI.INT64_T], recv, np.tile(send, comm.Get_size()).tobytes()


def agree_prepared(comm: Any, bufs: tuple[list[Any], list[Any], np.ndarray, bytes], sig: Signature, h: int,
                   ranks: list[int] | None) -> None:
    """:func:`agree` without a payload or the watchdog, with the buffers of :func:`prepared`: the synchronous
    allreduce's repeat calls run it (see repeat.py).

    Every rank that agrees sends the very same 16 bytes (hash, payload 0), so equal bytes prove agreement;
    anything else goes through the full comparison.
    """
    send_spec, recv_spec, recv, expected = bufs
    _gather(comm, send_spec, recv_spec)
    if recv.tobytes() != expected:
        hashes = recv.tolist()[0::2]
        if hashes.count(h) != len(hashes):
            _disagree(comm.allgather(sig), ranks)


def agree_prepared_reduce(comm: Any, bufs: tuple[list[Any], list[Any], np.ndarray, bytes], sig: Signature, h: int,
                          ranks: list[int] | None) -> bool:
    """:func:`agree_prepared` for an allreduce: True when some ranks are inside ``join()`` (see
    :func:`agree_reduce`); the prepared allreduces of ``prepared.py`` run it."""
    send_spec, recv_spec, recv, expected = bufs
    _gather(comm, send_spec, recv_spec)
    if recv.tobytes() == expected:
        return False
    hashes = recv.tolist()[0::2]
    if hashes.count(h) == len(hashes):
        return False
    _disagree(comm.allgather(sig), ranks)
    return True


def agree_choice(comm: Any, bufs: tuple[list[Any], list[Any], np.ndarray, bytes], sig: Signature, h: int,
                 ranks: list[int] | None, choice: int) -> int:
    """:func:`agree_prepared` that also carries the first rank's ``choice`` (see pieces.py).

    Returns:
        The first rank's choice when every rank sent ``MARK`` (each takes it), else 0: some rank runs a path
        that does not read it (a first call, or ``join()``), and 0 is the form that path runs.
    """
    send_spec, recv_spec, recv, expected = bufs
    send_spec[0][1] = MARK | choice
    _gather(comm, send_spec, recv_spec)
    if recv.tobytes() == expected:  # all marked, the first rank's choice 0
        return 0
    values = recv.tolist()
    hashes, payloads = values[0::2], values[1::2]
    if hashes.count(h) != len(hashes):
        _disagree(comm.allgather(sig), ranks)  # returns when the others are joined ranks, which run form 0
    if all(p & MARK for p in payloads):
        return payloads[0] & ~MARK
    return 0


def joinable(sig: Signature) -> bool:
    fields = dict(sig)
    return fields.get("collective") in ("allreduce", "grouped_allreduce") and fields.get("op") in (Sum, Average)


def agree(comm: Any, sig: Signature, payload: int = 0, ranks: list[int] | None = None,
          h: int | None = None) -> list[int]:
    """Check that every rank of ``comm`` calls the same collective; return the per-rank payloads.

    Args:
        comm: the process set's communicator.
        sig: this rank's signature.
        payload: one int64 carried along (e.g. dim 0 for allgather).
        ranks: global ranks of the set's members, for the message.
        h: ``sig``'s hash, when already known.

    Raises:
        MismatchError: on every rank, when the signatures differ.
    """
    payloads, sigs = exchange(comm, sig, payload, h)
    if sigs is not None:
        _disagree(sigs, ranks)
    return payloads


def agree_reduce(comm: Any, sig: Signature, ranks: list[int] | None = None) -> bool:
    """:func:`agree` for an allreduce; True when some ranks are inside ``join()`` (they contribute zeros).

    Raises:
        MismatchError: on every rank, when the signatures differ other than by joined ranks.
    """
    _, sigs = exchange(comm, sig)
    if sigs is None:
        return False
    _disagree(sigs, ranks)
    return True


def _disagree(sigs: list[Signature], ranks: list[int] | None) -> None:
    """Raise the mismatch, unless the only difference is ranks that joined (they contribute zeros)."""
    active = [s for s in sigs if s != JOIN]
    if active and len(active) < len(sigs) and all(s == active[0] for s in active) and joinable(active[0]):
        return  # see collectives.join
    raise MismatchError(format_mismatch(sigs, ranks))


def _fmt(value: Any) -> str:
    if isinstance(value, (str, np.dtype)):
        return str(value)
    if isinstance(value, tuple) and value and all(isinstance(v, np.dtype) for v in value):
        return "(" + ", ".join(str(v) for v in value) + ")"
    return repr(value)


def format_mismatch(sigs: list[Signature], ranks: list[int] | None = None) -> str:
    """One message, identical on every rank, naming each rank's differing fields."""
    ranks = ranks if ranks is not None else list(range(len(sigs)))
    dicts = [dict(s) for s in sigs]
    fields: list[str] = []
    for d in dicts:
        fields.extend(f for f in d if f not in fields)
    differing = [f for f in fields if len({repr(d.get(f)) for d in dicts}) > 1]
    if "collective" in differing:  # different calls: show what each rank was doing
        differing = ["collective"] + [f for f in ("name",) if f in differing]
    what = "horo" if "collective" in differing else f"horo.{dicts[0].get('collective', 'collective')}"
    parts = []
    for r, d in zip(ranks, dicts):
        shown = ", ".join(f"{f}={_fmt(d.get(f, '<none>'))}" for f in differing)
        parts.append(f"rank {r}: {shown}")
    joined = [r for r, s in zip(ranks, sigs) if s == JOIN]
    hint = (
        f" Ranks {joined} have called join(): only Sum/Average allreduces can run while a rank is joined."
        if joined else ""
    )
    return (
        f"{what}: ranks disagree on {', '.join(differing)}: " + "; ".join(parts) + "."
        + hint + " HINT: every rank of a process set must call the same collectives in the same order with"
        " the same dtype, shape, op, root and scale factors."
    )
