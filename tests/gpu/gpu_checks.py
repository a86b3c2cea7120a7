"""GPU collective checks, run inside MPI ranks by tests/gpu/test_nccl_gpu.py (not collected by pytest).

    mpiexec -n N python tests/gpu/gpu_checks.py {cupy|torch} EXPECTED_MODE

Every device collective (sync and async, every dtype and op) runs on GPU tensors and is compared with the
host collective on numpy copies of the same data. EXPECTED_MODE is ``nccl`` or ``staged``: the mode the
process set's backend must have chosen. Prints ``GPU CHECKS OK`` on rank 0, or the failures.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

Arr = Any


def run_checks(to_dev: Callable[[np.ndarray], Arr], to_host: Callable[[Arr], np.ndarray],
               is_dev: Callable[[Arr], bool], dtypes: list[np.dtype], expect_mode: str) -> list[str]:
    """All checks; returns this rank's failures. horo must be initialised."""
    import horo
    from horo.core.api import collectives as C
    from horo.core.api.process_sets import global_process_set
    from horo.core.base.dtypes import BFLOAT16
    from horo.core.transport import nccl as N

    n, me = horo.size(), horo.rank()
    rng = np.random.default_rng(7 + me)
    fails: list[str] = []

    def data(dt: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        if dt == np.bool_:
            return rng.integers(0, 2, shape).astype(bool)
        if dt.kind == "u":
            return rng.integers(0, 5, shape).astype(dt)
        return rng.integers(-4, 5, shape).astype(np.float32).astype(dt)  # small ints: exact in fp16 / bf16

    def same(got: Arr, want: np.ndarray, what: str, inplace_of: Arr | None = None) -> None:
        if inplace_of is not None and got is not inplace_of:
            fails.append(f"{what}: in-place op did not return its input")
        if not is_dev(got):
            fails.append(f"{what}: result is not a GPU tensor of the input's type: {type(got).__name__}")
            return
        g = to_host(got)
        if g.shape != want.shape or g.dtype != want.dtype:
            fails.append(f"{what}: shape/dtype {g.shape} {g.dtype}, want {want.shape} {want.dtype}")
            return
        if want.dtype.kind == "f" or want.dtype == BFLOAT16:
            tol = 1e-2 if want.dtype.itemsize == 2 else 1e-6
            ok = np.allclose(g.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
        else:
            ok = np.array_equal(g, want)
        if not ok:
            fails.append(f"{what}: got {g.ravel()[:6]}, want {want.ravel()[:6]}")

    def guard(what: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - report every failing case, keep going
            fails.append(f"{what}: {type(exc).__name__}: {exc}")

    def allreduce_case(x: np.ndarray, op: Any, pre: float, post: float, want: np.ndarray, what: str) -> None:
        same(horo.allreduce(to_dev(x), op=op, prescale_factor=pre, postscale_factor=post), want, what)
        t = to_dev(x)
        same(horo.allreduce_(t, op=op, prescale_factor=pre, postscale_factor=post), want, what + " in place",
             inplace_of=t)
        h = horo.allreduce_async(to_dev(x), name="chk.a", op=op, prescale_factor=pre, postscale_factor=post)
        same(horo.synchronize(h), want, what + " async")
        t = to_dev(x)
        h = horo.allreduce_async_(t, name="chk.b", op=op, prescale_factor=pre, postscale_factor=post)
        same(horo.synchronize(h), want, what + " async in place", inplace_of=t)

    # First op creates the backend: check the mode it chose.
    horo.allreduce(to_dev(np.ones(4, np.float32)))
    be = N.backend_for(global_process_set.comm, None)
    if be.mode != expect_mode:
        fails.append(f"backend mode {be.mode!r} ({be.reason}), expected {expect_mode!r}")

    ops = [horo.Sum, horo.Average, horo.Min, horo.Max, horo.Product]
    for dt in dtypes:
        for op in ops:
            if dt == np.bool_ and op is horo.Average:
                continue
            scales = [(1.0, 1.0)] + ([(0.5, 4.0)] if dt.kind == "f" or dt == BFLOAT16 else [])
            for pre, post in scales:
                for shape in ((5, 3), (0,), (1,)):
                    x = data(dt, shape)
                    want = C.allreduce(x.copy(), op=op, prescale_factor=pre, postscale_factor=post)
                    what = f"allreduce {dt} {op} pre={pre} shape={shape}"
                    guard(what, functools.partial(allreduce_case, x, op, pre, post, want, what))
        x = data(dt, (3 + me, 2, 2))
        guard(f"allgather {dt}", lambda x=x, dt=dt: (
            same(horo.allgather(to_dev(x)), C.allgather(x), f"allgather {dt}"),
            same(horo.synchronize(horo.allgather_async(to_dev(x), name="chk.g")), C.allgather(x),
                 f"allgather async {dt}")))
        for root in range(n):
            x = data(dt, (4, 3))
            want = C.broadcast(x, root)

            def bcast(x: np.ndarray = x, want: np.ndarray = want, root: int = root, dt: np.dtype = dt) -> None:
                same(horo.broadcast(to_dev(x), root), want, f"broadcast {dt} root={root}")
                t = to_dev(x)
                same(horo.broadcast_(t, root), want, f"broadcast_ {dt} root={root}", inplace_of=t)
                same(horo.synchronize(horo.broadcast_async(to_dev(x), root, name="chk.c")), want,
                     f"broadcast async {dt}")
                t = to_dev(x)
                same(horo.synchronize(horo.broadcast_async_(t, root, name="chk.d")), want,
                     f"broadcast async_ {dt}", inplace_of=t)

            guard(f"broadcast {dt}", bcast)
        splits = [(me + r) % 3 for r in range(n)]
        x = data(dt, (sum(splits), 3))
        want, wsplits = C.alltoall(x, splits)

        def a2a(x: np.ndarray = x, want: np.ndarray = want, wsplits: Any = wsplits, dt: np.dtype = dt,
                splits: list[int] = splits) -> None:
            got, gs = horo.alltoall(to_dev(x), splits)
            same(got, want, f"alltoall {dt}")
            got, gs2 = horo.synchronize(horo.alltoall_async(to_dev(x), splits, name="chk.e"))
            same(got, want, f"alltoall async {dt}")
            if list(gs) != list(wsplits) or list(gs2) != list(wsplits):
                fails.append(f"alltoall splits {list(gs)} / {list(gs2)}, want {list(wsplits)}")

        guard(f"alltoall {dt}", a2a)
        if dt != np.bool_:
            for dim0 in (2 * n, 2 * n + 1, 1):
                x = data(dt, (dim0, 3))
                for op in (horo.Sum, horo.Average):
                    want = C.reducescatter(x, op=op)
                    guard(f"reducescatter {dt} {dim0} {op}", lambda x=x, want=want, op=op, dt=dt, dim0=dim0: (
                        same(horo.reducescatter(to_dev(x), op=op), want, f"reducescatter {dt} {dim0} {op}"),
                        same(horo.synchronize(horo.reducescatter_async(to_dev(x), op=op, name="chk.f")), want,
                             f"reducescatter async {dt} {dim0} {op}")))

    # grouped, mixed dtypes (small ones fused, one large one reduced in place)
    xs = [data(dt, (3, 2)) for dt in dtypes if dt != np.bool_] + [data(np.dtype(np.float32), (1 << 21,))]
    wants = C.grouped_allreduce([x.copy() for x in xs], op=horo.Sum)

    def grouped() -> None:
        for i, g in enumerate(horo.grouped_allreduce([to_dev(x) for x in xs], op=horo.Sum)):
            same(g, wants[i], f"grouped[{i}]")
        ts = [to_dev(x) for x in xs]
        for i, g in enumerate(horo.grouped_allreduce_(ts, op=horo.Sum)):
            same(g, wants[i], f"grouped_[{i}]", inplace_of=ts[i])
        res = horo.synchronize(horo.grouped_allreduce_async([to_dev(x) for x in xs], name="chk.h", op=horo.Sum))
        for i, g in enumerate(res):
            same(g, wants[i], f"grouped async[{i}]")

    guard("grouped", grouped)
    return fails


def _framework(kind: str) -> tuple[Any, Any, Any, list[np.dtype]]:
    from horo.core.base.dtypes import BFLOAT16, SUPPORTED_DTYPES

    if kind == "cupy":
        import cupy

        def to_dev(h: np.ndarray) -> Any:
            return cupy.asarray(h)

        dtypes = [d for d in SUPPORTED_DTYPES if d != BFLOAT16]
        with contextlib.suppress(Exception):  # CuPy 14 with ml_dtypes has bfloat16 arrays; CuPy 13 does not
            cupy.asarray(np.zeros(1, dtype=BFLOAT16))
            dtypes.append(BFLOAT16)
        return to_dev, cupy.asnumpy, lambda x: isinstance(x, cupy.ndarray), dtypes
    import torch

    from horo.core.transport import device

    dev = torch.device("cuda", device.default_device())

    def to_dev_t(h: np.ndarray) -> Any:
        if h.dtype == BFLOAT16:
            return torch.from_numpy(h.view(np.int16).copy()).view(torch.bfloat16).to(dev)
        return torch.from_numpy(h.copy()).to(dev)

    def to_host_t(t: Any) -> np.ndarray:
        if t.dtype == torch.bfloat16:
            return t.detach().cpu().view(torch.int16).numpy().view(BFLOAT16)
        return t.detach().cpu().numpy()

    return to_dev_t, to_host_t, lambda t: isinstance(t, torch.Tensor) and t.is_cuda, list(SUPPORTED_DTYPES)


def main(argv: list[str]) -> int:
    kind, expect = argv[0], argv[1]
    import cupy

    import horo
    from horo.core.transport import device

    horo.init()
    cupy.cuda.Device(device.default_device()).use()
    to_dev, to_host, is_dev, dtypes = _framework(kind)
    fails = run_checks(to_dev, to_host, is_dev, dtypes, expect)
    from mpi4py import MPI

    code = report(MPI.COMM_WORLD, fails, "GPU CHECKS")
    horo.shutdown()
    return code


def report(comm: Any, fails: list[str], label: str, shown: int = 20) -> int:
    """Print every rank's failures and ``label`` OK/FAILED on rank 0; the exit code, the same on every rank."""
    everyone = comm.allgather(fails)
    if comm.Get_rank() == 0:
        for r, fs in enumerate(everyone):
            for line in fs[:shown]:
                print(f"rank {r}: {line}")
        print(f"{label} OK" if not any(everyone) else f"{label} FAILED ({sum(map(len, everyone))})")
    return 0 if not any(everyone) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
