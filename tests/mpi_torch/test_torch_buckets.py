"""Gradient buckets of horo.torch's gradient exchange: one allreduce per bucket (not per parameter), the
rebuild from the order gradients arrived, compression, unused parameters, mixed dtypes, and ranks whose
buckets differ raising on every rank."""

from __future__ import annotations

import json

import pytest
import torch
from torch_mpi_util import agree, comm

pytestmark = pytest.mark.mpi

DATA = torch.Generator().manual_seed(11)
X = torch.randn(192, 6, generator=DATA)
Y = (X @ torch.randn(6, 3, generator=DATA)).tanh()


class Backwards(torch.nn.Module):
    """Registers its layers in the opposite order of their use, so backward reaches the first registered
    parameters last: reverse registration order, the initial bucket order, is wrong here."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.out = torch.nn.Linear(16, 3)
        self.mid = torch.nn.Linear(16, 16)
        self.inp = torch.nn.Linear(6, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.mid(torch.tanh(self.inp(x)))))


def _train(hvd, model, rank, world, steps, **exchange):
    from horo.torch import GradientExchange

    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters())
    opt._exchange.remove_hooks()
    opt._exchange = ex = GradientExchange(list(model.named_parameters()), **exchange)
    for step in range(steps):
        opt.zero_grad()
        start = (step * world + rank) * 4
        torch.nn.functional.mse_loss(model(X[start:start + 4]), Y[start:start + 4]).backward()
        opt.step()
    return opt, ex


def _reference(world, steps):
    ref = Backwards()
    opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        opt.zero_grad()
        big = slice(step * world * 4, (step + 1) * world * 4)
        torch.nn.functional.mse_loss(ref(X[big]), Y[big]).backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in ref.parameters()])


def test_buckets_rebuilt_in_arrival_order_and_equal_one_process(hvd, rank, world):
    model = Backwards()
    # Small caps: each layer's weight closes a bucket (its bias comes first in reverse registration order).
    names = {p: n for n, p in model.named_parameters()}
    from horo.torch import GradientExchange

    initial = GradientExchange(list(model.named_parameters()), first_bucket_bytes=16 * 4, bucket_bytes=16 * 4)
    first = [names[p].split(".")[0] for b in initial.buckets.buckets for p in b.params]
    initial.remove_hooks()
    opt, ex = _train(hvd, model, rank, world, steps=4, first_bucket_bytes=16 * 4, bucket_bytes=16 * 4)
    layers = [names[p].split(".")[0] for b in ex.buckets.buckets for p in b.params]
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    ref = _reference(world, 4)
    every = hvd.allgather_object(flat)

    def check():
        assert ex.buckets.rebuilt
        # Backward reaches `out` first and `inp` last: the rebuilt buckets follow that order.
        assert first == ["inp", "inp", "mid", "mid", "out", "out"]  # reverse registration order
        assert layers == ["out", "out", "mid", "mid", "inp", "inp"]
        assert len(ex.buckets.buckets) >= 3
        assert torch.allclose(flat, ref, atol=1e-5), (flat - ref).abs().max()
        assert all(torch.equal(e, every[0]) for e in every)
    agree(check)


def test_one_allreduce_per_bucket_in_the_engine(hvd, rank, world, shared_tmp):
    """Counted twice: by the exchange, and by the names the engine's timeline saw in one step."""
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(6)])  # 12 parameters
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    ex = opt._exchange
    for _ in range(2):  # the first step rebuilds the buckets
        opt.zero_grad()
        model(X[:4, :1].repeat(1, 32)).sum().backward()
        opt.step()
    trace = shared_tmp / "timeline.json"
    hvd.start_timeline(str(trace))
    opt.zero_grad()
    before = ex.exchanges
    model(X[:4, :1].repeat(1, 32)).sum().backward()
    opt.step()
    in_step = ex.exchanges - before
    hvd.stop_timeline()
    names = set()
    if rank == 0:
        events = json.loads(trace.read_text())
        names = {e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    names = comm().bcast(names, root=0)

    def check():
        assert len(ex.buckets.buckets) == 1  # 12 parameters, 12.7 KiB: one bucket of the default sizes
        assert in_step == 1
        assert {n for n in names if n.startswith("horo.bucket.")} == {ex.buckets.buckets[0].name}, names
    agree(check)


def test_fp16_compression_and_unused_parameter_in_buckets(hvd, rank, world):
    from horo.torch import Compression, GradientExchange

    a = torch.nn.Parameter(torch.ones(5))
    b = torch.nn.Parameter(torch.ones(3))
    c = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))  # a second dtype: its own bucket
    opt = hvd.DistributedOptimizer(torch.optim.SGD([a, b, c], lr=1.0), named_parameters=[("a", a), ("b", b),
                                                                                          ("c", c)])
    opt._exchange.remove_hooks()
    opt._exchange = ex = GradientExchange([("a", a), ("b", b), ("c", c)], compression=Compression.fp16)
    # Rank 0 leaves b unused: it contributes zeros, and still gets the average of the others'.
    loss = (a * (rank + 1)).sum() + (c * 2).sum() + ((b * (rank + 1)).sum() if rank else 0)
    loss.backward()
    opt.step()
    mean_a = sum(r + 1 for r in range(world)) / world
    mean_b = sum(r + 1 for r in range(1, world)) / world

    def check():
        assert len(ex.buckets.buckets) == 2
        assert torch.allclose(a.grad, torch.full((5,), mean_a))
        assert torch.allclose(b.grad, torch.full((3,), mean_b), atol=1e-3)  # averaged in float16
        assert c.grad.dtype == torch.float64 and torch.allclose(c.grad, torch.full((4,), 2.0, dtype=torch.float64))
    agree(check)


def test_ranks_with_different_buckets_raise_on_every_rank(hvd, rank, world):
    if world == 1:
        pytest.skip("needs two ranks")
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 3))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    from horo.torch import GradientExchange

    opt._exchange.remove_hooks()
    # Rank 0 puts every gradient into one bucket, the others one bucket per layer.
    opt._exchange = GradientExchange(list(model.named_parameters()),
                                     first_bucket_bytes=(1 << 20) if rank == 0 else 4, bucket_bytes=(1 << 20))
    raised = None
    try:  # rank 1 starts a bucket during backward, rank 0 only at its end: both raise, neither hangs
        model(X[:4]).sum().backward()
        opt.step()
    except hvd.MismatchError as exc:
        raised = str(exc)
    opt._exchange.reset(wait=False)

    def check():
        assert raised is not None and "different gradient buckets" in raised, raised
    agree(check)


def test_bad_bucket_sizes_are_refused(hvd):
    from horo.torch import GradientExchange

    p = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(ValueError, match="bucket_bytes=-1"):
        GradientExchange([("p", p)], bucket_bytes=-1)
    with pytest.raises(ValueError, match="first_bucket_bytes=1.5"):
        GradientExchange([("p", p)], first_bucket_bytes=1.5)


def test_assign_fills_each_key_to_its_caps():
    from horo.torch.buckets import assign

    sizes = [4, 4, 8, 30, 2, 2, 40, 1]
    keys = ["f32", "f32", "f32", "f32", "f16", "f16", "f32", "f16"]
    # f32: the first bucket closes at >= 8 bytes, later ones at >= 32; f16 likewise, on its own.
    assert assign(range(8), sizes, keys, 8, 32) == [[0, 1], [2, 3], [4, 5, 7], [6]]
    assert assign([7, 6, 5, 4, 3, 2, 1, 0], sizes, keys, 8, 32) == [[7, 5, 4], [6], [3, 2], [1, 0]]
    assert assign([], [], [], 8, 32) == []


def test_host_buckets_keep_the_grad_objects_and_stay_exact(hvd, rank, world):
    """On the host a reduced bucket becomes the gradients' memory (no copy back): the grad objects stay the same,
    gradients zeroed in place accumulate in the bucket, and every step's result is exact."""
    from horo.torch import GradientExchange

    ps = [torch.nn.Parameter(torch.zeros(n)) for n in (300, 7, 5000, 64)]
    ex = GradientExchange([(f"kept{i}", p) for i, p in enumerate(ps)], op=hvd.Sum, bucket_bytes=1200,
                          first_bucket_bytes=1)
    seen = []
    for step in range(6):
        for p in ps:
            if step % 2 and p.grad is not None:
                p.grad.zero_()  # zero_grad(set_to_none=False): the next backward accumulates into it
            else:
                p.grad = None
        if step % 3 == 2:  # steps 2 and 5: a backward pass that only accumulates, then one exchanged
            ex.active = False
            sum((p * (rank + 1 + step)).sum() for p in ps).backward()
            ex.active = True
        sum((p * (rank + 1 + step)).sum() for p in ps).backward()
        grads = [p.grad for p in ps]
        ex.synchronize()
        want = sum(r + 1 + step for r in range(world)) * (2 if step % 3 == 2 else 1)
        seen.append((all(p.grad is g for p, g in zip(ps, grads)),
                     all(torch.equal(p.grad, torch.full_like(p, float(want))) for p in ps)))

    def check():
        assert len(ex.buckets.buckets) >= 3
        assert seen == [(True, True)] * 6, seen
    agree(check)


@pytest.mark.parametrize("bucket_bytes", [None, 0])
def test_find_unused_leaves_none_where_no_rank_had_a_gradient(hvd, rank, world, bucket_bytes):
    """``find_unused`` (the Lightning strategies' DDP behaviour): a parameter no rank used keeps ``grad=None``, one
    used on some ranks gets the average with the others' zeros, in buckets (flags) and exchanged on its own
    (a used-map); with ``grad_views=False`` a gradient kept from one step is not changed by the next."""
    from horo.torch import GradientExchange

    used, some, never = (torch.nn.Parameter(torch.zeros(6)) for _ in range(3))
    ex = GradientExchange([("used", used), ("some", some), ("never", never)], find_unused=True, grad_views=False,
                          bucket_bytes=bucket_bytes, first_bucket_bytes=8)
    seen, kept = [], []
    for step in range(4):
        for p in (used, some, never):
            p.grad = None
        loss = (used * (rank + step)).sum() + ((some * (rank + 1)).sum() if rank % 2 == 0 else 0)
        loss.backward()
        ex.synchronize()
        kept.append((used.grad, used.grad.clone()))
        seen.append((used.grad.tolist(), None if some.grad is None else some.grad.tolist(), never.grad))
    evens = [r + 1 for r in range(world) if r % 2 == 0]

    def check():
        for step, (u, s, n) in enumerate(seen):
            assert u == pytest.approx([sum(r + step for r in range(world)) / world] * 6)
            assert s == pytest.approx([sum(evens) / world] * 6)  # rank 0 always used it: every rank gets the average
            assert n is None
        assert all(torch.equal(g, copy) for g, copy in kept)
    agree(check)


def test_without_find_unused_a_missing_gradient_is_zeros(hvd, rank, world):
    """Horovod's behaviour, kept by DistributedOptimizer: a parameter without a gradient gets zeros and the average."""
    from horo.torch import GradientExchange

    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3))
    ex = GradientExchange([("a", a), ("b", b)])
    (a * (rank + 1)).sum().backward()
    ex.synchronize()
    got = (a.grad.tolist(), b.grad.tolist())

    def check():
        assert got[0] == pytest.approx([sum(range(1, world + 1)) / world] * 3) and got[1] == [0.0] * 3
    agree(check)
