"""What carries a gradient exchange inside ``jax.jit``: horo's ordered host callback against the alternatives.

Run under a launcher: ``hororun -np 2 python -m horo.bench jax_carriers [--rounds 15]``.

Every carrier reduces (averages) the same list of float32 arrays shaped like the gradients of an MLP
784-1024-512-10 (1.33 M parameters, 5.3 MB), inside one jitted function, and the result is checked against
the exact average before timing:

- horo           ``horo.jax`` / Keras-on-JAX's exchange: one ordered ``io_callback`` per call into horo's
                 fused allreduce (agreement on names, shapes and dtypes, one MPI call per dtype)
- bare mpi4py    one ordered ``io_callback``, then one ``Allreduce`` per array into kept buffers (no checks)
- mpi4jax        ``mpi4jax.allreduce`` per array: XLA custom calls into MPI (only if mpi4jax is installed; it
                 compiles against mpi4py's MPI at install time, so it is never a dependency of horo)
- XLA collectives  ``psum`` in a ``shard_map`` over a multi-process ``jax.distributed`` world that this tool
                 initialises from the MPI ranks (rank, size and a loopback coordinator address passed
                 explicitly), with gloo as JAX's CPU collectives: what ``keras.distribution.DataParallel``
                 runs on. ``--no-xla`` leaves it out.

The variants run interleaved in rotating order ``--rounds`` times; each sample is the median of ``--reps``
calls. Reported: the median per carrier, and each one's speed relative to horo paired within rounds (the
median over rounds of horo's time / the carrier's in the same round).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import horo
from horo.bench._util import env_summary, md_table
from horo.plugins.fused import FusedAllreduce

SHAPES = [(784, 1024), (1024,), (1024, 512), (512,), (512, 10), (10,)]


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m horo.bench jax_carriers", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15, help="interleaved samples per carrier")
    p.add_argument("--reps", type=int, default=10, help="calls per sample (its median is the sample)")
    p.add_argument("--no-xla", action="store_true", help="leave out the jax.distributed + gloo carrier")
    return p.parse_args(argv)


def _init_jax_distributed(comm: Any) -> bool:
    """A multi-process JAX world from the MPI ranks (before any other JAX call); False when it fails."""
    import jax

    addr = None
    if comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            addr = f"127.0.0.1:{s.getsockname()[1]}"
    addr = comm.bcast(addr, 0)
    try:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=addr, num_processes=comm.Get_size(),
                                   process_id=comm.Get_rank(), initialization_timeout=60)
    except Exception as exc:  # noqa: BLE001 - reported, the other carriers still run
        if comm.Get_rank() == 0:
            print(f"XLA collectives left out: jax.distributed.initialize failed ({exc})", file=sys.stderr)
        return False
    return True


def _carriers(comm: Any, xla: bool) -> dict[str, Callable[[list[Any]], list[Any]]]:
    import jax
    import numpy as np
    from jax.experimental import io_callback
    from mpi4py import MPI

    # lazy: horo.jax imports JAX, which the bench's --help does not need
    from horo.jax.exchange import reduce_gradients

    size = comm.Get_size()
    fused = FusedAllreduce()
    out: dict[str, Callable[[list[Any]], list[Any]]] = {
        "horo": jax.jit(lambda gs: reduce_gradients(gs, op=horo.Average, name="bench.jax", fused=fused)),
    }
    bufs = [np.empty(s, np.float32) for s in SHAPES]

    def bare_host(*arrays: Any) -> list[Any]:
        for a, b in zip(arrays, bufs):
            comm.Allreduce(np.asarray(a), b, op=MPI.SUM)
        return bufs

    specs = [jax.ShapeDtypeStruct(s, np.float32) for s in SHAPES]
    out["bare mpi4py"] = jax.jit(lambda gs: list(io_callback(bare_host, specs, *[g / size for g in gs],
                                                               ordered=True)))
    try:
        import mpi4jax

        mcomm = comm.Clone()
        out["mpi4jax"] = jax.jit(lambda gs: [mpi4jax.allreduce(g / size, op=MPI.SUM, comm=mcomm) for g in gs])
    except ImportError:
        if comm.Get_rank() == 0:
            print("mpi4jax left out: not installed (docs/design-keras.md says why)", file=sys.stderr)
    if xla:
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        try:
            from jax import shard_map
        except ImportError:  # older JAX
            from jax.experimental.shard_map import shard_map
        mesh = Mesh(np.array(jax.devices()), ("ranks",))
        spec = NamedSharding(mesh, P("ranks"))
        local = jax.local_devices()[0]
        psum = jax.jit(shard_map(lambda *gs: [jax.lax.psum(g, "ranks") / size for g in gs], mesh=mesh,
                                 in_specs=P("ranks"), out_specs=P("ranks")))

        def xla_collectives(gs: list[Any]) -> list[Any]:
            glob = [jax.make_array_from_single_device_arrays((size, *g.shape), spec,
                                                             [jax.device_put(g[None], local)]) for g in gs]
            return [o.addressable_shards[0].data[0] for o in psum(*glob)]

        out["XLA collectives (gloo)"] = xla_collectives
    return out


def main(argv: list[str]) -> int:
    args = _parse(list(argv))
    if args.rounds < 1 or args.reps < 1:
        print(f"python -m horo.bench jax_carriers: --rounds and --reps must be >= 1. Received: --rounds="
              f"{args.rounds}, --reps={args.reps}. HINT: the defaults are 15 and 10.", file=sys.stderr)
        return 2
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    xla = not args.no_xla and comm.Get_size() > 1 and _init_jax_distributed(comm)
    import jax
    import jax.numpy as jnp
    import numpy as np

    horo.init()
    rank, size = comm.Get_rank(), comm.Get_size()
    grads = [jnp.asarray(np.random.default_rng(rank + i).standard_normal(s), jnp.float32)
             for i, s in enumerate(SHAPES)]
    want = [np.mean([np.random.default_rng(r + i).standard_normal(s).astype(np.float32) for r in range(size)],
                    axis=0) for i, s in enumerate(SHAPES)]
    carriers = _carriers(comm, xla)
    for name, fn in carriers.items():  # compile, warm up, and check the result
        got = jax.block_until_ready(fn(grads))
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-6, err_msg=name)
    names = list(carriers)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times = []
            for _ in range(args.reps):
                comm.Barrier()
                t0 = time.perf_counter()
                jax.block_until_ready(carriers[name](grads))
                times.append(time.perf_counter() - t0)
            samples[name].append(statistics.median(times))
    if rank == 0:
        rows = []
        for name in names:
            paired = statistics.median(h / t for h, t in zip(samples["horo"], samples[name]))
            rows.append([name, f"{statistics.median(samples[name]) * 1e3:.2f}", f"{paired:.2f}x"])
        print(f"Exchange of 5.3 MB of float32 gradients (6 arrays) inside jax.jit at {size} ranks, median of "
              f"{args.rounds} rounds x {args.reps} calls")
        print(md_table(["carrier", "ms / exchange", "speed vs horo (paired)"], rows))
        print(env_summary(size))
    horo.shutdown()
    if xla:
        jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
