"""``horo.torch.SyncBatchNorm``: at N ranks with batch b each, forward outputs, running statistics and gradients equal
one process's ``BatchNorm`` on the N x b batch; Horovod's own SyncBatchNorm test, on CPU.

Every rank builds all ranks' inputs (seeded), runs the reference on their concatenation, and compares its slice.
Gradients follow horo's rule: each rank's input gradient is that of the sum of every rank's loss; weight and
bias gradients are local, and their sum over ranks is the reference's.
"""

from __future__ import annotations

import pytest
import torch
from torch_mpi_util import agree

pytestmark = pytest.mark.mpi

BN = {1: torch.nn.BatchNorm1d, 2: torch.nn.BatchNorm2d, 3: torch.nn.BatchNorm3d}


def inputs(world: int, shape: tuple[int, ...], sizes: list[int], dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(b, *shape, generator=g) * (r + 1) + r).to(dtype) for r, b in enumerate(sizes)]


def loss_of(y: torch.Tensor, r: int) -> torch.Tensor:
    w = torch.linspace(-1, 1, y[0].numel(), dtype=y.dtype).view(y[0].shape)
    return ((y * w).sum() + (y ** 2).sum() * 0.1) * (r + 1)


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("uneven", [False, True])
@pytest.mark.parametrize("momentum", [0.1, None])
def test_equals_batch_norm_on_the_whole_batch(hvd, world, rank, dims, uneven, momentum):
    dtype = torch.float64
    shape = {1: (4,), 2: (4, 3, 2), 3: (4, 2, 2, 3)}[dims]
    sizes = [r + 2 for r in range(world)] if uneven else [3] * world
    xs = inputs(world, shape, sizes, dtype)
    torch.manual_seed(0)
    ref = BN[dims](4, momentum=momentum).to(dtype)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-0.5, 0.5)
    sync = hvd.SyncBatchNorm(4, momentum=momentum).to(dtype)
    sync.load_state_dict(ref.state_dict())
    outs = []
    for step in range(2):  # two steps: the running statistics' update compounds
        x_all = torch.cat([x * (step + 1) for x in xs]).requires_grad_()
        y_all = ref(x_all)
        sum(loss_of(y, r) for r, y in enumerate(y_all.split(sizes))).backward()
        x = (xs[rank] * (step + 1)).requires_grad_()
        ref_w, ref_b = ref.weight.grad.clone(), ref.bias.grad.clone()
        ref.zero_grad()
        sync.zero_grad()
        y = sync(x)
        loss_of(y, rank).backward()
        gw, gb = hvd.allreduce(sync.weight.grad, op=hvd.Sum), hvd.allreduce(sync.bias.grad, op=hvd.Sum)
        mine = x_all.grad.split(sizes)[rank]
        outs.append((y.detach(), y_all.detach().split(sizes)[rank], x.grad, mine, gw, ref_w, gb, ref_b))
    stats = hvd.allgather_object((sync.running_mean.tolist(), sync.running_var.tolist()))
    sync.eval()
    ref.eval()
    ev, ev_ref = sync(xs[rank]), ref(xs[rank])

    def check():
        for y, y_ref, gx, gx_ref, gw, gw_ref, gb, gb_ref in outs:
            torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(gx, gx_ref, rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(gw, gw_ref, rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(gb, gb_ref, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(sync.running_mean, ref.running_mean, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(sync.running_var, ref.running_var, rtol=1e-10, atol=1e-10)
        assert int(sync.num_batches_tracked) == int(ref.num_batches_tracked) == 2
        assert all(s == stats[0] for s in stats)  # bit-identical on every rank
        torch.testing.assert_close(ev, ev_ref)
    agree(check)


def test_float32_and_a_rank_with_an_empty_batch(hvd, world, rank):
    sizes = [0 if (r == 1 and world > 2) else 4 for r in range(world)]
    xs = inputs(world, (3, 5), sizes, torch.float32)
    ref = torch.nn.BatchNorm1d(3)
    sync = hvd.SyncBatchNorm(3)
    y_ref = ref(torch.cat(xs)).split(sizes)[rank]
    y = sync(xs[rank])

    def check():
        torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(sync.running_var, ref.running_var, rtol=1e-5, atol=1e-6)
    agree(check)


def test_horovods_sync_batch_norm_scenario(hvd, world, rank):
    """Horovod's test_horovod_sync_batch_norm (on CPU): batch 1 per rank, gradients averaged with hvd.allreduce."""
    ts_list = [
        torch.stack([torch.tensor([[r, r + 1], [r * 2, r * 2 + 1], [r * 3, r * 3 + 1], [r * 4, r * 4 + 1]])
                     for r in range(world)]),
        torch.stack([torch.tensor([[r + 1], [r * 2 + 1], [r * 3 + 1], [r * 4 + 1]]) for r in range(world)]),
    ]
    results = []
    for ts in ts_list:
        if world == 1 and ts.shape[-1] == 1:
            continue  # one value per channel: BatchNorm itself refuses it
        sync_bn = hvd.SyncBatchNorm(num_features=4)
        bn = torch.nn.BatchNorm1d(num_features=4)
        ts = ts.float()
        ts1, ts2 = ts.clone().requires_grad_(), ts.clone().requires_grad_()
        sync_out = sync_bn(ts1[rank].unsqueeze(0))
        bn_out = bn(ts2)
        results.append(((sync_out - bn_out[rank].unsqueeze(0)).abs().sum().item(),
                        (sync_bn.running_mean - bn.running_mean).abs().sum().item(),
                        (sync_bn.running_var - bn.running_var).abs().sum().item()))
        sync_out.sum().backward()
        bn_out.mean(dim=0).sum().backward()
        results[-1] += ((hvd.allreduce(sync_bn.weight.grad, name="sync_bn.weight.grad") - bn.weight.grad).abs().sum()
                        .item(),
                        (hvd.allreduce(sync_bn.bias.grad, name="sync_bn.bias.grad") - bn.bias.grad).abs().sum().item(),
                        (hvd.allreduce(ts1.grad, name="ts1.grad") - ts2.grad).abs().sum().item())

    def check():
        for diffs in results:
            assert all(d < 1e-5 for d in diffs), diffs
    agree(check)


def test_convert_and_revert(hvd):
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 1), torch.nn.BatchNorm2d(4),
                                torch.nn.Sequential(torch.nn.BatchNorm1d(3, affine=False)), torch.nn.SyncBatchNorm(5))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    converted = hvd.SyncBatchNorm.convert_sync_batchnorm(model)
    kinds = [type(m) for m in converted.modules()]
    reverted = hvd.SyncBatchNorm.revert_sync_batchnorm(converted)

    def check():
        assert converted is model and kinds.count(hvd.SyncBatchNorm) == 3
        assert [type(m) for m in reverted.modules()][1:] == [torch.nn.Conv2d, torch.nn.BatchNorm2d, torch.nn.Sequential,
                                                            torch.nn.BatchNorm1d, torch.nn.SyncBatchNorm]
        assert all(torch.equal(before[k], v) for k, v in reverted.state_dict().items())
        with pytest.raises(ValueError, match="at least 2D"):
            hvd.SyncBatchNorm(3)(torch.ones(3))
        with pytest.raises(TypeError, match="process_set"):
            hvd.SyncBatchNorm(3, process_set=[0])
    agree(check)
