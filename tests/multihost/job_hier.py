"""Run on the bed under hororun: hierarchical allreduce/allgather must equal the flat ones on every rank."""

import sys

import numpy as np

import horo
from horo.core.base.config import config

horo.init()
rank, size = horo.rank(), horo.size()
rng = np.random.default_rng(1234 + rank)
cases = []
for dtype in (np.int32, np.int64, np.float32, np.float64):
    # 300k x 8 B > 8 x the 1 MiB chunk for 64-bit: the chunked path too; 100,003: an odd-sized last piece
    for n in (1, 7, 1000, 100_003, 300_000):
        data = (rng.integers(-1000, 1000, n) if np.dtype(dtype).kind == "i" else rng.standard_normal(n)).astype(dtype)
        cases.append(data)


def run(hier: bool) -> list:
    config["HORO_HIERARCHICAL_ALLREDUCE"] = config["HORO_HIERARCHICAL_ALLGATHER"] = float(hier)
    out = []
    for i, data in enumerate(cases):
        out.append(horo.allreduce(data, op=horo.Sum, name=f"s{i}"))
        out.append(horo.allreduce(data, op=horo.Average, name=f"a{i}"))
        out.append(horo.allreduce(data, op=horo.Max, name=f"m{i}"))
        buf = data.copy()
        scale = {"prescale_factor": 2.0, "postscale_factor": 0.5} if data.dtype.kind == "f" else {}
        out.append(horo.allreduce_(buf, op=horo.Sum, name=f"i{i}", **scale))
    out.extend(horo.grouped_allreduce([c[:5] for c in cases[:8]], op=horo.Sum, name="g"))
    rows = (rank % 3) + 1  # uneven dim 0 per rank
    out.append(horo.allgather(np.full((rows, 3), rank, dtype=np.int64), name="ag"))
    out.append(horo.allgather(np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) + rank, name="agf"))
    out.append(horo.allgather(np.zeros((0, 4), dtype=np.int32) if rank == 0 else np.ones((2, 4), np.int32),
                              name="ag0"))
    return out


flat, hier = run(False), run(True)
from horo.core.transport import mpi_ops  # noqa: E402

mpi_ops._HIER_PIECE_BYTES = 64 << 10  # force the hierarchical path to pipeline the larger arrays in pieces
hier_pieces = run(True)
bad = []
for k, (a, b) in enumerate(zip(flat * 2, hier + hier_pieces)):
    if a.dtype.kind in "iu":
        ok = a.shape == b.shape and np.array_equal(a, b)
    else:
        ok = a.shape == b.shape and np.allclose(a, b, rtol=1e-5, atol=1e-5)
    if not ok:
        bad.append(k)
# Every rank must hold the very same bits (identical weights everywhere), not only values close to flat's.
import hashlib  # noqa: E402

digest = hashlib.sha256(b"".join(np.ascontiguousarray(x).tobytes() for x in hier + hier_pieces)).hexdigest()
if len(set(horo.allgather_object(digest))) != 1:
    bad.append("ranks differ")
expected_rows = sum((r % 3) + 1 for r in range(size))
ag = hier[-3]
assert ag.shape == (expected_rows, 3) and ag[:, 0].tolist() == [r for r in range(size) for _ in range((r % 3) + 1)]
from horo.core.transport import hierarchy  # noqa: E402

topo = hierarchy.topology(horo.core.base.state.state.world)
print(f"HIER rank={rank} hosts={topo.hosts} useful={topo.useful} bad={bad}", flush=True)
horo.shutdown()
sys.exit(1 if bad else 0)
