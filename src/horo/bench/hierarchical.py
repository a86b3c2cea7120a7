"""Hierarchical vs flat allreduce of the ResNet-50 gradient set, next to raw mpi4py doing the same.

Run across hosts, e.g. on the emulated cluster (docs/multihost.md) with 2 hosts x 2 ranks:
``hororun ... -np 4 -H node1:2,node2:2 python -m horo.bench hierarchical``. Variants, interleaved:

- ``raw flat``: one ``MPI_Allreduce`` of the whole set packed in one buffer (mpi4py);
- ``raw hier``: the same buffer by hand: ``Reduce`` in the host, ``Allreduce`` between host leaders, ``Bcast``;
- ``horo flat`` / ``horo hier``: ``horo.grouped_allreduce`` of the 161 tensors with
  ``HORO_HIERARCHICAL_ALLREDUCE`` 0 / 1 (switched on every rank between variants).

Targets: horo hier >= 0.95x raw hier, and hier faster than flat when more than one host holds more than one
rank (then the link carries one rank's data per host instead of several).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

import horo
from horo.bench._util import busbw, env_summary, fmt_size, limit_threads, md_table, time_interleaved
from horo.bench.fusion import resnet50_shapes
from horo.core.base.config import config
from horo.core.transport import hierarchy
from horo.core.transport.comms import duplicate

__all__ = ["main", "wire_floor"]

_FRAME = 1514 / 1448  # bytes on the wire per payload byte: a full TCP segment with timestamps at MTU 1500


def wire_floor(nbytes: int, hosts: int, link_gbit: float) -> float:
    """Seconds any allreduce of ``nbytes`` needs on ``hosts`` hosts whose links each carry ``link_gbit``.

    Every host must send (and receive) at least 2(H-1)/H of the data over its one link, whatever the
    algorithm: its ranks' contribution out, the others' in.
    """
    return nbytes * 2 * (hosts - 1) / hosts * _FRAME * 8 / (link_gbit * 1e9)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m horo.bench hierarchical", description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=2, help="steps per timed sample (default 2)")
    p.add_argument("--repeats", type=int, default=5, help="samples per variant (default 5)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="share of the set's bytes to use, tensors taken in order (default 1: all 97.5 MiB)")
    p.add_argument("--link-gbit", type=float, default=None, help="link rate, to report busbw as a fraction of it")
    p.add_argument("--stat", choices=["median", "min"], default="median")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if not 0 < args.scale <= 1:
        raise ValueError(f"--scale must be in (0, 1]. Received: scale={args.scale!r}. HINT: --scale 0.25")
    limit_threads()

    horo.init()
    from mpi4py import MPI

    comm = duplicate(MPI.COMM_WORLD)
    rank, n = comm.Get_rank(), comm.Get_size()
    shapes, budget = [], args.scale * sum(4 * int(np.prod(s)) for _, s in resnet50_shapes())
    for name, shape in resnet50_shapes():  # the set's own order, until the share of its bytes is reached
        if shapes and sum(4 * int(np.prod(s)) for _, s in shapes) >= budget:
            break
        shapes.append((name, shape))
    rng = np.random.default_rng(rank)
    tensors = [rng.standard_normal(int(np.prod(shape))).astype(np.float32).reshape(shape) for _, shape in shapes]
    total = sum(t.nbytes for t in tensors)
    flat_buf = np.concatenate([t.reshape(-1) for t in tensors])
    topo = hierarchy.topology(comm)

    def raw_flat() -> None:
        comm.Allreduce(MPI.IN_PLACE, flat_buf, op=MPI.SUM)

    def raw_hier() -> None:
        if topo.local.Get_size() > 1:
            topo.local.Reduce(MPI.IN_PLACE if topo.leader else flat_buf, flat_buf if topo.leader else None,
                              op=MPI.SUM, root=0)
        if topo.leader:
            topo.leaders.Allreduce(MPI.IN_PLACE, flat_buf, op=MPI.SUM)
        if topo.local.Get_size() > 1:
            topo.local.Bcast(flat_buf, root=0)

    def horo_with(hier: float) -> Any:
        def run() -> None:
            config["HORO_HIERARCHICAL_ALLREDUCE"] = hier
            horo.grouped_allreduce(tensors, op=horo.Sum, name="hier.bench")
        return run

    variants = {"raw flat": raw_flat, "raw hier": raw_hier, "horo flat": horo_with(0.0), "horo hier": horo_with(1.0)}
    timing = time_interleaved(comm, variants, args.iters, args.repeats)
    config["HORO_HIERARCHICAL_ALLREDUCE"] = 0.0
    if rank == 0:
        hosts = [len(g) for g in topo.hosts]
        print(f"# {env_summary(n)}")
        print(f"# {len(tensors)} tensors, {fmt_size(total)}; hosts x ranks: {hosts}; stat {args.stat}\n")
        rows = []
        for name in variants:
            t = timing.stat(name, args.stat)
            bw = busbw(total, t, n)
            link = f"{bw * 8 / args.link_gbit:.2f}" if args.link_gbit else "-"
            rows.append([name, f"{t * 1e3:.1f}", f"{bw:.3f}", link, f"{timing.spread(name):.0%}"])
        print(md_table(["variant", "ms/step", "busbw GB/s", "busbw/link", "spread"], rows))
        s = {k: timing.stat(k, args.stat) for k in variants}
        ratio = s["raw hier"] / s["horo hier"]
        print(f"\n- horo hier vs raw hier: {ratio:.2f} (target >= 0.95) {'PASS' if ratio >= 0.95 else 'FAIL'}")
        if topo.useful:
            gain = s["horo flat"] / s["horo hier"]
            print(f"- horo hier vs horo flat: {gain:.2f}x faster (target > 1 when hosts hold several ranks) "
                  f"{'PASS' if gain > 1 else 'FAIL'}")
            if args.link_gbit:
                floor = wire_floor(total, len(topo.hosts), args.link_gbit)
                best = min(s.values())
                print(f"- the wire's limit: {floor * 1e3:.0f} ms (each host's link must carry 2(H-1)/H of the set "
                      f"each way, TCP/IP and Ethernet headers at MTU 1500 included); the fastest variant is at "
                      f"{floor / best:.0%} of it, so no algorithm can be more than {best / floor:.2f}x faster")
        else:
            print("- hier vs flat: not meaningful here (one host, or one rank per host)")
    horo.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
