"""Shared helpers for the benchmarks: sizes, interleaved timing, bandwidth math, Markdown tables."""

from __future__ import annotations

import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "Timing", "algbw", "busbw", "env_summary", "fmt_f", "fmt_size", "limit_threads", "md_table", "parse_size",
    "parse_sizes", "time_interleaved",
]

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """``"4B"``, ``"64KiB"``, ``"1M"``, ``"1048576"`` -> bytes (K/M/G are powers of 1024)."""
    m = _SIZE_RE.match(text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"not a size. Received: {text!r}. HINT: write e.g. 4B, 256KiB, 1MiB, 64M.")
    return int(float(m.group(1)) * _UNITS[unit])


def parse_sizes(spec: str, factor: int = 4) -> list[int]:
    """``"4B..64MiB"`` (every ``factor``-th power from lo to hi) or a list ``"1KiB,1MiB,8MiB"``."""
    if ".." in spec:
        lo_s, hi_s = spec.split("..", 1)
        lo, hi = parse_size(lo_s), parse_size(hi_s)
        if lo <= 0 or hi < lo or factor < 2:
            raise ValueError(f"bad size range. Received: {spec!r} with factor {factor}. "
                             "HINT: 0 < lo <= hi and factor >= 2, e.g. 4B..64MiB.")
        out, s = [], lo
        while s <= hi:
            out.append(s)
            s *= factor
        return out
    return [parse_size(p) for p in spec.split(",") if p.strip()]


def fmt_size(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            v = nbytes / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{int(nbytes)} B"


def fmt_f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or np.isnan(value) else f"{value:.{digits}f}"


def algbw(nbytes: int, seconds: float) -> float:
    """nccl-tests algorithm bandwidth in GB/s (1e9 bytes per second)."""
    return nbytes / seconds / 1e9


def busbw(nbytes: int, seconds: float, n: int) -> float:
    """nccl-tests bus bandwidth for allreduce in GB/s: algbw * 2(n-1)/n."""
    return algbw(nbytes, seconds) * (2 * (n - 1) / n if n > 1 else 1.0)


class Timing:
    """Per-variant samples (seconds per iteration, the slowest rank's), summarised by the median."""

    def __init__(self, samples: dict[str, list[float]]) -> None:
        self.samples = samples

    def median(self, name: str) -> float:
        return statistics.median(self.samples[name])

    def stat(self, name: str, how: str = "median") -> float:
        """``median`` (default) or ``min`` of the repeats."""
        return min(self.samples[name]) if how == "min" else self.median(name)

    def spread(self, name: str) -> float:
        """(max - min) / median of the repeats: a rough noise indicator."""
        s = self.samples[name]
        return (max(s) - min(s)) / statistics.median(s)

    def medians(self) -> dict[str, float]:
        return {k: self.median(k) for k in self.samples}

    def paired(self, name: str, *bases: str) -> float:
        """Median over repeats of ``name``'s time / its base's in the same repeat (the quickest of ``bases``).

        A repeat times every variant back to back, so a ratio within it compares them in one machine state.
        On this 2-vCPU VM the state flips every few seconds (raw MPI at 1 MiB: ~105 µs or ~550 µs); the ratio
        of two medians then moves with how many samples of each variant fell in each state, the paired
        ratio does not (docs/benchmarks.md, "How the figures are taken").
        """
        rows = zip(self.samples[name], *(self.samples[b] for b in bases))
        return statistics.median(t / min(base) for t, *base in rows)

    def paired_delta(self, name: str, base: str) -> float:
        """Median over repeats of ``name``'s time minus ``base``'s in the same repeat (seconds)."""
        return statistics.median(t - b for t, b in zip(self.samples[name], self.samples[base]))


def time_interleaved(comm: Any, variants: dict[str, Callable[[], Any]], iters: int, repeats: int,
                     warmup: int = 1, min_time: float = 0.0, max_repeats: int = 1001) -> Timing:
    """Time each variant ``repeats`` times, rotating the order every repeat so noise hits all of them.

    One sample = mean time of ``iters`` back-to-back calls after a barrier; each sample is then replaced by
    its maximum over the ranks (a collective is as slow as its slowest rank). Identical on every rank.

    Args:
        comm: an mpi4py communicator used only for barriers and the final max-reduction.
        variants: name -> zero-argument callable doing one operation (the same order on every rank).
        iters: calls per sample.
        repeats: samples per variant (at least).
        warmup: untimed calls per variant before the first repeat.
        min_time: seconds of timed calls per variant to reach, by taking more repeats (up to
            ``max_repeats``), judged from one more warm call of each variant. On this 2-vCPU machine 11
            samples of 3 calls at 1 MiB left two identical variants 0.92-1.08x apart, 151 samples 0.98-1.01x
            (docs/benchmarks.md, "How the figures are taken").
        max_repeats: the cap on repeats that ``min_time`` may ask for.
    """
    from mpi4py import MPI

    names = list(variants)
    for name in names:
        for _ in range(warmup):
            variants[name]()
    if min_time > 0:
        # The quickest variant's warm call, the largest over the ranks (every rank must take the same number of
        # samples): one slow outlier must not cut the samples short.
        quickest = float("inf")
        for name in names:
            t0 = time.perf_counter()
            variants[name]()
            quickest = min(quickest, time.perf_counter() - t0)
        quickest = comm.allreduce(quickest, op=MPI.MAX)
        repeats = max(repeats, min(max_repeats, int(min_time / max(iters * quickest, 1e-9)) + 1))
    samples = np.zeros((len(names), repeats), dtype=np.float64)
    for rep in range(repeats):
        k = rep % len(names)
        for i in list(range(k, len(names))) + list(range(k)):
            fn = variants[names[i]]
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            samples[i, rep] = (time.perf_counter() - t0) / iters
    comm.Allreduce(MPI.IN_PLACE, samples, op=MPI.MAX)
    return Timing({name: samples[i].tolist() for i, name in enumerate(names)})


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A Markdown table; ``align`` is one char per column, ``l`` or ``r`` (default: first left, rest right)."""
    align = align or ("l" + "r" * (len(headers) - 1))
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(row[j]) for row in cells) for j in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) if a == "l" else c.rjust(w)
                                 for c, w, a in zip(row, widths, align)) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if a == "r" else (":" + "-" * (w + 1))
                          for w, a in zip(widths, align)) + "|"
    return "\n".join([line(cells[0]), rule] + [line(r) for r in cells[1:]])


def limit_threads() -> None:
    """One compute thread per rank (torch and TF read their own settings)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def env_summary(n: int) -> str:
    """One line describing the run conditions (for reading noisy numbers later)."""
    from mpi4py import MPI

    lib = MPI.Get_library_version().splitlines()[0].strip()
    try:
        load = "load avg {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        load = "load avg ?"
    return (f"ranks={n}, cores={os.cpu_count()}, {load}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
            f"{lib}, mpi4py {__import__('mpi4py').__version__}, numpy {np.__version__}")
