"""The ``horo`` backend of torch.distributed: every collective, for every dtype torch.distributed moves on CPU
(gloo's: bool, uint8, int8, int32, int64, float16, bfloat16, float32, float64, complex64, complex128; plus
int16 and uint16, which horo adds, and uint32, uint64, float8 for the collectives that only move data),
sub-groups, object collectives, async work, mismatches and bad input.

Inputs are deterministic per rank, so every rank recomputes the expected results of all ranks locally.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from torch_mpi_util import agree, comm, use_default_group

# torch 2.13 renames all_gather_into_tensor / reduce_scatter_tensor (FutureWarning); Lightning and torchmetrics
# still call them, so they are what is tested here.
pytestmark = [pytest.mark.mpi, pytest.mark.filterwarnings("ignore::FutureWarning")]

R = dist.ReduceOp
GLOO = [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
        torch.float64, torch.complex64, torch.complex128]
DTYPES = [*GLOO, torch.int16, torch.uint16]
MOVED_ONLY = [torch.uint32, torch.uint64, torch.float8_e4m3fn]


@pytest.fixture(scope="module", autouse=True)
def horo_group(hvd):
    """torch.distributed's default group on the horo backend, for this module."""
    use_default_group("horo")
    yield
    use_default_group(None)


def value(r: int, dtype: torch.dtype, n: int = 6) -> torch.Tensor:
    """Rank r's input: small values, so sums and products are exact in every dtype."""
    i = torch.arange(n)
    if dtype == torch.bool:
        return (i + r) % 3 == 0
    if dtype.is_complex:
        return torch.complex(i * 0.5 - r, -i * 0.25 + r).to(dtype)
    if dtype.is_floating_point:
        return ((i % 4) * 0.5 - r * 0.25 + 0.5).to(dtype)
    if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
        return ((i + 2 * r) % 5 + 1).to(dtype)
    return ((i + 2 * r) % 5 - 2).to(dtype)


def expected(dtype: torch.dtype, op: object, n: int, size: int = 6) -> torch.Tensor:
    xs = torch.stack([value(r, dtype, size) for r in range(n)])
    if dtype == torch.bool:
        return {R.SUM: xs.any(0), R.MAX: xs.any(0), R.MIN: xs.all(0), R.PRODUCT: xs.all(0), R.BAND: xs.all(0),
                R.BOR: xs.any(0), R.BXOR: xs.sum(0) % 2 == 1}[op]
    if op in (R.BAND, R.BOR, R.BXOR):
        fold = {R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or, R.BXOR: torch.bitwise_xor}[op]
        out = xs[0]
        for x in xs[1:]:
            out = fold(out, x)
        return out
    wide = xs.to(torch.complex128 if dtype.is_complex else torch.float64 if dtype.is_floating_point else torch.int64)
    if op == R.SUM:
        return wide.sum(0).to(dtype)
    if op == R.AVG:
        return (wide.mean(0) if dtype.is_floating_point or dtype.is_complex
                else torch.div(wide.sum(0), n, rounding_mode="trunc")).to(dtype)
    if op == R.PRODUCT:
        return wide.prod(0).to(dtype)
    return (wide.amax(0) if op == R.MAX else wide.amin(0)).to(dtype)


def ops_for(dtype: torch.dtype) -> list[object]:
    if dtype.is_complex:
        return [R.SUM, R.AVG]
    ops = [R.SUM, R.MIN, R.MAX, R.PRODUCT]
    if dtype != torch.bool:
        ops.append(R.AVG)
    if not dtype.is_floating_point:
        ops += [R.BAND, R.BOR, R.BXOR]
    return ops


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if got.dtype in (torch.float16, torch.bfloat16):
        return torch.allclose(got.double(), want.double(), atol=0.02)
    return torch.equal(got, want)


def test_default_group_is_horo(hvd, world, rank):
    from horo.torch.process_group import HoroProcessGroup

    group = dist.distributed_c10d._get_default_group()

    def check():
        assert dist.get_backend() == "horo" and isinstance(group, HoroProcessGroup)
        assert (dist.get_rank(), dist.get_world_size()) == (rank, world)
        assert hvd.process_set_of() is hvd.global_process_set and hvd.process_set_of(group) is hvd.global_process_set
    agree(check)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_reduce_and_reduce(hvd, world, rank, dtype):
    got, want = {}, {}
    for op in ops_for(dtype):
        t = value(rank, dtype)
        dist.all_reduce(t, op=op)
        got[op], want[op] = t, expected(dtype, op, world)
    root = world - 1
    red = value(rank, dtype)
    dist.reduce(red, dst=root, op=R.SUM)
    coalesced = [value(rank, dtype), value(rank, dtype, 3)]
    dist.all_reduce_coalesced(coalesced, op=R.SUM)

    def check():
        for op in got:
            assert close(got[op], want[op]), (op, got[op], want[op])
        if rank == root:
            assert close(red, expected(dtype, R.SUM, world))
        assert close(coalesced[0], expected(dtype, R.SUM, world))
        assert close(coalesced[1], expected(dtype, R.SUM, world, 3))
    agree(check)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reduce_scatter(hvd, world, rank, dtype):
    got = {}
    for op in [o for o in ops_for(dtype) if o in (R.SUM, R.AVG, R.MAX)]:
        out = torch.empty(6, dtype=dtype)
        dist.reduce_scatter(out, [value(rank, dtype) for _ in range(world)], op=op)
        out2 = torch.empty(2, 3, dtype=dtype)
        dist.reduce_scatter_tensor(out2, torch.cat([value(rank, dtype)] * world).reshape(world * 2, 3), op=op)
        got[op] = (out, out2)

    def check():
        for op, (out, out2) in got.items():
            assert close(out, expected(dtype, op, world)), (op, out)
            assert close(out2, expected(dtype, op, world).reshape(2, 3)), (op, out2)
    agree(check)


@pytest.mark.parametrize("dtype", DTYPES + MOVED_ONLY, ids=str)
def test_data_movement(hvd, world, rank, dtype):
    def mine(r: int = rank) -> torch.Tensor:
        return value(r, dtype if dtype not in MOVED_ONLY else torch.uint8).to(dtype)

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))

    root = world - 1
    b = mine()
    dist.broadcast(b, src=root)
    gathered = [torch.empty(6, dtype=dtype) for _ in range(world)]
    dist.all_gather(gathered, mine())
    flat = torch.empty(world * 6, dtype=dtype)
    dist.all_gather_into_tensor(flat, mine())
    g = [torch.empty(6, dtype=dtype) for _ in range(world)] if rank == 0 else None
    dist.gather(mine(), g, dst=0)
    sc = torch.empty(6, dtype=dtype)
    dist.scatter(sc, [mine(r) for r in range(world)] if rank == root else None, src=root)
    outs = [torch.empty(2, dtype=dtype) for _ in range(world)]
    dist.all_to_all(outs, [mine()[2 * (r % 3):2 * (r % 3) + 2].clone() for r in range(world)])
    single = torch.empty(world * 2, dtype=dtype)
    dist.all_to_all_single(single, torch.cat([mine()[:2]] * world))

    def check():
        assert same(b, mine(root))
        for r in range(world):
            assert same(gathered[r], mine(r)) and same(flat[6 * r:6 * r + 6], mine(r))
            if rank == 0:
                assert same(g[r], mine(r))
            assert same(outs[r], mine(r)[2 * (rank % 3):2 * (rank % 3) + 2])
            assert same(single[2 * r:2 * r + 2], mine(r)[:2])
        assert same(sc, mine(rank))
    agree(check)


def test_layouts_and_shapes(hvd, world, rank):
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) + rank
    t = base.clone().t()  # not contiguous
    dist.all_reduce(t)
    b = (torch.zeros(4, 3) + rank).t()
    dist.broadcast(b, src=0)
    outs = [torch.empty(4, 3).t() for _ in range(world)]
    dist.all_gather(outs, base)
    scalar = torch.tensor(float(rank + 1))
    dist.all_reduce(scalar, op=R.MAX)
    empty = torch.empty(0, 5)
    dist.all_reduce(empty)
    ref = sum(torch.arange(12, dtype=torch.float32).reshape(3, 4) + r for r in range(world))

    def check():
        assert torch.equal(t, ref.t()) and torch.equal(b, torch.zeros(3, 4))
        assert all(torch.equal(o, torch.arange(12, dtype=torch.float32).reshape(3, 4) + r) for r, o in enumerate(outs))
        assert scalar.item() == world and empty.shape == (0, 5)
    agree(check)


def test_object_collectives(hvd, world, rank):
    objs = [{"rank": rank}, "x" * rank] if rank == 0 else [None, None]
    dist.broadcast_object_list(objs, src=0)
    every = [None] * world
    dist.all_gather_object(every, ("r", rank, list(range(rank))))
    at_root = [None] * world if rank == 0 else None
    dist.gather_object({"g": rank}, at_root, dst=0)
    got = [None]
    dist.scatter_object_list(got, [f"for {r}" for r in range(world)] if rank == world - 1 else None, src=world - 1)

    def check():
        assert objs == [{"rank": 0}, ""]
        assert every == [("r", r, list(range(r))) for r in range(world)]
        if rank == 0:
            assert at_root == [{"g": r} for r in range(world)]
        assert got == [f"for {rank}"]
    agree(check)


def test_async_work_and_barrier(hvd, world, rank):
    t = torch.ones(4) * rank
    work = dist.all_reduce(t, async_op=True)
    done = work.wait()
    fut = dist.all_reduce(torch.ones(2), async_op=True).get_future()
    dist.barrier()

    def check():
        assert done and work.is_completed() and torch.equal(t, torch.full((4,), float(sum(range(world)))))
        assert torch.equal(fut.wait()[0], torch.full((2,), float(world)))
    agree(check)


def test_sub_groups(hvd, world, rank):
    members = [0, world - 1] if world > 1 else [0]
    group = dist.new_group(members)
    everyone = dist.new_group(list(range(world)))
    results = {}
    if rank in members:
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=group)
        b = torch.tensor([float(rank)])
        dist.broadcast(b, src=members[-1], group=group)
        outs = [torch.empty(1) for _ in members]
        dist.all_gather(outs, torch.tensor([float(rank)]), group=group)
        results = {"sum": t.item(), "bcast": b.item(), "gather": [o.item() for o in outs],
                   "ranks": hvd.process_set_of(group).ranks, "group_rank": dist.get_rank(group)}
    t_all = torch.ones(1)
    dist.all_reduce(t_all, group=everyone)

    def check():
        assert t_all.item() == world and hvd.process_set_of(everyone) is hvd.global_process_set
        if rank in members:
            assert results == {"sum": float(sum(set(members))), "bcast": float(members[-1]),
                               "gather": [float(m) for m in sorted(set(members))], "ranks": sorted(set(members)),
                               "group_rank": sorted(set(members)).index(rank)}
        else:
            assert group == dist.GroupMember.NON_GROUP_MEMBER
    agree(check)


@pytest.mark.parametrize("case", ["all_reduce vs broadcast", "all_gather shapes", "broadcast dtypes"])
def test_mismatch_raises_on_every_rank_within_2s(hvd, world, rank, case):
    if world == 1:
        pytest.skip("a mismatch needs two ranks")
    comm().Barrier()  # start together: the 2 s measure horo, not how late a busy machine let a peer arrive
    start = time.monotonic()
    try:
        if case == "all_reduce vs broadcast":
            dist.all_reduce(torch.ones(3)) if rank == 0 else dist.broadcast(torch.ones(3), src=0)
        elif case == "all_gather shapes":
            n = 2 if rank == 0 else 3
            dist.all_gather([torch.empty(n) for _ in range(world)], torch.ones(n))
        else:
            dist.broadcast(torch.ones(3, dtype=torch.float32 if rank == 0 else torch.float64), src=0)
        err = None
    except Exception as exc:  # noqa: BLE001 - checked below on every rank
        err = exc
    elapsed = time.monotonic() - start
    dist.barrier()  # the group still works afterwards

    def check():
        assert isinstance(err, hvd.MismatchError), repr(err)
        assert elapsed < 2.0, elapsed
    agree(check)


def test_bad_input_raises_before_communicating(hvd, world, rank):
    def check():
        with pytest.raises(ValueError, match=f"list of {world} tensors .*Received: {world + 1} tensors"):
            dist.all_gather([torch.empty(2)] * (world + 1), torch.ones(2))
        with pytest.raises(ValueError, match="must hold group size"):
            dist.all_gather_into_tensor(torch.empty(world * 2 + 1), torch.ones(2))
        with pytest.raises(ValueError, match="PREMUL_SUM"):
            dist.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(2.0))
        with pytest.raises(TypeError, match="bitwise"):
            dist.all_reduce(torch.ones(2), op=R.BAND)
        with pytest.raises(RuntimeError, match="HINT"):
            dist.send(torch.ones(1), dst=0) if rank != 0 else dist.recv(torch.ones(1), src=world - 1)
    agree(check)
    dist.barrier()


def test_init_process_group_plain_call_and_wrong_rank(hvd, world, rank, monkeypatch):
    """``init_process_group("horo")`` under an MPI launcher needs no MASTER_ADDR; ranks must be horo's."""
    dist.destroy_process_group()
    for var in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):  # Lightning's DDP leaves them set
        monkeypatch.delenv(var, raising=False)
    dist.init_process_group("horo")
    plain = (dist.get_backend(), dist.get_rank(), dist.get_world_size())
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    err = gloo_err = None
    start = time.monotonic()
    if world > 1:
        try:
            dist.init_process_group("horo", store=dist.HashStore(), rank=(rank + 1) % world, world_size=world)
        except ValueError as exc:
            err = exc
        if dist.is_initialized():
            dist.destroy_process_group()
        try:  # horo's env:// store serves the horo backend only: gloo fails at once, naming the cause
            dist.init_process_group("gloo")
        except RuntimeError as exc:
            gloo_err = exc
        if dist.is_initialized():
            dist.destroy_process_group()
    elapsed = time.monotonic() - start
    use_default_group("horo")

    def check():
        assert plain == ("horo", rank, world) and t.item() == world
        if world > 1:
            assert err is not None and "Received: rank=" in str(err) and "HINT" in str(err)
            assert gloo_err is not None and "MASTER_ADDR" in str(gloo_err), gloo_err
            assert elapsed < 10, elapsed
    agree(check)


def test_ddp_on_the_horo_backend(hvd, world, rank):
    """torch's DistributedDataParallel itself on the horo group: rank 0's start, averaged gradients."""
    torch.manual_seed(rank)  # different starts: DDP broadcasts rank 0's
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0001)  # several buckets
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(8 * world, 5, generator=g), torch.randn(8 * world, 2, generator=g)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x[rank::world]), y[rank::world]).backward()
        opt.step()
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        ref_opt.zero_grad()
        (sum(torch.nn.functional.mse_loss(ref(x[r::world]), y[r::world]) for r in range(world)) / world).backward()
        ref_opt.step()
    diff = max(float((a - b).detach().abs().max()) for a, b in zip(model.parameters(), ref.parameters()))

    def check():
        assert diff < 1e-6, diff
    agree(check)
