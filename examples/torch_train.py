"""Data-parallel training with a plain PyTorch loop and horo (Horovod's PyTorch recipe).

Run on 2 ranks:
    hororun -np 2 python examples/torch_train.py

The recipe: initialise horo; shard the data with a DistributedSampler; scale the learning rate by the
number of ranks; wrap the optimizer in hvd.DistributedOptimizer (gradients are averaged while backward
runs); start every rank from rank 0's weights and optimizer state; average metrics; print and save
checkpoints on rank 0 only. Where torch sees GPUs, each rank takes the one of its local rank
(``--no-cuda`` keeps it on the CPU). The data are generated offline: 8x8 "images" of 4 noisy stroke patterns.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import horo.torch as hvd


def make_data(n: int, seed: int) -> TensorDataset:
    patterns = torch.zeros(4, 1, 8, 8)
    patterns[0, 0, 3:5, :] = 1  # horizontal bar
    patterns[1, 0, :, 3:5] = 1  # vertical bar
    patterns[2, 0] = torch.eye(8)  # diagonal
    patterns[3, 0] = torch.eye(8).flip(1)  # anti-diagonal
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = patterns[y] + 1.2 * torch.randn(n, 1, 8, 8, generator=g)
    return TensorDataset(x, y)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 8, kernel_size=3, padding=1)
        self.fc1 = torch.nn.Linear(8 * 4 * 4, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def metric_average(value: float, name: str) -> float:
    return hvd.allreduce(torch.tensor(value), name=name).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.02, help="per rank; scaled by the number of ranks")
    parser.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
    parser.add_argument("--checkpoint-dir", default=os.path.join(tempfile.gettempdir(), "horo-torch-train"))
    parser.add_argument("--no-cuda", action="store_true", help="train on the CPU even where there are GPUs")
    args = parser.parse_args()

    hvd.init()
    device = torch.device("cpu")
    if torch.cuda.is_available() and not args.no_cuda:
        # One GPU per rank: the rank's index on its host picks it (hororun starts local_size ranks per host).
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(42)
    torch.set_num_threads(1)  # one compute thread per rank: the ranks share the machine's cores

    train, test = make_data(4096, 0), make_data(1024, 1)
    train_sampler = hvd.DistributedSampler(train, shuffle=True, seed=42)  # each rank reads its own shard
    train_loader = DataLoader(train, batch_size=args.batch_size, sampler=train_sampler)
    test_sampler = hvd.DistributedSampler(test, shuffle=False)
    test_loader = DataLoader(test, batch_size=256, sampler=test_sampler)

    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    for epoch in range(1, args.epochs + 1):
        model.train()
        train_sampler.set_epoch(epoch)
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        model.eval()
        correct, total, loss_sum = 0.0, 0.0, 0.0
        with torch.no_grad():
            for x, y in test_loader:
                x, y = x.to(device), y.to(device)
                logits = model(x)
                loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
                correct += (logits.argmax(1) == y).sum().item()
                total += len(y)
        test_loss = metric_average(loss_sum / total, "avg_loss")
        test_acc = metric_average(correct / total, "avg_accuracy")
        if hvd.rank() == 0:
            print(f"epoch {epoch}: train loss {loss.item():.4f}  test loss {test_loss:.4f}  "
                  f"test accuracy {100 * test_acc:.1f}%", flush=True)
            os.makedirs(args.checkpoint_dir, exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                       os.path.join(args.checkpoint_dir, "checkpoint.pt"))

    checksum = sum(p.double().sum().item() for p in model.parameters())
    print(f"rank {hvd.rank()}/{hvd.size()} done: weights checksum {checksum:.6f}", flush=True)


if __name__ == "__main__":
    main()
