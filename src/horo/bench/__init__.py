"""Benchmarks: ``python -m horo.bench NAME [args]`` (run under ``hororun -np N``).

Each benchmark is a module ``horo.bench.NAME`` with ``main(argv) -> int``:

- ``allreduce``: horo.allreduce (out-of-place, in-place, async) vs raw mpi4py ``Allreduce``, 4 B .. 64 MiB.
- ``fusion``: a ResNet-50 gradient set through the engine vs raw MPI, torch.distributed (gloo) and
  grouped_allreduce; ``--sweep`` tries several fusion thresholds.
- ``adasum``: the same gradient set with op=Adasum against op=Average, and the bytes Adasum moves.
- ``autotune``: the engine tunes its own knobs from a bad start; compared with a grid search in the same run.
- ``autotune_steady``: autotune never slows a job down: the tuned steady state against the defaults, and
  the first steps against the last in a tuned and an untuned job.
- ``gpu``: GPU buffers: horo's NCCL path vs raw NCCL and host staging (also ``allreduce --gpu``).
- ``keras``, ``lightning``: end-to-end training throughput with the framework facades (``keras --backend
  tensorflow|torch|jax``).
- ``buckets``: what one more gradient bucket in a step costs the host on CPU tensors (``horo.torch``'s
  exchange; the GPU twin is tests/gpu/host_path.py), next to what MPI charges per extra message.
- ``torch_step``: a plain torch step with ``DistributedOptimizer`` against ``DistributedDataParallel``.
- ``jax_carriers``: what carries a gradient exchange inside ``jax.jit``: horo's ordered host callback, bare
  mpi4py, mpi4jax (when installed) and XLA's own collectives over a ``jax.distributed`` world.

All of them interleave the variants they compare inside one run, repeat, and report medians, so that a
noisy (shared) machine slows every variant alike.
"""

from __future__ import annotations

import os

# One compute thread per rank: N ranks already share the cores. Set before torch / TF are imported.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

#: name -> one-line description, for ``python -m horo.bench --help``.
BENCHES: dict[str, str] = {
    "allreduce": "horo.allreduce vs raw mpi4py Allreduce over message sizes (latency, algbw, busbw)",
    "fusion": "ResNet-50 gradient set: engine fusion vs raw MPI, gloo and grouped_allreduce",
    "adasum": "ResNet-50 gradient set: op=Adasum vs op=Average, and the bytes each rank moves",
    "autotune": "ResNet-50 gradient set: autotune from 64 MiB fusion vs a fusion x cycle-time grid search",
    "autotune_steady": "ResNet-50 gradient set: the autotuned steady state vs the defaults, interleaved",
    "hierarchical": "ResNet-50 gradient set: hierarchical vs flat allreduce across hosts, next to raw mpi4py",
    "gpu": "GPU allreduce: horo's NCCL path vs raw NCCL vs host staging (needs cupy and a GPU)",
    "keras": "Keras training throughput with horo.keras (TensorFlow, torch or JAX backend)",
    "keras_steps": "where a multi-rank Keras fit step's time goes, per rank: compute, waiting, transfer, update",
    "jax_carriers": "exchange inside jax.jit: horo's io_callback vs bare mpi4py, mpi4jax, XLA collectives (gloo)",
    "lightning": "Lightning training throughput with horo.lightning",
    "buckets": "horo.torch gradient buckets on CPU: host cost of one more bucket in a step, vs raw mpi4py",
    "torch_step": "torch training step: horo.torch.DistributedOptimizer vs DistributedDataParallel",
}

__all__ = ["BENCHES"]
