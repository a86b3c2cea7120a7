"""The ``horo`` torch.distributed backend and ``horo.torch.SyncBatchNorm`` on CUDA tensors (run under mpiexec).

    mpiexec -n N python tests/gpu/torch_dist_checks.py [cuda|cpu]

Each collective runs on CUDA tensors and on the same values on the CPU; results must be equal and stay on the
GPU. Then ``horo.torch.SyncBatchNorm`` and torch's own ``nn.SyncBatchNorm`` (which runs its all_gather through
the group) on CUDA must equal one ``BatchNorm`` on every rank's batch together. ``cpu`` runs the same script
without a GPU (to check the script itself). Prints ``TORCH DIST CHECKS OK`` on success.
"""

from __future__ import annotations

import sys
import warnings

import torch
import torch.distributed as dist

import horo.torch as hvd


def main(argv: list[str]) -> int:
    device = torch.device(argv[0] if argv else "cuda")
    warnings.filterwarnings("ignore")
    hvd.init()
    if device.type == "cuda":
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("horo")
    rank, n = dist.get_rank(), dist.get_world_size()

    def both(fn):  # fn(device) -> list of tensors; runs on the device and on the CPU, compares
        got, want = fn(device), fn(torch.device("cpu"))
        for g, w in zip(got, want):
            assert g.device == device, (g.device, device)
            assert torch.equal(g.cpu(), w), (g, w)

    def all_reduce(d):
        t = torch.arange(6, dtype=torch.float32, device=d) + rank
        dist.all_reduce(t)
        m = torch.arange(6, dtype=torch.int64, device=d) * (rank + 1)
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        return [t, m]

    def movement(d):
        b = torch.full((4,), float(rank), device=d, dtype=torch.bfloat16)
        dist.broadcast(b, src=n - 1)
        ag = torch.empty(2 * n, device=d)
        dist.all_gather_into_tensor(ag, torch.full((2,), float(rank), device=d))
        rs = torch.empty(2, device=d)
        dist.reduce_scatter_tensor(rs, torch.arange(2 * n, dtype=torch.float32, device=d))
        a2a = torch.empty(n, device=d)
        dist.all_to_all_single(a2a, torch.arange(n, dtype=torch.float32, device=d) + 10 * rank)
        outs = [torch.empty(3, device=d) for _ in range(n)]
        dist.all_gather(outs, torch.full((3,), float(rank), device=d))
        return [b, ag, rs, a2a, *outs]

    both(all_reduce)
    both(movement)
    objs = [{"rank": rank}]
    dist.broadcast_object_list(objs, src=0, device=device)
    assert objs == [{"rank": 0}], objs

    # Synchronised batch norm: horo's, and torch's own through the group, against one BatchNorm on all batches.
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(4, 3, 5, generator=g) * (r + 1) + r for r in range(n)]
    ref = torch.nn.BatchNorm1d(3).double()
    x_all = torch.cat(xs).double().requires_grad_()
    y_ref = ref(x_all)
    (y_ref * torch.linspace(-1, 1, 5, dtype=torch.float64)).sum().backward()
    for make in (hvd.SyncBatchNorm, torch.nn.SyncBatchNorm):
        if make is torch.nn.SyncBatchNorm and device.type != "cuda":
            continue  # torch's own refuses CPU modules
        bn = make(3).to(device).double()
        x = xs[rank].to(device).double().requires_grad_()
        y = bn(x)
        (y * torch.linspace(-1, 1, 5, dtype=torch.float64, device=device)).sum().backward()
        torch.testing.assert_close(y.detach().cpu(), y_ref.detach()[4 * rank:4 * rank + 4], rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(x.grad.cpu(), x_all.grad[4 * rank:4 * rank + 4], rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(bn.running_var.cpu(), ref.running_var, rtol=1e-9, atol=1e-9)
        print(f"rank {rank}: {make.__module__}.{make.__name__} on {device} equals BatchNorm on all batches",
              flush=True)
    dist.destroy_process_group()
    print(f"rank {rank}/{n}: TORCH DIST CHECKS OK on {device}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
