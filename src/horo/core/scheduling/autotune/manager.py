"""Rank 0's parameter manager: scores samples, runs the search, logs trials, freezes the best setting.

The engine calls ``record`` after every round it executed while tuning, and ``applied`` when a new setting
has taken effect on every rank. Scoring follows Horovod: a *sample* ends when some tensor name comes round
for the ``steps_per_sample + 1``-th time; its score is the bytes the engine allreduced during the sample
per microsecond. The first ``warmup_samples`` samples after every change are discarded (fresh fusion
buffers are allocated and faulted in; Horovod discards warm-up samples only once, at the start); a trial
scores the median of the next 5. The search ends with the winner measured against the defaults in turn
(``search.decide``); the frozen setting is the one that check kept, and the log's last row says which and why.
"""

from __future__ import annotations

import csv
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ...base.timeline import timeline
from .cache import cache_key, load_entry, store_entry
from .search import Search
from .settings import BUCKET_KNOB_PREFIX, AutotuneOptions, Knobs, start_knobs

__all__ = ["LOG_COLUMNS", "Manager", "SAMPLES_PER_TRIAL"]

SAMPLES_PER_TRIAL = 5
#: Horovod's columns, then horo's own knob and what the row is.
LOG_COLUMNS = ("hierarchical_allreduce", "hierarchical_allgather", "cache_enabled", "cycle_time_ms",
               "tensor_fusion_threshold", "score", "chunk_bytes", "bucket_bytes", "trial", "phase", "note")


class Manager:
    """Lives on rank 0 only; the engine broadcasts ``current`` in its round header (see engine.py).

    Args:
        options: the agreed autotune options.
        base: the knobs in effect at ``init()``.
        fixed: knobs set by hand, knob -> value (held fixed).
        job: world_size, hosts, mpi: the job half of the cache key.
    """

    def __init__(self, options: AutotuneOptions, base: Knobs, fixed: Mapping[str, float],
                 job: Mapping[str, Any]) -> None:
        self.options = options
        self.fixed = dict(fixed)
        self.job = dict(job)
        self._search_args = (start_knobs(base, options.start, fixed), options.max_samples, options.noise,
                             start_knobs(base, {}, fixed))
        self.search = self._new_search(buckets=False)
        self.current = self.search.first()
        self.seq = 1  # bumped for every new setting; the engine applies a setting when the number changes
        self.done = False
        self.trials: list[dict[str, Any]] = []  # the trajectory: knobs, score, samples, phase
        self.cached: dict[str, Any] | None = None
        self._layout: list[tuple[str, str, int]] = []
        self._layout_done = False
        self._counts: dict[str, int] = {}
        self._bytes = 0
        self._t_sample: float | None = None
        self._t_trial_us = timeline.now_us()
        self._samples: list[float] = []
        self._warm_left = options.warmup_samples
        self._waiting = True  # until ``current`` is in effect everywhere
        self._log = None
        if options.log_file:
            try:
                self._log = open(options.log_file, "w", newline="")  # noqa: SIM115 - kept open while tuning
            except OSError as exc:
                raise ValueError(f"cannot write the autotune log ({exc.strerror}). Received: "
                                 f"HORO_AUTOTUNE_LOG={options.log_file!r}. HINT: give a writable path.") from None
            csv.writer(self._log).writerow(LOG_COLUMNS)
            self._log.flush()

    def step_budget(self) -> int:
        """The most steps (each tensor name once per step) tuning can take before it freezes a setting, from
        the search's trial count and the sampling settings: what a job must run to see tuning end."""
        sps = self.options.steps_per_sample
        # A sample ends when a name comes round for the (sps + 1)-th time; a new setting takes effect a round
        # later; the first trial restarts once, when the layout shows gradient buckets.
        per_trial = (self.options.warmup_samples + SAMPLES_PER_TRIAL) * (sps + 1) + 2
        return (self.search.max_trials() + 1) * per_trial

    # ---- called by the engine thread ---------------------------------------------------------------
    def applied(self) -> None:
        """``current`` is now in effect on every rank: start sampling it."""
        self._waiting = False
        self._counts.clear()
        self._bytes = 0
        self._t_sample = None
        self._samples = []
        self._warm_left = self.options.warmup_samples
        self._t_trial_us = timeline.now_us()

    def record(self, reduced: Sequence[tuple[str, str, int]], t_round: float) -> None:
        """One executed round: (name, dtype, bytes) of what ran; ``t_round``: when it started executing."""
        if self.done or self._waiting or not reduced:
            return
        if self._t_sample is None:
            self._t_sample = t_round
        sps = self.options.steps_per_sample
        if any(self._counts.get(name, 0) >= sps for name, _, _ in reduced):
            self._end_sample(self._bytes / max((t_round - self._t_sample) * 1e6, 1e-9))
            if self._waiting or self.done:
                return
            self._counts.clear()
            self._bytes = 0
            self._t_sample = t_round
        for name, dtype, nbytes in reduced:
            self._counts[name] = self._counts.get(name, 0) + 1
            self._bytes += nbytes
            if not self._layout_done:
                self._layout.append((name, dtype, nbytes))

    def abandon(self, exc: BaseException) -> None:
        """A failure inside the tuner must not take the engine down: keep the current setting, stop tuning."""
        sys.stderr.write(f"horo: autotune stopped after an internal error ({type(exc).__name__}: {exc}); "
                         f"keeping {self.current}.\n")
        sys.stderr.flush()
        self.seq += 1
        self.done = True
        if self._log is not None:
            self._log.close()
            self._log = None

    # ---- internals --------------------------------------------------------------------------------
    def _new_search(self, buckets: bool) -> Search:
        """The search; ``buckets``: some gradient buckets follow the bucket size, so it is searched too
        (unless set by hand). Without them the knob is held at its configured value: it changes nothing."""
        start, max_samples, noise, defaults = self._search_args
        fixed = self.fixed if buckets else {"bucket_bytes": float(start.bucket_bytes), **self.fixed}
        return Search(start, fixed, max_samples, noise, defaults=defaults, buckets=buckets)

    def _key(self) -> str:
        return cache_key(self.job.get("world_size", 0), self.job.get("hosts", ()), self.job.get("mpi", ""),
                         self._layout, self.fixed)

    def _end_sample(self, score: float) -> None:
        if not self._layout_done:
            self._layout_done = True  # the first sample saw every tensor of a step at least once
            if any(name.startswith(BUCKET_KNOB_PREFIX) for name, _, _ in self._layout):
                # Still the first trial, nothing told to the search yet: it restarts with the bucket size.
                self.search = self._new_search(buckets=True)
            if self.options.cache_file and self._reuse():
                return
        if self._warm_left > 0:
            self._warm_left -= 1
            return
        self._samples.append(score)
        if len(self._samples) < SAMPLES_PER_TRIAL:
            return
        score = statistics.median(self._samples)
        knobs, phase = self.current, self.search.phase
        if phase == "final":
            phase = "final-defaults" if knobs == self.search.defaults else "final-winner"
        self._row(knobs, score, phase, samples=list(self._samples))
        if timeline.active:
            timeline.span("autotune", f"TRIAL {len(self.trials)}", self._t_trial_us, timeline.now_us(),
                          score=round(score, 3), search=phase, **knobs.as_dict())
            timeline.flush()
        nxt = self.search.tell(knobs, score)
        if nxt is None:
            chosen, chosen_score = self.search.chosen
            decision = self.search.decision
            if decision is None:
                self._finish(chosen, chosen_score, "best")
            else:
                self._finish(chosen, chosen_score, f"kept-{decision.kept}", note=decision.describe())
            return
        self.current = nxt
        self.seq += 1
        self._waiting = True

    def _reuse(self) -> bool:
        entry = load_entry(self.options.cache_file or "", self._key())
        if entry is None:
            return False
        kw = {k: entry["knobs"][k] for k in Knobs.__dataclass_fields__ if k in entry["knobs"]}
        knobs = replace(Knobs(**kw), **{k: type(getattr(Knobs(), k))(v) for k, v in self.fixed.items()})
        self.cached = entry
        sys.stderr.write(f"horo: autotune: reusing the setting cached in {self.options.cache_file} for this job "
                         f"({knobs}); not tuning again.\n")
        sys.stderr.flush()
        self._finish(knobs, float(entry.get("score", 0.0)), "cached", store=False)
        return True

    def _finish(self, knobs: Knobs, score: float, phase: str, store: bool = True, note: str = "") -> None:
        """Freeze ``knobs``: the engine broadcasts them once more and stops tuning."""
        self.current = knobs
        self.seq += 1
        self.done = True
        self._row(knobs, score, phase, note=note)
        if self._log is not None:
            self._log.close()
            self._log = None
        if store and self.options.cache_file:
            store_entry(self.options.cache_file, self._key(), {
                "knobs": knobs.as_dict(), "score": score, "trials": len(self.trials) - 1, "saved": time.time(),
                "world_size": self.job.get("world_size"), "hosts": list(self.job.get("hosts", ())),
                "mpi": self.job.get("mpi")})

    def _row(self, knobs: Knobs, score: float, phase: str, samples: list[float] | None = None,
             note: str = "") -> None:
        self.trials.append({"knobs": knobs, "score": score, "phase": phase, "samples": samples or [], "note": note})
        if self._log is None:
            return
        csv.writer(self._log).writerow([
            int(knobs.hierarchical_allreduce), int(knobs.hierarchical_allgather), int(knobs.cache_enabled),
            f"{knobs.cycle_time_ms:g}", knobs.fusion_threshold, f"{score:.6g}", knobs.chunk_bytes, knobs.bucket_bytes,
            len(self.trials), phase, note])
        self._log.flush()
