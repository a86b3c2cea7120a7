"""A Horovod-style torch script that names Horovod only: ``import horovod.torch as hvd`` and Horovod's other
paths, run through the opt-in import hook (the package ``horovod`` of ``horo-mpi-horovod``, here from its source
folder on PYTHONPATH).

The shape of Horovod's synthetic benchmarks: a model on fixed random data, ``DistributedOptimizer`` with
optional fp16 compression and Adasum, parameters and optimizer state broadcast from rank 0, timed batches, a
metric averaged with ``allreduce``. It checks besides that every ``horovod.X`` is horo's module itself and that
the replicas end equal; rank 0 prints ``HOROVOD SCRIPT OK``.
"""

import argparse
import timeit

import horovod
import horovod.torch as hvd
import torch
import torch.nn.functional as F
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from horovod.torch.elastic import TorchState
from horovod.torch.mpi_ops import allgather

parser = argparse.ArgumentParser(description="A Horovod-style synthetic benchmark on a small model")
parser.add_argument("--fp16-allreduce", action="store_true", help="fp16 compression of the gradients")
parser.add_argument("--use-adasum", action="store_true", help="Adasum instead of averaging")
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--num-warmup-batches", type=int, default=2)
parser.add_argument("--num-batches-per-iter", type=int, default=3)
parser.add_argument("--num-iters", type=int, default=2)
args = parser.parse_args()

hvd.init()
torch.manual_seed(hvd.rank())  # different initial weights on each rank: the broadcast must make them equal
torch.set_num_threads(1)

model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
lr_scaler = 1 if args.use_adasum else hvd.size()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * lr_scaler, momentum=0.9)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=compression,
                                     op=hvd.Adasum if args.use_adasum else hvd.Average)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

data = torch.randn(args.batch_size, 32, generator=torch.Generator().manual_seed(100 + hvd.rank()))
target = torch.randint(0, 10, (args.batch_size,), generator=torch.Generator().manual_seed(200 + hvd.rank()))


def benchmark_step() -> None:
    optimizer.zero_grad()
    F.cross_entropy(model(data), target).backward()
    optimizer.step()


def log(text: str) -> None:
    if hvd.rank() == 0:
        print(text, flush=True)


log(f"Number of CPUs: {hvd.size()}")
timeit.timeit(benchmark_step, number=args.num_warmup_batches)
rates = []
for i in range(args.num_iters):
    took = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    rates.append(args.batch_size * args.num_batches_per_iter / took)
    log(f"Iter #{i}: {rates[-1]:.1f} samples/sec per CPU")
mean = hvd.allreduce(torch.tensor(sum(rates) / len(rates)), name="rate")
log(f"Samples/sec per CPU, averaged over the ranks: {mean.item():.1f}")

import horo  # noqa: E402 - only to check what the hook gives
import horo.elastic  # noqa: E402
import horo.torch  # noqa: E402

assert horovod.torch is hvd is horo.torch, (hvd, horo.torch)
assert HorovodInternalError is horo.HorovodInternalError and HostsUpdatedInterrupt is horo.elastic.HostsUpdatedInterrupt
assert TorchState is horo.torch.elastic.TorchState and allgather is horo.torch.allgather
weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
every = allgather(weights.unsqueeze(0), name="weights")
assert all(torch.equal(every[0], row) for row in every), "the replicas differ"
log(f"HOROVOD SCRIPT OK on {hvd.size()} ranks (horovod {horovod.__version__})")
