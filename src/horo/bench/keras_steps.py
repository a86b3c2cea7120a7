"""Where a multi-rank Keras ``fit`` step's time goes, on every rank, step by step.

Run: ``hororun -np 2 python -m horo.bench keras_steps [--backend tensorflow|torch --steps 300 --rounds 3]``.

The model and data are ``bench keras``'s. Each rank stamps (``time.perf_counter``, the machine's monotonic
clock, common to the ranks of one host) the end of every step and the moment it enters and leaves the
exchange; the stamps of all ranks are put side by side per step:

- before     = from the end of the previous step to entering the exchange (forward, backward, scaling)
- waiting    = from entering the exchange to the moment the last rank entered it (mean per rank: this is
               what a rank pays for the other ranks' slower steps)
- transfer   = from the last rank's entry to the first rank's exit: the exchange once everyone is there
- after      = from leaving the exchange to the end of the step (the optimizer's update, Keras' loop)

Variants, interleaved ``--rounds`` times: ``plain`` (ranks train independently), ``call only`` (TensorFlow:
a ``tf.numpy_function`` that passes the gradients through: what leaving TF's graph costs), ``sync only`` (a
4-byte allreduce between backward and update: what making the ranks meet costs), ``bare mpi4py``
(``bench keras``'s hand-written exchange) and ``horo`` (``DistributedOptimizer``). Each round also times a
raw ``Allreduce`` of the gradients' bytes after a barrier, on a reused buffer: the transfer that
``bench keras``'s additive limit counts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import horo.core as core
from horo.bench import keras as kb
from horo.bench._bare import bare_mpi_sgd
from horo.bench._util import env_summary, md_table

__all__ = ["main"]


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m horo.bench keras_steps", description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="tensorflow", choices=("tensorflow", "torch"), help="Keras backend")
    p.add_argument("--steps", type=int, default=300, help="stamped steps per variant and round")
    p.add_argument("--rounds", type=int, default=3, help="rounds (each runs every variant once)")
    p.add_argument("--batch-size", type=int, default=64, help="samples per rank and step")
    p.add_argument("--json", type=Path, default=None, help="also write the per-variant figures here")
    return p.parse_args(argv)


def _between(keras: Any, backend: str, fn: Any) -> Any:
    """A plain SGD that calls ``fn`` on the gradients between backward and update (TF: one numpy_function)."""

    class Between:
        def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
            grads = list(grads)
            if backend == "tensorflow":
                import tensorflow as tf

                outs = tf.numpy_function(lambda *a: fn(list(a)), grads, [g.dtype for g in grads], stateful=True)
                for o, g in zip(outs, grads):
                    o.set_shape(g.shape)
                grads = list(outs)
            else:
                fn([g.detach().numpy() for g in grads])
            return super().apply(grads, trainable_variables)  # type: ignore[misc]

    opt = keras.optimizers.SGD(0.01, momentum=0.9)
    opt.__class__ = type("BetweenSGD", (Between, type(opt)), {})
    return opt


def _stamped(marks: list[tuple[float, float]], fn: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        marks.append((t0, time.perf_counter()))
        return out

    return call


def _variants(keras: Any, hvd: Any, backend: str, marks: list[tuple[float, float]]) -> dict[str, Any]:
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    one = np.zeros(1, np.float32)

    def passthrough(arrays: list[Any]) -> list[Any]:
        return arrays

    def sync(arrays: list[Any]) -> list[Any]:
        t0 = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, one, op=MPI.SUM)
        marks.append((t0, time.perf_counter()))
        return arrays

    out = {"plain": lambda: keras.optimizers.SGD(0.01, momentum=0.9)}
    if backend == "tensorflow":
        out["call only"] = lambda: _between(keras, backend, passthrough)
    out["sync only"] = lambda: _between(keras, backend, sync)
    out["bare mpi4py"] = lambda: bare_mpi_sgd(keras, backend, marks)
    out["horo"] = lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9))
    return out


def _parts(ranks: list[dict[str, list[Any]]]) -> dict[str, list[float]]:
    """Per-step parts (seconds) from every rank's step ends E and exchange marks M (see the docstring)."""
    import numpy as np

    ends = [np.array(r["E"]) for r in ranks]
    out: dict[str, list[float]] = {"step": list(np.diff(ends[0]))}
    marks = [np.array(r["M"]).reshape(-1, 2) for r in ranks]
    n = min(len(e) for e in ends)
    if any(len(m) != n for m in marks):  # no exchange, or not one per step: only the step time
        return out
    enter = [m[1:, 0] for m in marks]
    leave = [m[1:, 1] for m in marks]
    last_in, first_out = np.max(enter, axis=0), np.min(leave, axis=0)
    for r in range(len(ranks)):
        out[f"step {r}"] = list(np.diff(ends[r]))  # each rank's own: its parts add up to it, not to rank 0's
        out[f"before {r}"] = list(enter[r] - ends[r][:-1])
        out[f"waiting {r}"] = list(last_in - enter[r])
        out[f"after {r}"] = list(ends[r][1:] - leave[r])
    out["transfer"] = list(first_out - last_in)
    return out


def _worker(args: argparse.Namespace) -> int:
    kb._limit_threads(args.backend)
    import keras
    import numpy as np

    import horo.keras as hvd  # lazy: imports Keras and its backend's framework

    hvd.init()
    if hvd.size() < 2:
        print("python -m horo.bench keras_steps: needs 2 or more ranks. Received: 1 rank. "
              "HINT: hororun -np 2 python -m horo.bench keras_steps", file=sys.stderr)
        return 2
    if args.backend == "torch":
        import torch

        torch.set_num_threads(1)
    rng = np.random.default_rng(hvd.rank())
    x = rng.random((args.batch_size, 784), dtype=np.float32)
    y = rng.integers(0, 10, args.batch_size)
    if args.backend == "tensorflow":
        import tensorflow as tf

        data: Any = tf.data.Dataset.from_tensors((x, y)).repeat()
    else:
        data = kb._repeat_forever(x, y)
    marks: list[tuple[float, float]] = []
    # horo's exchange is one of these per step (TF: grouped, in place; torch: one fused allreduce_)
    core.grouped_allreduce_ = _stamped(marks, core.grouped_allreduce_)
    core.allreduce_ = _stamped(marks, core.allreduce_)
    variants = _variants(keras, hvd, args.backend, marks)
    parts: dict[str, dict[str, list[float]]] = {name: {} for name in variants}
    raws = []
    ends: list[float] = []
    clock = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: ends.append(time.perf_counter()))
    nbytes = 4 * kb._model(keras).count_params()
    for _ in range(args.rounds):
        for name, make in variants.items():
            model = kb._model(keras)
            model.compile(optimizer=make(), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            model.fit(data, steps_per_epoch=10, epochs=1, verbose=0, callbacks=[clock])  # warm up, trace
            hvd.barrier()
            marks.clear()
            ends.clear()
            model.fit(data, steps_per_epoch=args.steps, epochs=1, verbose=0, callbacks=[clock])
            everyone = hvd.allgather_object({"E": list(ends), "M": list(marks)})
            for key, values in _parts(everyone).items():
                parts[name].setdefault(key, []).extend(values)
        raws.append(kb._raw_allreduce(nbytes))
    if hvd.rank() == 0:
        _report(parts, statistics.median(raws), hvd.size(), args)
    hvd.shutdown()
    return 0


def _report(parts: dict[str, dict[str, list[float]]], raw: float, n: int, args: argparse.Namespace) -> None:
    med, mean = statistics.median, statistics.mean
    ms = lambda v: f"{v * 1e3:.2f}"  # noqa: E731
    rows, fig = [], {}
    for name, p in parts.items():
        f = {"step": med(p["step"])}
        if "transfer" in p:
            f.update({"steps": [med(p[f"step {r}"]) for r in range(n)],
                      "before": [med(p[f"before {r}"]) for r in range(n)],
                      "waiting": [mean(p[f"waiting {r}"]) for r in range(n)],
                      "transfer": med(p["transfer"]), "after": [med(p[f"after {r}"]) for r in range(n)]})
        fig[name] = f
        each = [" / ".join(ms(v) for v in f[k]) if "transfer" in f else "-" for k in ("before", "waiting", "after")]
        rows.append([name, ms(f["step"]), each[0], each[1], ms(f["transfer"]) if "transfer" in f else "-", each[2]])
    print(f"Keras fit at {n} ranks, {args.backend} backend, {args.rounds} rounds x {args.steps} steps per variant; "
          "ms per step (medians; waiting: means), per rank 0 / 1 / ...")
    print(md_table(["variant", "step", "before", "waiting", "transfer", "after"], rows))
    print(f"raw Allreduce of the gradients' bytes after a barrier, reused buffer: {ms(raw)} ms")
    plain, horo = fig["plain"]["step"], fig["horo"]["step"]
    gap = horo - plain - raw
    base = fig.get("call only", fig["plain"])["step"]
    pieces = {"leaving TF's graph (call only - plain)": base - plain if "call only" in fig else None,
              "making the ranks meet (sync only - " + ("call only)" if "call only" in fig else "plain)"):
              fig["sync only"]["step"] - base,
              "transfer in the step - raw Allreduce": fig["horo"]["transfer"] - raw}
    print(f"- horo's step - (independent step + raw Allreduce) = {ms(gap)} ms, of which:")
    for what, v in pieces.items():
        if v is not None:
            print(f"  - {what}: {ms(v)} ms")
    print(f"- additive limit ratio (independent step + raw Allreduce) / step: horo "
          f"{(plain + raw) / horo:.2f}, bare mpi4py {(plain + raw) / fig['bare mpi4py']['step']:.2f}")
    print(env_summary(n))
    if args.json:
        args.json.write_text(json.dumps({"raw": raw, "variants": fig, "backend": args.backend}, indent=2))


def main(argv: list[str]) -> int:
    return _worker(_parse(list(argv)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
