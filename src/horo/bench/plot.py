"""``--plot FILE.png`` for every benchmark: the figures people would rather look at than read.

matplotlib is an optional extra (``pip install 'horo-mpi[plot]'``), imported only when a plot is asked for and
checked before the benchmark starts, so a missing extra costs no measuring time. Only rank 0 draws.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from horo.core.base.config import launcher_rank0

__all__ = ["PlotError", "add_plot_arg", "bars", "by_size", "check", "check_arg"]

# Formats matplotlib's Agg backend writes without extra libraries.
_FORMATS = (".png", ".svg", ".pdf")


class PlotError(ValueError):
    """``--plot`` cannot work: matplotlib is missing or the file name is unusable."""


def add_plot_arg(parser: argparse.ArgumentParser) -> None:
    """Add the shared ``--plot FILE.png`` option to a benchmark's parser."""
    parser.add_argument("--plot", metavar="FILE.png",
                        help="also draw the results into FILE.png (rank 0; needs pip install 'horo-mpi[plot]')")


def _pyplot(path: str) -> Any:
    try:
        import matplotlib
    except ImportError:
        raise PlotError(
            f"--plot needs matplotlib, which is not installed. Received: --plot={path!r}. "
            "HINT: pip install 'horo-mpi[plot]' (or pip install matplotlib), or leave out --plot."
        ) from None
    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    return plt


def check(path: str | None) -> None:
    """Fail fast, before any measuring, when ``--plot path`` could not be written.

    Raises:
        PlotError: matplotlib is missing, the extension is not one of .png/.svg/.pdf, or the folder is absent.
    """
    if path is None:
        return
    ext = os.path.splitext(path)[1].lower()
    if ext not in _FORMATS:
        raise PlotError(f"--plot takes a .png, .svg or .pdf file name. Received: --plot={path!r}. "
                        "HINT: e.g. --plot allreduce.png")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise PlotError(f"--plot's folder does not exist. Received: --plot={path!r}. "
                        f"HINT: create {folder} first.")
    _pyplot(path)


def check_arg(path: str | None, prog: str) -> bool:
    """:func:`check` for a benchmark's ``main``: False (message printed once per job) when unusable."""
    try:
        check(path)
    except PlotError as exc:
        if launcher_rank0():
            import sys

            print(f"{prog}: {exc}", file=sys.stderr, flush=True)
        return False
    return True


def _footer_lines(footer: str | None) -> str:
    # Run conditions (load average, MPI build) under the plot; MPI version strings may hold NUL bytes.
    if not footer:
        return ""
    clean = "".join(c if c.isprintable() else " " for c in footer)
    return "\n".join(textwrap.wrap(clean, 170)[:2])


def _bottom(footer: str | None, height_in: float) -> float:
    """The fraction of a ``height_in`` inches tall figure that the footer needs."""
    if not footer:
        return 0.0
    return (0.12 * (_footer_lines(footer).count("\n") + 1) + 0.08) / height_in


def _save(fig: Any, path: str, footer: str | None) -> None:
    if footer:
        fig.text(0.01, 0.01, _footer_lines(footer), fontsize=7, color="0.4", ha="left", va="bottom")
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)


def _size_label(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def by_size(path: str, title: str, results: Sequence[Mapping[str, Any]], n: int, stat: str = "median",
            footer: str | None = None) -> None:
    """Two panels over message size: bus bandwidth (GB/s) and time per call (µs), one line per variant.

    Args:
        results: one entry per size, ascending: ``{"bytes": int, "samples_s": {variant: [seconds, ...]}}``
            (the benchmarks' ``--json`` records).
        n: ranks, for busbw = bytes / t * 2(n-1)/n (nccl-tests).
        stat: ``median`` or ``min`` of each variant's samples.
    """
    sizes = [int(r["bytes"]) for r in results]
    names: list[str] = []
    for r in results:
        names += [k for k in r["samples_s"] if k not in names]
    pick = min if stat == "min" else statistics.median
    series = {k: [pick(r["samples_s"][k]) if r["samples_s"].get(k) else math.nan for r in results]
              for k in names}
    plt = _pyplot(path)
    fig, (bw_ax, t_ax) = plt.subplots(1, 2, figsize=(10, 4.2))
    factor = 2 * (n - 1) / n if n > 1 else 1.0
    for name, secs in series.items():
        bw = [s_ / t / 1e9 * factor if t and not math.isnan(t) else math.nan for s_, t in zip(sizes, secs)]
        style = "--" if name.startswith("raw") else "-"
        bw_ax.plot(sizes, bw, style, marker="o", ms=3, label=name)
        t_ax.plot(sizes, [t * 1e6 for t in secs], style, marker="o", ms=3, label=name)
    ticks = sizes[:: max(1, math.ceil(len(sizes) / 8))]
    for ax in (bw_ax, t_ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [_size_label(s) for s in ticks], fontsize=8, rotation=30, ha="right")
        ax.minorticks_off()
        ax.set_xlabel("message size")
        ax.grid(True, which="major", alpha=0.3)
    bw_ax.set_ylabel("bus bandwidth, GB/s")
    bw_ax.set_title("bandwidth (higher is better)", fontsize=10)
    t_ax.set_yscale("log")
    t_ax.set_ylabel("time per call, µs")
    t_ax.set_title("time (lower is better)", fontsize=10)
    bw_ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, _bottom(footer, fig.get_figheight()), 1, 1))
    _save(fig, path, footer)


def bars(path: str, title: str, values: Mapping[str, float], xlabel: str,
         ranges: Mapping[str, tuple[float, float]] | None = None, notes: Mapping[str, str] | None = None,
         highlight: Sequence[str] = (), footer: str | None = None) -> None:
    """Horizontal bars, one per variant (step time per variant, throughput per strategy, scaling).

    Args:
        values: variant -> value (drawn top to bottom in this order).
        ranges: variant -> (min, max) of the repeats, drawn as a whisker.
        notes: variant -> text written after the bar (e.g. an efficiency).
        highlight: variants drawn in a second colour (the baselines).
    """
    plt = _pyplot(path)
    names = list(values)
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 1.5))
    ys = list(range(len(names)))[::-1]
    colours = ["0.6" if nm in highlight else "tab:blue" for nm in names]
    ax.barh(ys, [values[nm] for nm in names], color=colours, height=0.6)
    top = max(values.values(), default=1.0)
    if ranges:
        for y, nm in zip(ys, names):
            if nm in ranges:
                lo, hi = ranges[nm]
                ax.plot([lo, hi], [y, y], color="black", lw=1)
                top = max(top, hi)
    for y, nm in zip(ys, names):
        v = values[nm]
        text = (f"{v:,.0f}" if v >= 100 else f"{v:.3g}") + (f"   {notes[nm]}" if notes and nm in notes else "")
        right = max(v, ranges[nm][1]) if ranges and nm in ranges else v  # clear of the whisker
        ax.text(right + top * 0.01, y, text, va="center", fontsize=8)
    ax.set_yticks(ys, names, fontsize=8)
    ax.set_xlim(0, top * 1.35)
    ax.set_xlabel(xlabel)
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(title, fontsize=10)
    fig.tight_layout(rect=(0, _bottom(footer, fig.get_figheight()), 1, 1))
    _save(fig, path, footer)
