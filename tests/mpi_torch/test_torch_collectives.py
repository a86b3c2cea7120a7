"""horo.torch collectives on torch tensors: values, dtypes, layouts, in-place/async forms, gradients, state.

Inputs are deterministic per rank, so every rank recomputes the expected results of all ranks locally.
"""

from __future__ import annotations

import pytest
import torch
from torch_mpi_util import agree

pytestmark = pytest.mark.mpi


def rank_tensor(r: int, shape: tuple[int, ...] = (3, 4), dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + r)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    if not dtype.is_floating_point:
        return torch.randint(0, 9, shape, generator=g).to(dtype)
    return (torch.rand(shape, generator=g) * 8 - 4).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
                                   torch.int64, torch.uint8, torch.int8])
def test_allreduce_values_and_dtypes(hvd, world, rank, dtype):
    mine = rank_tensor(rank, dtype=dtype)
    total = hvd.allreduce(mine, op=hvd.Sum)
    avg = hvd.allreduce(mine)
    ref = sum(rank_tensor(r, dtype=dtype).double() for r in range(world))
    tol = 0.05 * world if dtype in (torch.float16, torch.bfloat16) else 1e-6

    def check():
        assert total.dtype == dtype and total.shape == mine.shape
        assert torch.allclose(total.double(), ref, atol=tol), (total, ref)
        if dtype.is_floating_point:
            assert torch.allclose(avg.double(), ref / world, atol=tol)
        else:
            assert torch.equal(avg.double(), torch.div(ref, world, rounding_mode="trunc"))  # as Horovod
    agree(check)


def test_bool_and_scale_factors(hvd, world, rank):
    flags = hvd.allreduce(torch.tensor([rank == 0, False, True]), op=hvd.Sum)
    scaled = hvd.allreduce(torch.ones(2), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    mx = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Max)

    def check():
        assert flags.tolist() == [True, False, True]
        assert scaled.tolist() == [float(world)] * 2
        assert mx.item() == world - 1
    agree(check)


def test_any_layout(hvd, world, rank):
    base = rank_tensor(rank, (4, 6))
    ref = sum(rank_tensor(r, (4, 6)) for r in range(world))
    views = {
        "transposed": base.t(), "strided": base[:, ::2], "expanded": torch.tensor([1.0 + rank]).expand(5),
        "scalar": torch.tensor(2.0 + rank), "channels_last": base.reshape(1, 2, 3, 4).to(
            memory_format=torch.channels_last),
    }
    expect = {
        "transposed": ref.t(), "strided": ref[:, ::2], "expanded": torch.full((5,), sum(1.0 + r for r in range(world))),
        "scalar": torch.tensor(sum(2.0 + r for r in range(world))), "channels_last": ref.reshape(1, 2, 3, 4),
    }
    got = {k: hvd.allreduce(v, op=hvd.Sum) for k, v in views.items()}
    inplace_target = rank_tensor(rank, (4, 6)).t()  # in place on a non-contiguous view: written through it
    owner = inplace_target.t()
    hvd.allreduce_(inplace_target, op=hvd.Sum)

    def check():
        for k in views:
            assert got[k].shape == expect[k].shape, k
            assert torch.allclose(got[k], expect[k], atol=1e-5), k
        assert torch.allclose(owner, ref, atol=1e-5)
    agree(check)


def test_inplace_async_and_grouped_forms(hvd, world, rank):
    t = torch.full((3,), float(rank))
    same = hvd.allreduce_(t, op=hvd.Sum)
    h1 = hvd.allreduce_async(torch.full((2,), float(rank)), name="t.async", op=hvd.Sum)
    x = torch.full((2,), float(rank))
    h2 = hvd.allreduce_async_(x, name="t.async_", op=hvd.Sum)
    done = hvd.synchronize(h1)
    out_ = hvd.synchronize(h2)
    polled = hvd.poll(hvd.allreduce_async(torch.zeros(1), name="t.poll"))  # may be False; must not raise
    del polled
    b = torch.full((2,), float(rank))
    hb = hvd.broadcast_async_(b, root_rank=world - 1)
    bb = hvd.synchronize(hb)
    nb = hvd.synchronize(hvd.broadcast_async(torch.full((2,), float(rank)), root_rank=0))
    gs = hvd.grouped_allreduce([torch.ones(2) * rank, torch.ones(3, dtype=torch.float64)], op=hvd.Sum)
    gi = [torch.ones(2) * rank, torch.ones(1)]
    hvd.grouped_allreduce_(gi, op=hvd.Sum)
    ga = hvd.synchronize(hvd.grouped_allreduce_async([torch.ones(1) * rank], op=hvd.Sum))
    ag = hvd.synchronize(hvd.allgather_async(torch.full((rank + 1, 2), float(rank))))
    rs = hvd.synchronize(hvd.reducescatter_async(torch.ones(world * 2, 3), op=hvd.Sum))
    out, splits = hvd.synchronize(hvd.alltoall_async(torch.arange(world, dtype=torch.float32) + 10 * rank))
    s = float(sum(range(world)))

    def check():
        assert same is t and t.tolist() == [s] * 3
        assert done.tolist() == [s] * 2 and out_ is x and x.tolist() == [s] * 2
        assert bb is b and b.tolist() == [float(world - 1)] * 2 and nb.tolist() == [0.0, 0.0]
        assert gs[0].tolist() == [s] * 2 and gs[1].dtype == torch.float64 and gs[1].tolist() == [float(world)] * 3
        assert gi[0].tolist() == [s] * 2 and gi[1].tolist() == [float(world)]
        assert ga[0].tolist() == [s]
        assert ag.shape == (sum(r + 1 for r in range(world)), 2)
        assert rs.shape == (2, 3) and rs.eq(world).all()
        assert out.tolist() == [float(rank + 10 * r) for r in range(world)] and splits.tolist() == [1] * world
    agree(check)


def test_compression(hvd, world, rank):
    t = torch.linspace(-1, 1, 9, dtype=torch.float32) * (rank + 1)
    ref = torch.linspace(-1, 1, 9) * sum(r + 1 for r in range(world)) / world
    outs = {c: hvd.allreduce(t, compression=getattr(hvd.Compression, c)) for c in ("none", "fp16", "bf16")}
    ints = hvd.allreduce(torch.arange(4) * rank, op=hvd.Sum, compression=hvd.Compression.fp16)

    def check():
        for c, o in outs.items():
            assert o.dtype == torch.float32, c
            assert torch.allclose(o, ref, atol=2e-2 * world), c
        assert ints.dtype == torch.int64
    agree(check)


def test_errors_are_local_and_explain(hvd):
    cases = [
        (lambda: hvd.allreduce([1.0, 2.0]), TypeError, "torch.Tensor"),
        (lambda: hvd.allreduce(torch.zeros(2, dtype=torch.complex64)), TypeError, "view_as_real"),
        (lambda: hvd.allreduce(torch.zeros(3, 3).to_sparse()), TypeError, "to_dense"),
        (lambda: hvd.allgather(torch.tensor(1.0)), ValueError, "HINT"),
    ]

    def check():
        for fn, exc, text in cases:
            with pytest.raises(exc) as info:
                fn()
            assert text in str(info.value)
    agree(check)


# ------------------------------------------------------------------------------------------ gradients
def test_allreduce_grad_accepts_noncontiguous_grad(hvd, world, rank):
    x = torch.full((3, 2), float(rank), requires_grad=True)
    y = hvd.allreduce(x)
    y.sum().backward()  # the incoming gradient is an expanded (non-contiguous) tensor
    xs = torch.ones(4, requires_grad=True)
    (hvd.allreduce(xs, op=hvd.Sum) * (rank + 1)).sum().backward()

    def check():
        assert torch.allclose(x.grad, torch.ones(3, 2))  # Average of ones
        assert xs.grad.tolist() == [float(sum(r + 1 for r in range(world)))] * 4
    agree(check)


def test_allgather_grad(hvd, world, rank):
    x = torch.full((rank + 1, 2), 1.0, requires_grad=True)
    g = hvd.allgather(x)
    w = torch.arange(g.numel(), dtype=torch.float32).reshape(g.shape)
    (g * w).sum().backward()
    start = sum(r + 1 for r in range(rank))

    def check():
        assert torch.allclose(x.grad, world * w[start:start + rank + 1])  # sum of every rank's gradient
    agree(check)


def test_broadcast_grad(hvd, world, rank):
    root = world - 1
    x = torch.full((2,), float(rank), requires_grad=True)
    y = hvd.broadcast(x, root_rank=root)
    (y * (rank + 1)).sum().backward()

    def check():
        assert y.tolist() == [float(root)] * 2
        expected = float(sum(r + 1 for r in range(world))) if rank == root else 0.0
        assert x.grad.tolist() == [expected] * 2
    agree(check)


def test_alltoall_grad(hvd, world, rank):
    splits = [r + 1 for r in range(world)]  # rank r gets r+1 rows from everyone
    x = torch.arange(sum(splits) * 2, dtype=torch.float32).reshape(-1, 2).requires_grad_(True)
    out, received = hvd.alltoall(x, splits=splits)
    (out * (rank + 1)).sum().backward()
    expected = torch.cat([torch.full((r + 1, 2), float(r + 1)) for r in range(world)])

    def check():
        assert received.tolist() == [rank + 1] * world and out.shape == ((rank + 1) * world, 2)
        assert torch.equal(x.grad, expected)
    agree(check)


@pytest.mark.parametrize("op_name", ["Sum", "Average"])
def test_reducescatter_grad(hvd, world, rank, op_name):
    op = getattr(hvd, op_name)
    rows = 2 * world + 1
    x = torch.ones(rows, 3, requires_grad=True)
    y = hvd.reducescatter(x, op=op, prescale_factor=2.0)
    (y * (rank + 1)).sum().backward()
    counts = [rows // world + (1 if r < rows % world else 0) for r in range(world)]
    per_row = torch.cat([torch.full((c, 3), float(r + 1)) for r, c in enumerate(counts)])
    scale = 2.0 / (world if op_name == "Average" else 1)

    def check():
        assert y.shape == (counts[rank], 3)
        assert torch.allclose(y, torch.full_like(y, 2.0 * (world if op_name == "Sum" else 1)))
        assert torch.allclose(x.grad, per_row * scale)
    agree(check)


def test_grouped_allreduce_grad(hvd, world, rank):
    a = torch.ones(2, requires_grad=True)
    b = torch.ones(3, dtype=torch.float64, requires_grad=True)
    ya, yb = hvd.grouped_allreduce([a, b], op=hvd.Sum)
    (ya.sum() * (rank + 1) + yb.sum()).backward()

    def check():
        assert a.grad.tolist() == [float(sum(r + 1 for r in range(world)))] * 2
        assert b.grad.tolist() == [float(world)] * 3
    agree(check)


# ------------------------------------------------------------------------------------------ state
def test_broadcast_parameters_and_objects(hvd, world, rank):
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    model[1].running_mean += rank
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    flat = torch.cat([t.flatten().float() for t in model.state_dict().values()])
    other = torch.nn.Linear(2, 2)
    hvd.broadcast_parameters(other.named_parameters(), root_rank=world - 1)
    every = hvd.allgather_object(flat)
    obj = hvd.broadcast_object({"from": rank}, root_rank=world - 1)
    params = hvd.allgather_object([p.detach().clone() for p in other.parameters()])

    def check():
        assert all(torch.equal(e, every[0]) for e in every)
        assert obj == {"from": world - 1}
        assert all(torch.equal(a, b) for ps in params for a, b in zip(ps, params[0]))
        with pytest.raises(ValueError, match="HINT"):
            hvd.broadcast_parameters(torch.zeros(2), root_rank=0)
    agree(check)


def test_broadcast_optimizer_state_creates_state(hvd, world, rank):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (rank + 1))
    if rank == 0:  # only the root has stepped: the others have empty state
        model(torch.ones(4, 3)).sum().backward()
        opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    sd = opt.state_dict()
    every = hvd.allgather_object((sd["param_groups"][0]["lr"], {k: {n: v.clone() for n, v in s.items()}
                                                                 for k, s in sd["state"].items()}))

    def check():
        lr, state = every[rank]
        assert lr == 0.01 and len(state) == 2
        for _, other in every:
            for k in state:
                for n in state[k]:
                    assert torch.equal(state[k][n], other[k][n]), (k, n)
    agree(check)
    opt2 = torch.optim.SGD(model.parameters(), lr=0.1)  # stateless everywhere: nothing to create, no error
    hvd.broadcast_optimizer_state(opt2, root_rank=0)


def test_distributed_sampler_covers_dataset_once(hvd, world, rank):
    data = list(range(10 * world))
    sampler = hvd.DistributedSampler(data, shuffle=True, seed=3)
    sampler.set_epoch(1)
    seen = hvd.allgather_object(list(sampler))

    def check():
        assert sampler.num_replicas == world and sampler.rank == rank
        assert sorted(i for s in seen for i in s) == data
    agree(check)
