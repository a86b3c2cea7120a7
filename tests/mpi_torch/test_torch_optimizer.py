"""horo.torch.DistributedOptimizer: equivalence with one process on N x the batch, overlap, unused
parameters, names, accumulation, layouts, explicit synchronisation, options."""

from __future__ import annotations

import pytest
import torch
from torch_mpi_util import agree

pytestmark = pytest.mark.mpi

DATA = torch.Generator().manual_seed(7)
X = torch.randn(96, 5, generator=DATA)
Y = (X @ torch.randn(5, 2, generator=DATA)).tanh()


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def shard(step: int, rank: int, world: int, per_rank: int) -> slice:
    start = (step * world + rank) * per_rank
    return slice(start, start + per_rank)


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_matches_one_process_on_n_times_the_batch(hvd, world, rank, opt_name):
    make_opt = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                "adam": lambda p: torch.optim.Adam(p, lr=0.01)}[opt_name]
    per_rank, steps = 4, 96 // (4 * world)
    model = make_model()
    opt = hvd.DistributedOptimizer(make_opt(model.parameters()), named_parameters=model.named_parameters())
    ref = make_model()
    ref_opt = make_opt(ref.parameters())
    for step in range(steps):
        opt.zero_grad()
        s = shard(step, rank, world, per_rank)
        torch.nn.functional.mse_loss(model(X[s]), Y[s]).backward()
        opt.step()
        ref_opt.zero_grad()
        big = slice(step * world * per_rank, (step + 1) * world * per_rank)
        torch.nn.functional.mse_loss(ref(X[big]), Y[big]).backward()
        ref_opt.step()
    every = hvd.allgather_object(flat(model))

    def check():
        assert torch.allclose(flat(model), flat(ref), atol=1e-5), (flat(model) - flat(ref)).abs().max()
        assert all(torch.equal(e, every[0]) for e in every)
    agree(check)


def _with_exchange(opt, model, **kw):
    """Give ``opt`` a gradient exchange with explicit bucket sizes (the environment's are the defaults)."""
    from horo.torch import GradientExchange

    opt._exchange.remove_hooks()
    opt._exchange = GradientExchange(list(model.named_parameters()), **kw)
    return opt._exchange


@pytest.mark.parametrize("buckets", ["per-parameter", "one-per-layer"])
def test_exchange_overlaps_backward(hvd, rank, buckets):
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    # per-parameter: each gradient alone; one-per-layer: a bucket closes at the layer's weight (reverse
    # registration order puts each layer's bias first), so the last layer's bucket can start during backward.
    ex = _with_exchange(opt, model, **({"bucket_bytes": 0} if buckets == "per-parameter" else
                                       {"first_bucket_bytes": 8 * 2 * 4, "bucket_bytes": 8 * 5 * 4}))
    last = model[2].weight
    seen: dict[str, bool] = {}
    hidden = model[1](model[0](X[:4]))

    def during_backward(_):  # after the last layer's gradients are final, before the first layer's exist
        started = last in ex.inflight if ex.buckets is None else ex.buckets.next >= 1
        seen.update(last_layer_in_flight=started, exchanges=ex.exchanges)

    hidden.register_hook(during_backward)
    torch.nn.functional.mse_loss(model[2](hidden), Y[:4]).backward()
    handed_over = sum(ex.started(p) for p in model.parameters())
    exchanges = ex.exchanges
    opt.step()

    def check():
        assert seen == {"last_layer_in_flight": True, "exchanges": 1 if buckets != "per-parameter" else 2}
        assert handed_over == 4  # every gradient was handed over from its hook, during backward
        assert exchanges == (4 if buckets == "per-parameter" else 2)  # one allreduce per bucket
        assert not ex.pending
    agree(check)


def test_unused_parameters_do_not_deadlock(hvd, world, rank):
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.ones(3))
    b = torch.nn.Parameter(torch.ones(2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([a, b], lr=1.0), named_parameters=[("a", a), ("b", b)])
    loss = (a * (rank + 1)).sum() if rank % 2 == 0 else (b * (rank + 1)).sum()  # each rank leaves one unused
    loss.backward()
    opt.step()
    ga = sum(r + 1 for r in range(world) if r % 2 == 0) / world
    gb = sum(r + 1 for r in range(world) if r % 2 == 1) / world

    def check():
        assert torch.allclose(a.grad, torch.full((3,), ga)) and torch.allclose(b.grad, torch.full((2,), gb))
        assert torch.allclose(a.detach(), torch.full((3,), 1 - ga))
    agree(check)


def test_names_are_checked(hvd):
    model = make_model()
    params = list(model.named_parameters())

    def check():
        with pytest.raises(ValueError, match="unique"):
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=[("w", p) for _, p in params])
        with pytest.raises(ValueError, match="misses 2"):
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=params[:2])
        with pytest.raises(ValueError, match="pairs"):
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=[p for _, p in params])
        with pytest.raises(ValueError, match="gradient_predivide_factor"):
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Sum,
                                     gradient_predivide_factor=2.0)
    agree(check)


def test_backward_passes_per_step(hvd, world, rank):
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), backward_passes_per_step=2)
    ref = make_model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt.zero_grad()
    for micro in range(2):
        s = shard(micro, rank, world, 4)
        torch.nn.functional.mse_loss(model(X[s]), Y[s]).backward()
        if micro == 0:
            after_first = sum(opt._exchange.started(p) for p in model.parameters())
    after_second = sum(opt._exchange.started(p) for p in model.parameters())
    opt.step()
    ref_opt.zero_grad()
    for micro in range(2):
        for r in range(world):
            s = shard(micro, r, world, 4)
            (torch.nn.functional.mse_loss(ref(X[s]), Y[s]) / world).backward()
    ref_opt.step()

    def check():
        assert after_first == 0 and after_second == 4  # exchange only on the 2nd backward pass
        assert torch.allclose(flat(model), flat(ref), atol=1e-6)
    agree(check)


def test_noncontiguous_parameters_and_gradients(hvd, world, rank):
    w = torch.nn.Parameter(torch.arange(12.0).reshape(4, 3).t())  # a transposed (non-contiguous) parameter
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), named_parameters=[("w", w)])
    (w * (rank + 1)).sum().backward()
    grad_was_contiguous = w.grad.is_contiguous()
    opt.step()
    mean = sum(r + 1 for r in range(world)) / world

    def check():
        assert not grad_was_contiguous
        assert torch.allclose(w.grad, torch.full((3, 4), mean))
        assert torch.allclose(w.detach(), torch.arange(12.0).reshape(4, 3).t() - mean)
    agree(check)


def test_synchronize_then_clip_then_step(hvd, world, rank):
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    s = shard(0, rank, world, 4)
    torch.nn.functional.mse_loss(model(X[s]), Y[s]).backward()
    opt.synchronize()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    with opt.skip_synchronize():
        opt.step()
    norms = hvd.allgather_object(float(norm))
    every = hvd.allgather_object(flat(model))
    opt.synchronize()
    with pytest.warns(UserWarning, match="skip_synchronize"):
        opt.step()  # a second exchange is not run (it would double-count with op=Sum)

    def check():
        assert len(set(norms)) == 1  # the norm of the averaged gradient, the same everywhere
        assert all(torch.equal(e, every[0]) for e in every)
    agree(check)


def test_sum_predivide_and_compression(hvd, world, rank):
    p = torch.nn.Parameter(torch.zeros(4))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([p], lr=1.0), named_parameters=[("p", p)], op=hvd.Sum)
    (p * (rank + 1)).sum().backward()
    opt.step()
    total = float(sum(r + 1 for r in range(world)))
    q = torch.nn.Parameter(torch.zeros(4))
    opt_q = hvd.DistributedOptimizer(torch.optim.SGD([q], lr=1.0), named_parameters=[("q", q)],
                                     gradient_predivide_factor=float(world), compression=hvd.Compression.fp16)
    (q * (rank + 1)).sum().backward()
    opt_q.step()

    def check():
        assert p.grad.tolist() == [total] * 4
        assert q.grad.dtype == torch.float32 and torch.allclose(q.grad, torch.full((4,), total / world))
    agree(check)


def test_zero_grad_while_exchanging_raises(hvd, world, rank):
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    torch.nn.functional.mse_loss(model(X[:4]), Y[:4]).backward()
    try:
        opt.zero_grad()
        raised = False
    except AssertionError as exc:
        raised = "HINT" in str(exc)
    opt.step()
    opt.zero_grad()

    def check():
        assert raised
        assert isinstance(opt, torch.optim.SGD) and all(p.grad is None for p in model.parameters())
    agree(check)


def test_unnamed_parameters_and_lr_scheduler(hvd, world, rank):
    model = make_model()
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(base, step_size=1, gamma=0.5)  # patches base.step
    opt = hvd.DistributedOptimizer(base)
    s = shard(0, rank, world, 4)
    torch.nn.functional.mse_loss(model(X[s]), Y[s]).backward()
    opt.step()
    sched.step()
    every = hvd.allgather_object(flat(model))

    def check():
        assert all(torch.equal(e, every[0]) for e in every)  # step() went through the exchange
        assert opt.param_groups[0]["lr"] == 0.05  # groups are shared with the original optimizer
    agree(check)


def test_sparse_gradients(hvd, world, rank):
    emb = torch.nn.Embedding(6, 2, sparse=True)
    torch.nn.init.zeros_(emb.weight)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=1.0), named_parameters=emb.named_parameters(),
                                   sparse_as_dense=True)
    emb(torch.tensor([rank % 6])).sum().backward()
    opt.step()
    expected = torch.zeros(6, 2)
    for r in range(world):
        expected[r % 6] -= 1.0 / world
    # Without sparse_as_dense (Horovod's default) sparse gradients are allgathered as indices and values.
    gathered = torch.nn.Embedding(3, 2, sparse=True)
    torch.nn.init.zeros_(gathered.weight)
    opt_gathered = hvd.DistributedOptimizer(torch.optim.SGD(gathered.parameters(), lr=1.0),
                                            named_parameters=[("gathered", gathered.weight)])
    gathered(torch.tensor([rank % 3])).sum().backward()
    opt_gathered.step()
    expected_gathered = torch.zeros(3, 2)
    for r in range(world):
        expected_gathered[r % 3] -= 1.0 / world

    def check():
        assert torch.allclose(emb.weight.detach(), expected)
        assert emb.weight.grad.is_sparse  # handed back sparse to the wrapped optimizer
        assert torch.allclose(gathered.weight.detach(), expected_gathered)
    agree(check)


def test_rewrapping_after_the_old_optimizer_is_gone(hvd, world, rank):
    model = make_model()
    for lr in (0.1, 0.05):  # the first wrapper's hooks must not fire (and double-submit) once it is gone
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                       named_parameters=model.named_parameters())
        s = shard(0, rank, world, 4)
        torch.nn.functional.mse_loss(model(X[s]), Y[s]).backward()
        opt.step()
        opt.zero_grad()
        del opt
    every = hvd.allgather_object(flat(model))

    def check():
        assert all(torch.equal(e, every[0]) for e in every)
    agree(check)
