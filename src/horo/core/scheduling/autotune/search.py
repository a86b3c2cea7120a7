"""Where to look next: fixed starting points, then a Gaussian process with expected improvement.

The continuous knobs (fusion threshold, cycle time, chunk size, and the gradient bucket size where some
exchange's buckets follow it) are searched on a log scale mapped to the unit cube: on host memory the best
fusion threshold sits near 1 MiB, which a linear 0-64 MiB axis (as in Horovod) would squeeze into its first
2 %. The Gaussian process is scikit-learn's (the optional
``horo-mpi[autotune]`` extra, imported only when autotune is on); the acquisition is maximised with SciPy's
L-BFGS-B from the best of a few thousand random candidates. On/off knobs (the response cache, and the
hierarchical allreduce and allgather where the job spans hosts and some host runs several ranks) are tried
after the continuous search, one after the other, each flipped once at the best setting so far, as
Horovod chains them; a flipped trial is rated by its setting's rating times the ratio of their raw scores.

Then, beyond Horovod, a run-off: the ``FINALISTS`` best-rated settings are measured again, in turn,
``CONFIRM_ROUNDS`` times (A B C A B C), and the one with the best mean of those back-to-back scores is
kept. On this shared 2-core machine a trial's score swings by 10-30 %, so the search's own ranking of
settings within that band is a coin toss; the run-off compares them under the same conditions.

Last, the final check: the run-off's winner and the defaults (the configured setting) are measured in turn,
``FINAL_ROUNDS`` pairs with the order alternating (D W, W D, D W), and the winner is kept only when it beat
the defaults in every pair and by at least ``FINAL_MARGIN`` in the median pair; otherwise the defaults are
kept. A tuned job is then never slower than an untuned one beyond the noise (docs/autotune.md, "The final
check"). :class:`Decision` records the comparison.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from .settings import CATEGORICAL, Knobs
from .verdict import FINAL_MARGIN, Decision, decide

__all__ = ["CONTINUOUS", "Decision", "EXTRA_HINT", "FINAL_MARGIN", "FINAL_ROUNDS", "Search", "decide", "from_unit",
           "load_gp", "to_unit"]

EXTRA_HINT = "pip install 'horo-mpi[autotune]'"
FINALISTS = 3
CONFIRM_ROUNDS = 2
FINAL_ROUNDS = 3  # pairs of (defaults, winner) trials in the final check


#: continuous knob -> (log2 of the low end, log2 of the high end) of its search range.
CONTINUOUS: dict[str, tuple[float, float]] = {
    "fusion_threshold": (14.0, 26.0),  # 16 KiB .. 64 MiB
    "cycle_time_ms": (0.0, math.log2(100.0)),  # 1 .. 100 ms
    "chunk_bytes": (18.0, 26.0),  # 256 KiB .. 64 MiB
    "bucket_bytes": (18.0, 26.0),  # 256 KiB .. 64 MiB; searched only where gradient buckets follow it
}

# Spread over the space in log terms; the configured (or HORO_AUTOTUNE_START) setting is tried first.
_FIXED_POINTS: tuple[dict[str, float], ...] = (
    {"fusion_threshold": 1 << 20, "cycle_time_ms": 10.0, "chunk_bytes": 1 << 20, "bucket_bytes": 4 << 20},
    {"fusion_threshold": 16 << 20, "cycle_time_ms": 50.0, "chunk_bytes": 8 << 20, "bucket_bytes": 1 << 20},
    {"fusion_threshold": 128 << 10, "cycle_time_ms": 2.0, "chunk_bytes": 32 << 20, "bucket_bytes": 64 << 20},
    {"fusion_threshold": 4 << 20, "cycle_time_ms": 25.0, "chunk_bytes": 256 << 10, "bucket_bytes": 512 << 10},
)


def load_gp() -> tuple[Any, Any, Any, Any]:
    """scikit-learn's GaussianProcessRegressor and kernels, and SciPy's minimize and norm.

    Raises:
        ImportError: naming the ``horo-mpi[autotune]`` extra when scikit-learn is missing.
    """
    try:
        from scipy.optimize import minimize
        from scipy.stats import norm
        from sklearn.gaussian_process import GaussianProcessRegressor, kernels
    except ImportError as exc:
        raise ImportError(
            f"horo's autotune needs scikit-learn, which is not installed ({exc}). Received: HORO_AUTOTUNE=1. "
            f"HINT: {EXTRA_HINT}, or turn autotune off."
        ) from exc
    return GaussianProcessRegressor, kernels, minimize, norm


def to_unit(knob: str, value: float) -> float:
    lo, hi = CONTINUOUS[knob]
    return float(np.clip((math.log2(max(value, 1e-9)) - lo) / (hi - lo), 0.0, 1.0))


def from_unit(knob: str, u: float) -> float:
    lo, hi = CONTINUOUS[knob]
    value = 2.0 ** (lo + (hi - lo) * float(np.clip(u, 0.0, 1.0)))
    if knob == "cycle_time_ms":
        return round(value, 2)
    return float(int(round(value / 1024.0)) * 1024)  # whole KiB


class Search:
    """Proposes settings one trial at a time; ``tell`` each score, read ``best`` at the end.

    Args:
        start: the first trial.
        fixed: knobs set by hand (knob -> value); never changed.
        max_samples: trials of the continuous search (fixed points included).
        noise: the Gaussian process's noise level (``alpha``) on standardised scores, as in Horovod.
        seed: for the random candidates (only rank 0 searches, so this is for reproducible runs).
        defaults: the setting a job without autotune runs (None: no final check against it).
        buckets: search ``bucket_bytes`` too (when not fixed): some gradient buckets follow it.
    """

    def __init__(self, start: Knobs, fixed: Mapping[str, float], max_samples: int, noise: float,
                 seed: int = 0, defaults: Knobs | None = None, buckets: bool = False) -> None:
        self.defaults = defaults
        self.decision: Decision | None = None
        self._final: list[Knobs] | None = None  # the final check's trials still to run
        self._final_scores: dict[Knobs, list[float]] = {}
        self._winner: Knobs | None = None
        self.dims = [k for k in CONTINUOUS if k not in fixed and (buckets or k != "bucket_bytes")]
        self.max_samples = max_samples
        self.noise = max(noise, 1e-6)
        self.rng = np.random.default_rng(seed)
        self.start = start
        self.points: list[Knobs] = [start]
        for p in _FIXED_POINTS:
            cand = self._knobs({k: to_unit(k, p[k]) for k in self.dims})
            if self.dims and cand not in self.points:
                self.points.append(cand)
        self.points = self.points[:max_samples] if self.dims else [start]
        self.categorical = [k for k in CATEGORICAL if k not in fixed]
        self._parent: dict[Knobs, Knobs] = {}  # an on/off trial -> the setting it flipped a knob of
        self.history: list[tuple[Knobs, float]] = []
        self.phase = "fixed"
        self._runoff: list[Knobs] | None = None  # the trials still to run in the run-off (None: not begun)
        self._confirmed: dict[Knobs, list[float]] = {}
        self._gp: tuple[Any, Any, Any, Any] | None = None
        if self.dims and max_samples > len(self.points):
            self._gp = load_gp()

    @property
    def best(self) -> tuple[Knobs, float]:
        """The setting to keep, with its score: after the run-off, the finalist with the best mean there."""
        if self._confirmed:
            return max(((k, sum(v) / len(v)) for k, v in self._confirmed.items()), key=lambda kv: kv[1])
        return self._rated()

    @property
    def chosen(self) -> tuple[Knobs, float]:
        """The setting to freeze: the winner, unless the final check kept the defaults (then those)."""
        if self.decision is None or self._winner is None:
            return self.best
        knobs = self._winner if self.decision.kept == "tuned" else self.defaults
        assert knobs is not None
        scores = self._final_scores.get(knobs) or [self.best[1]]
        return knobs, sum(scores) / len(scores)

    def _ratings(self) -> dict[Knobs, float]:
        """Every tried setting's rating (see :meth:`_rated`)."""
        raw = dict(self.history)  # knobs -> score (a setting tried twice keeps its last score)
        est = dict(raw)
        fit = self._fit()
        if fit is not None:
            gp, x, hist, mu, sd = fit
            for (k, _), m in zip(hist, gp.predict(x) * sd + mu):
                est[k] = float(m)
        for k, parent in self._parent.items():  # in trial order: a parent is rated before its children
            if k in raw and parent in est and raw.get(parent, 0) > 0:
                est[k] = est[parent] * raw[k] / raw[parent]
        return est

    def _rated(self) -> tuple[Knobs, float]:
        """The tried setting rated highest, with its rating.

        Settings of the continuous search are rated by the Gaussian process's posterior mean at the point
        rather than by their own score: on a noisy machine the highest single trial is often a lucky draw
        (Horovod keeps the raw maximum). The other value of an on/off knob, tried once at a point of the
        continuous search, is rated like with like: that point's rating times the ratio of the two raw scores
        measured there (a raw score against a posterior mean favoured whichever was rated raw).
        """
        return max(self._ratings().items(), key=lambda kv: kv[1])

    def first(self) -> Knobs:
        return self.points[0]

    def max_trials(self) -> int:
        """The most trials this search can run: the continuous search, one flip per on/off knob, the run-off and
        the final check."""
        continuous = max(len(self.points), self.max_samples) if self.dims else 1
        return continuous + len(self.categorical) + FINALISTS * CONFIRM_ROUNDS + 2 * FINAL_ROUNDS

    def _knobs(self, unit: Mapping[str, float], base: Knobs | None = None) -> Knobs:
        kw: dict[str, Any] = {}
        for k, u in unit.items():
            v = from_unit(k, u)
            kw[k] = v if k == "cycle_time_ms" else int(v)
        return replace(base or self.start, **kw)

    def tell(self, knobs: Knobs, score: float) -> Knobs | None:
        """Record the score of ``knobs``; return the next setting to try, or None when the search is over."""
        if self.phase == "final":
            self._final_scores.setdefault(knobs, []).append(score)
            if self._final:
                return self._final.pop(0)
            assert self._winner is not None and self.defaults is not None
            self.decision = decide(self._final_scores[self._winner], self._final_scores[self.defaults])
            self.phase = "done"
            return None
        if self.phase == "confirm":
            self._confirmed.setdefault(knobs, []).append(score)
            if self._runoff:
                return self._runoff.pop(0)
            return self._begin_final()
        self.history.append((knobs, score))
        n = len(self.history)
        continuous_done = n >= len(self.points) and (not self.dims or n >= self.max_samples)
        if not continuous_done:
            if n < len(self.points):
                return self.points[n]
            self.phase = "bayes"
            return self._propose()
        # On/off knobs: each other value once, at the best setting so far.
        for knob in self.categorical:
            if len({getattr(k, knob) for k, _ in self.history}) < 2:
                self.phase = "categorical"
                best = self._rated()[0]
                flipped = replace(best, **{knob: not getattr(best, knob)})
                self._parent[flipped] = best
                return flipped
        ranked = sorted(self._ratings().items(), key=lambda kv: kv[1], reverse=True)
        finalists = [k for k, _ in ranked[:FINALISTS]]
        if len(finalists) < 2 or self._runoff is not None:
            return self._begin_final()
        self.phase = "confirm"
        self._runoff = finalists * CONFIRM_ROUNDS
        return self._runoff.pop(0)

    def _begin_final(self) -> Knobs | None:
        """After the run-off: the winner against the defaults, interleaved (see the module docstring)."""
        self._winner = winner = self.best[0]
        if self.defaults is None or winner == self.defaults:
            if self.defaults is not None:
                self.decision = Decision("defaults", (), FINAL_MARGIN)
            self.phase = "done"
            return None
        self.phase = "final"
        d = self.defaults
        self._final = [k for r in range(FINAL_ROUNDS) for k in ((d, winner) if r % 2 == 0 else (winner, d))]
        return self._final.pop(0)

    @staticmethod
    def _on_off(k: Knobs) -> tuple[bool, ...]:
        return tuple(getattr(k, c) for c in CATEGORICAL)

    def _fit(self) -> tuple[Any, np.ndarray, list[tuple[Knobs, float]], float, float] | None:
        """The Gaussian process over the continuous trials (the start's on/off knobs), or None (< 3 trials).

        Returns (gp, unit-cube points, their trials, mean, std): the GP models standardised scores.
        """
        home = self._on_off(self.start)
        hist = [(k, s) for k, s in self.history if self._on_off(k) == home]
        if not self.dims or len(hist) < 3:
            return None
        gpr_cls, kernels, _, _ = self._gp or load_gp()
        x = np.array([[to_unit(dim, getattr(k, dim)) for dim in self.dims] for k, _ in hist])
        y = np.array([s for _, s in hist], dtype=np.float64)
        mu, sd = float(y.mean()), float(y.std()) or 1.0  # standardise: the noise level means the same at any scale
        kernel = kernels.ConstantKernel(1.0, (1e-2, 1e2)) * kernels.Matern(
            length_scale=np.full(len(self.dims), 0.3), length_scale_bounds=(0.05, 10.0), nu=2.5)
        gp = gpr_cls(kernel=kernel, alpha=self.noise, n_restarts_optimizer=2, random_state=0)
        import warnings

        with warnings.catch_warnings():  # few noisy points: bound warnings on the kernel fit are expected
            warnings.simplefilter("ignore")
            gp.fit(x, (y - mu) / sd)
        return gp, x, hist, mu, sd

    def _propose(self) -> Knobs:
        _, _, minimize, norm = self._gp or load_gp()
        d = len(self.dims)
        fit = self._fit()
        if fit is None:
            return self._knobs(dict(zip(self.dims, self.rng.random(d).tolist())))
        gp, x = fit[0], fit[1]
        incumbent = float(gp.predict(x).max())  # noisy scores: compare with the model, not the raw best
        xi = 0.01

        def ei(u: np.ndarray) -> np.ndarray:
            mu, sigma = gp.predict(np.atleast_2d(u), return_std=True)
            imp = mu - incumbent - xi
            z = np.divide(imp, sigma, out=np.zeros_like(imp), where=sigma > 0)
            return np.where(sigma > 0, imp * norm.cdf(z) + sigma * norm.pdf(z), 0.0)

        cand = self.rng.random((2048, d))
        scores = ei(cand)
        starts = cand[np.argsort(scores)[-4:]]
        found: list[tuple[float, np.ndarray]] = []
        for s in starts:
            res = minimize(lambda u: -float(ei(u)[0]), s, method="L-BFGS-B", bounds=[(0.0, 1.0)] * d)
            found.append((float(res.fun), np.clip(res.x, 0.0, 1.0)))
        found.sort(key=lambda fu: fu[0])
        seen = {k for k, _ in self.history}
        for _, u in found + [(0.0, c) for c in cand[np.argsort(scores)[::-1]]]:
            knobs = self._knobs(dict(zip(self.dims, u.tolist())), base=self.start)
            if knobs not in seen:
                return knobs
        return self._knobs(dict(zip(self.dims, self.rng.random(d).tolist())))
