"""Keras 3 on the torch backend with CUDA, run by tests/gpu/test_nccl_gpu.py under mpiexec (not collected).

    mpiexec -n 1 python tests/gpu/keras_checks.py

``DistributedOptimizer`` trains a small model on the GPU, plain and with ``Compression.fp16``. On one rank
``fit`` exchanges nothing (as in Horovod), so the optimizer's own gradient exchange is then called on the
model's CUDA gradients: its results must be the gradients, on the GPU, with no host<->device copy counted by
CUPTI's memcpy records (see torch_checks.py). Prints ``KERAS GPU CHECKS OK`` on rank 0, or the failures.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["KERAS_BACKEND"] = "torch"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch_checks import host_copies  # noqa: E402

import horo.keras as hvd  # noqa: E402


def main() -> int:
    hvd.init()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    fails: list[str] = []
    dev = f"cuda:{torch.cuda.current_device()}"
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(256, 16)).astype("float32")
    y = (x @ rng.normal(size=(16, 1))).astype("float32")
    for compression in (hvd.Compression.none, hvd.Compression.fp16):
        name = getattr(compression, "__name__", str(compression))
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05), compression=compression)
        model.compile(optimizer=opt, loss="mse")
        if str(model.weights[0].value.device) != dev:
            fails.append(f"the model is not on {dev}: {model.weights[0].value.device}")
        loss = model.fit(x, y, batch_size=32, epochs=3, verbose=0,
                         callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)]).history["loss"]
        if not loss[-1] < loss[0]:
            fails.append(f"{name}: the loss did not fall: {loss}")

        xb, yb = torch.as_tensor(x[:32], device=dev), torch.as_tensor(y[:32], device=dev)
        model.zero_grad()
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        grads = [v.value.grad for v in model.trainable_weights]
        state = opt._horo  # noqa: SLF001 - the optimizer's exchange, as apply() calls it on several ranks
        # The first call sets the GPU backend up (a collective, and CuPy's kernel loads copy code to the GPU).
        state.backend.exchange(list(grads), state.settings, state.fused)
        out, copies = host_copies(lambda: state.backend.exchange(list(grads), state.settings, state.fused))  # noqa: B023
        print(f"rank {hvd.rank()} {name}: loss {[round(v, 4) for v in loss]}, exchange host copies {copies}",
              flush=True)
        if any(copies.values()):
            fails.append(f"{name}: host copies in the gradient exchange: {copies}")
        for i, (g, o) in enumerate(zip(grads, out)):
            if not isinstance(o, torch.Tensor) or str(o.device) != dev or o.dtype != g.dtype:
                fails.append(f"{name}: gradient {i} came back as {type(o).__name__} {getattr(o, 'device', '')}")
            elif not torch.allclose(o, g, rtol=1e-2, atol=1e-3):  # one rank: the average is the gradient
                fails.append(f"{name}: gradient {i} changed by {(o - g).abs().max().item()}")
    if hvd.rank() == 0:
        print("\n".join(fails) or "KERAS GPU CHECKS OK")
    hvd.shutdown()
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
