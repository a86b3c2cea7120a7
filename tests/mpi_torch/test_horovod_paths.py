"""horo.torch by Horovod's module paths: the autograd functions of ``horo.torch.mpi_ops`` called with Horovod's
``apply`` arguments, the grouped allgather/reducescatter gradients, and the state-handler registry of
``horo.torch.elastic.state``."""

from __future__ import annotations

import copy

import pytest
import torch
from torch_mpi_util import agree


@pytest.fixture(scope="module")
def ops(hvd):
    import horo.torch.mpi_ops as mpi_ops

    return mpi_ops


def test_autograd_functions_take_horovods_arguments(hvd, ops, world, rank):
    ps = hvd.global_process_set
    x = torch.full((2, 3), float(rank + 1))
    summed = ops.HorovodAllreduce.apply(x, None, "paths.ar", hvd.Sum, 1.0, 2.0, ps)
    a, b = ops.HorovodGroupedAllreduce.apply(None, "paths.gar", hvd.Sum, 1.0, 1.0, ps, x, x[:1])
    gathered = ops.HorovodAllgather.apply(torch.full((rank + 1, 2), float(rank)), "paths.ag", ps)
    g1, g2 = ops.HorovodGroupedAllgather.apply("paths.gag", ps, torch.full((rank + 1,), float(rank)), x)
    root = ops.HorovodBroadcast.apply(x, world - 1, "paths.bc", ps)
    plain = ops.HorovodAlltoall.apply(torch.arange(world, dtype=torch.float32), None, "paths.a2a", ps)
    rows, splits = ops.HorovodAlltoall.apply(torch.arange(world, dtype=torch.float32), [1] * world, None, ps)
    scattered = ops.HorovodReducescatter.apply(torch.ones(world * 2, 2), "paths.rs", hvd.Sum, ps, 1.0, 1.0)
    s1, s2 = ops.HorovodGroupedReducescatter.apply("paths.grs", hvd.Sum, ps, 1.0, 1.0, torch.ones(world, 1),
                                                   torch.ones(world * 3))
    total = float(sum(range(1, world + 1)))

    def check():
        assert torch.equal(summed, torch.full((2, 3), 2 * total))
        assert torch.equal(a, torch.full((2, 3), total)) and torch.equal(b, torch.full((1, 3), total))
        assert gathered.shape == (sum(range(1, world + 1)), 2)
        assert g1.tolist() == [float(r) for r in range(world) for _ in range(r + 1)] and g2.shape[0] == 2 * world
        assert torch.equal(root, torch.full((2, 3), float(world)))
        assert isinstance(plain, torch.Tensor) and plain.tolist() == [float(rank)] * world
        assert rows.tolist() == [float(rank)] * world and splits.tolist() == [1] * world
        assert torch.equal(scattered, torch.full((2, 2), float(world)))
        assert torch.equal(s1, torch.full((1, 1), float(world))) and torch.equal(s2, torch.full((3,), float(world)))
    agree(check)


def test_grouped_allgather_grad_is_each_tensors(hvd, world, rank):
    xs = [torch.full((rank + 1, 2), 1.0, requires_grad=True), torch.full((2,), float(rank), requires_grad=True)]
    ys = [x.detach().clone().requires_grad_(True) for x in xs]
    outs = hvd.grouped_allgather(xs, name="paths.gag.grad")
    weights = [torch.arange(o.numel(), dtype=torch.float32).reshape(o.shape) for o in outs]
    sum((o * w).sum() for o, w in zip(outs, weights)).backward()
    for y, w in zip(ys, weights):
        (hvd.allgather(y) * w).sum().backward()

    def check():
        for x, y in zip(xs, ys):
            assert torch.equal(x.grad, y.grad)
    agree(check)


@pytest.mark.parametrize("op_name", ["Sum", "Average"])
def test_grouped_reducescatter_grad_is_each_tensors(hvd, world, rank, op_name):
    op = getattr(hvd, op_name)
    xs = [torch.full((world * 2, 3), float(rank), requires_grad=True), torch.ones(world + 1, requires_grad=True)]
    ys = [x.detach().clone().requires_grad_(True) for x in xs]
    outs = hvd.grouped_reducescatter(xs, op=op, prescale_factor=2.0)
    sum((o * (rank + 1)).sum() for o in outs).backward()
    for y in ys:
        (hvd.reducescatter(y, op=op, prescale_factor=2.0) * (rank + 1)).sum().backward()

    def check():
        for x, y in zip(xs, ys):
            assert torch.equal(x.grad, y.grad)
    agree(check)


class Counter:
    def __init__(self, n: int) -> None:
        self.n = n


def test_a_registered_handler_keeps_a_custom_type(hvd, rank):
    from horo.torch.elastic import state as el

    class Handler(el.StateHandler):
        def save(self):
            self._saved = copy.deepcopy(self.value.n)

        def restore(self):
            self.value.n = self._saved

        def sync(self):
            self.value.n = hvd.broadcast_object(self.value.n, root_rank=0)

    before = el.get_handler_registry()
    with pytest.raises(TypeError, match="Received"):
        el.set_handler_registry([(Counter, object)])
    el.set_handler_registry(before + [(Counter, Handler)])
    try:
        state = hvd.elastic.TorchState(counter=Counter(rank + 10), epoch=0)
        assert isinstance(state._handlers["counter"], Handler)
        state.sync()
        assert state.counter.n == 10
        state.counter.n = 99
        state.restore()
        assert state.counter.n == 10
        state.counter = Counter(5)  # a new value is held and saved, as in Horovod
        state.counter.n = 6
        state.restore()
        assert state.counter.n == 5
    finally:
        el.set_handler_registry(before)
    assert el.get_handler_registry() == before
