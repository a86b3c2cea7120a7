"""Horovod drop-in parity of horo.torch: behaviours Horovod 0.28.1 user code relies on.

Every test runs in every rank; inputs are deterministic, so each rank recomputes the expected values.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch_mpi_util import agree, comm

pytestmark = pytest.mark.mpi


def _trunc_div(total: torch.Tensor, n: int) -> torch.Tensor:
    return torch.div(total, n, rounding_mode="trunc")


def _ref(inputs: list[torch.Tensor], op: str, pre: float, post: float, n: int) -> torch.Tensor:
    """Horovod's integer semantics: scale in float64, truncate; Average folds 1/n into the post-scale."""
    scaled = [torch.trunc(x.double() * pre).long() if pre != 1.0 else x.long() for x in inputs]
    total = torch.stack(scaled).sum(0)
    factor = post / n if op == "Average" else post
    if factor == 1.0:
        return total
    if op == "Average" and post == 1.0:
        return _trunc_div(total, n)
    return torch.trunc(total.double() * factor).long()


# ----------------------------------------------------------------------------- 1. integer scale factors
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_scale_factors_on_integer_tensors(hvd, world, rank, dtype, op):
    pre, post = 1.5, 0.75
    inputs = [torch.arange(-5, 7, dtype=dtype) * (r + 1) for r in range(world)]
    rop = getattr(hvd, op)
    ar = hvd.allreduce(inputs[rank], op=rop, prescale_factor=pre, postscale_factor=post)
    gar = hvd.grouped_allreduce([inputs[rank], inputs[rank][:3]], op=rop, prescale_factor=pre,
                                postscale_factor=post)
    rows = torch.stack([inputs[rank]] * world)
    rs = hvd.reducescatter(rows, op=rop, prescale_factor=pre, postscale_factor=post)
    grs = hvd.grouped_reducescatter([rows], op=rop, prescale_factor=pre, postscale_factor=post)
    expected = _ref(inputs, op, pre, post, world)

    def check():
        for got in (ar, gar[0], rs[0], grs[0][0]):
            assert got.dtype == dtype, got.dtype
            assert torch.equal(got.long(), expected), (got, expected)
        assert torch.equal(gar[1].long(), expected[:3])
    agree(check)


# ---------------------------------------------------------------------- 2. integer Average truncates
def test_integer_average_truncates_toward_zero(hvd, world, rank):
    x = torch.tensor([-75, 75, -1, 3], dtype=torch.int64) if rank == 0 else torch.zeros(4, dtype=torch.int64)
    out = hvd.allreduce(x, op=hvd.Average)
    h = hvd.allreduce_async(x.int(), op=hvd.Average, name="parity.trunc.async")
    out_async = hvd.synchronize(h)

    def check():
        want = [int(v / world) for v in (-75, 75, -1, 3)]  # Python's int(a / b) truncates toward zero
        assert out.tolist() == want, (out, want)
        assert out_async.tolist() == want and out_async.dtype == torch.int32
    agree(check)


def test_integer_average_with_a_joined_rank_truncates(hvd, world, rank, multi):
    """A joined rank contributes zeros; the Average still divides by the whole set and truncates."""
    hi = world - 1
    got = []
    if rank == hi:
        hvd.join()
    else:
        x = torch.tensor([-75 - rank, 13 + rank], dtype=torch.int32)
        got.append(hvd.allreduce(x, op=hvd.Average, name="parity.join.int"))
        got.append(hvd.synchronize(hvd.allreduce_async(x, op=hvd.Average, name="parity.join.int.async")))
        hvd.join()
    active = range(hi)
    want = [int(sum(-75 - r for r in active) / world), int(sum(13 + r for r in active) / world)]

    def check():
        for g in got:
            assert g.tolist() == want, (g, want)
    agree(check)


# ------------------------------------------------------------------------------------------- 3. join
def test_join_returns_last_joiner_and_other_collectives_raise_on_callers(hvd, world, rank, multi):
    hi = world - 1
    caught: list = []
    if rank == hi:
        last = hvd.join()
    else:
        hvd.synchronize(hvd.allreduce_async(torch.ones(2), name="parity.join.a"))  # hi is seen joined
        for call in (lambda: hvd.allgather(torch.ones(1, 2), name="parity.join.ag"),
                     lambda: hvd.broadcast(torch.ones(2), root_rank=0, name="parity.join.bc")):
            try:
                call()
                caught.append(None)
            except RuntimeError as exc:  # MismatchError; Horovod raises a RuntimeError subclass too
                caught.append(type(exc).__name__)
        if rank == 0:
            hvd.synchronize(hvd.allreduce_async(torch.ones(2), name="parity.join.b"))  # all others joined
        last = hvd.join()
    lasts = comm().allgather(int(last))

    def check():
        assert lasts == [0] * world, lasts
        if rank != hi:
            assert caught == ["MismatchError"] * 2, caught
    agree(check)
    out = hvd.allreduce(torch.ones(2), op=hvd.Sum)
    agree(lambda: torch.equal(out, torch.full((2,), float(world))) or pytest.fail(str(out)))


# ------------------------------------------------------------------------------------ 4. sparse gradients
def _sparse_for(r: int) -> torch.Tensor:
    """Rank r's sparse (6, 2) tensor: different rows and counts per rank, a shared row 0."""
    rows = sorted({0, (r + 1) % 6, (2 * r + 3) % 6})
    values = torch.stack([torch.full((2,), float(10 * r + i + 1)) for i in rows])
    return torch.sparse_coo_tensor(torch.tensor([rows]), values, (6, 2), check_invariants=True)


@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_sparse_allreduce_async_returns_a_callable_handle(hvd, world, rank, op):
    handle = hvd.sparse_allreduce_async(_sparse_for(rank), name=f"parity.sparse.{op}", op=getattr(hvd, op))
    out = handle()
    want = sum(_sparse_for(r).to_dense() for r in range(world))
    if op == "Average":
        want = want / world

    def check():
        assert callable(handle)
        assert out.is_sparse and out.shape == (6, 2)
        assert torch.allclose(out.to_dense(), want), (out.to_dense(), want)
    agree(check)


def _embedding_run(hvd, world, rank, sparse_as_dense: bool, tag: str):
    emb = torch.nn.Embedding(8, 3, sparse=True)
    torch.nn.init.constant_(emb.weight, 0.5)
    ref = torch.nn.Embedding(8, 3, sparse=True)  # one process on every rank's batch, for comparison
    torch.nn.init.constant_(ref.weight, 0.5)
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(emb.parameters(), lr=0.1),
                                   named_parameters=[(f"{tag}.weight", emb.weight)], sparse_as_dense=sparse_as_dense)
    ref_opt = torch.optim.SparseAdam(ref.parameters(), lr=0.1)
    batches = [torch.tensor([r % 8, (3 * r + 1) % 8]) for r in range(world)]  # different indices per rank
    for _ in range(2):
        opt.zero_grad()
        emb(batches[rank]).pow(2).sum().backward()
        opt.step()
        ref_opt.zero_grad()
        (sum(ref(b).pow(2).sum() for b in batches) / world).backward()
        ref_opt.step()
    return emb.weight.detach(), ref.weight.detach(), emb.weight.grad


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_gradients_with_sparse_adam(hvd, world, rank, sparse_as_dense):
    """Embedding(sparse=True) + SparseAdam: the default allgathers indices and values; sparse_as_dense
    averages densely and hands SparseAdam a sparse gradient again. Both equal one process on all batches."""
    got, want, grad = _embedding_run(hvd, world, rank, sparse_as_dense, f"emb.{int(sparse_as_dense)}")

    def check():
        assert grad.is_sparse
        assert torch.allclose(got, want, atol=1e-6), (got, want)
    agree(check)


# ------------------------------------------------------------- 5. process_set: ranks outside take local steps
def test_optimizer_on_a_process_set_steps_locally_outside_it(hvd, world, rank, multi):
    ps = hvd.add_process_set(list(range(world - 1)))  # every rank but the last
    try:
        p = torch.nn.Parameter(torch.zeros(3))
        opt = hvd.DistributedOptimizer(torch.optim.SGD([p], lr=1.0), named_parameters=[("ps.p", p)], process_set=ps)
        (p * (rank + 1)).sum().backward()  # raised "rank N is not in this process set" before
        opt.step()
        inside = ps.included()
    finally:
        hvd.remove_process_set(ps)
    mean_inside = sum(r + 1 for r in range(world - 1)) / (world - 1)

    def check():
        want = -mean_inside if inside else -(rank + 1.0)
        assert torch.allclose(p.detach(), torch.full((3,), want)), (rank, p)
    agree(check)


# --------------------------------------------------------------------- 6. names and exception types
def test_names_user_code_catches(hvd, world, rank):
    import horo

    model = torch.nn.Linear(2, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    names = dict(opt._parameter_names)
    model(torch.ones(1, 2)).sum().backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()

    def check():
        assert hvd.HorovodInternalError is horo.HoroInternalError
        assert names == {model.weight: "weight", model.bias: "bias"}, names
        assert any("optimizer.step() called without optimizer.skip_synchronize()" in str(w.message)
                   for w in caught), [str(w.message) for w in caught]
    agree(check)


@pytest.mark.parametrize("case", ["float_splits", "reducescatter_adasum", "bad_dtype", "sparse_input"])
def test_errors_catch_as_horovods_types(hvd, world, rank, case):
    """Where Horovod raises ValueError/RuntimeError, horo's error (a clearer type) catches as that too."""
    horovod_type, call = {
        "float_splits": (ValueError, lambda: hvd.alltoall(torch.ones(world, 2), splits=[1.0] * world)),
        "reducescatter_adasum": (RuntimeError, lambda: hvd.reducescatter(torch.ones(world, 2), op=hvd.Adasum)),
        "bad_dtype": (ValueError, lambda: hvd.allreduce(torch.ones(2, dtype=torch.complex64))),
        "sparse_input": (ValueError, lambda: hvd.allreduce(torch.eye(2).to_sparse())),
    }[case]

    def check():
        with pytest.raises(horovod_type) as info:
            call()
        assert "Received:" in str(info.value)
        assert isinstance(info.value, (TypeError, ValueError))  # and still horo's own type
    agree(check)
    out = hvd.allreduce(torch.ones(1), op=hvd.Sum, name=f"after.{case}")
    agree(lambda: out.item() == world or pytest.fail(str(out)))


# ------------------------------------------------------------------- Horovod's argument order and forms
def test_reducescatter_argument_order_and_grouped_async_forms(hvd, world, rank):
    rows = torch.arange(world * 2 * 3, dtype=torch.float32).reshape(world * 2, 3)
    named = hvd.reducescatter(rows, "parity.rs", op=hvd.Sum)  # Horovod: name is the second positional
    legacy = hvd.reducescatter(rows, hvd.Sum)  # horo's earlier order still works
    h = hvd.reducescatter_async(rows, "parity.rs.async", hvd.Sum)
    rs_async = hvd.synchronize(h)
    hg = hvd.grouped_allgather_async([torch.full((rank + 1, 2), float(rank)), torch.ones(1)], name="parity.gag")
    polled = hvd.poll(hg)
    gathered = hvd.synchronize(hg)
    hr = hvd.grouped_reducescatter_async([rows, rows.double()], name="parity.grs", op=hvd.Sum)
    grouped_rs = hvd.synchronize(hr)
    mine = (rows * world)[2 * rank:2 * rank + 2]

    def check():
        for got in (named, legacy, rs_async, grouped_rs[0], grouped_rs[1]):
            assert torch.equal(got.float(), mine), got
        assert isinstance(polled, bool)
        assert gathered[0].shape == (sum(r + 1 for r in range(world)), 2) and gathered[1].tolist() == [1.0] * world
    agree(check)


def test_broadcast_optimizer_state_takes_horovods_model_argument(hvd, world, rank):
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1), momentum=0.5)
    hvd.broadcast_optimizer_state(opt, 0, model)  # Horovod's third positional argument is the model

    def check():
        assert opt.param_groups[0]["lr"] == pytest.approx(0.1)
    agree(check)


# ------------------------------------------------------------- 5. Horovod's own join and state scenarios
@pytest.mark.parametrize("refused", ["allgather", "broadcast"])
def test_join_after_refused_collective_returns_a_later_joiner(hvd, world, rank, multi, refused):
    """Horovod's test_horovod_join_allgather / _broadcast: each rank in turn joins first while the others'
    collective is refused; join() returns the same rank everywhere, never the one that joined first."""
    tensor = torch.zeros(17, 17, 17)
    rounds = []
    for first in range(world):
        caught = None
        if rank != first:
            try:
                hvd.allgather(tensor) if refused == "allgather" else hvd.broadcast(tensor, 1 if first != 1 else 0)
            except RuntimeError as exc:
                caught = type(exc).__name__
        ret = hvd.join()
        rounds.append((first, int(ret), caught, hvd.allgather_object(int(ret))))

    def check():
        for first, ret, caught, every in rounds:
            assert ret != first, (first, ret)
            assert every == [ret] * world, every
            assert caught == (None if rank == first else "MismatchError"), caught
    agree(check)


def test_broadcast_state_no_grad(hvd, world, rank):
    """Horovod's test_broadcast_state_no_grad: a parameter that needs no gradient keeps ``grad=None``, the
    others get a (zero) gradient that can be broadcast."""

    class ModelNoGrad(torch.nn.Module):
        def __init__(self, a: torch.Tensor, b: torch.Tensor) -> None:
            super().__init__()
            self.a = torch.nn.Parameter(a.int(), requires_grad=False)
            self.b = torch.nn.Parameter(b)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.index_select(self.b, 0, self.a.long()) * x

    model = ModelNoGrad(torch.tensor([1.0, 3.0]), torch.rand(4))
    opt = torch.optim.SGD(model.parameters(), lr=0.001, weight_decay=1e-6, momentum=0.9, nesterov=True)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    grad = opt.param_groups[0]["params"][1].grad
    bgrad = hvd.broadcast(grad, root_rank=0)

    def check():
        assert opt.param_groups[0]["params"][0].grad is None
        assert torch.equal(grad, bgrad) and torch.equal(grad, torch.zeros(4))
    agree(check)
