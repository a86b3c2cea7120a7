"""The engine's knobs: the configured ones, and switching to the setting autotune chose (see autotune)."""

from __future__ import annotations

import numpy as np

from ...base.config import config
from ...transport.fusion import Buffers
from ..autotune.settings import Knobs

__all__ = ["Tuning"]


class Tuning:
    """Mixin of :class:`Engine`: its knobs and their changes."""

    knobs: Knobs
    fusion: Buffers

    @staticmethod
    def configured_knobs() -> Knobs:
        """The knobs an engine starts with, from the agreed configuration."""
        return Knobs(config.int("HORO_FUSION_THRESHOLD"), config["HORO_CYCLE_TIME"], config.int("HORO_CHUNK_BYTES"),
                     config.int("HORO_CACHE_CAPACITY") > 0, bool(config.get("HORO_HIERARCHICAL_ALLREDUCE")),
                     bool(config.get("HORO_HIERARCHICAL_ALLGATHER")), config.int("HORO_BUCKET_BYTES"))

    def _retune(self, words: np.ndarray, final: bool) -> None:
        """Adopt rank 0's setting (identical input on every rank, so identical effect)."""
        seq, fusion, cycle_us, chunk, bits, bucket = (int(w) for w in words)
        if seq != self.knob_seq:
            self.knob_seq = seq
            self.apply(Knobs(fusion, cycle_us / 1000.0, chunk, bool(bits & 1), bool(bits & 2), bool(bits & 4),
                             bucket))
            self.knob_log.append((self.round_no, self.knobs))
            if self.tuner is not None:
                self.tuner.applied()
        if final:
            self.tuning = False  # from the next round on, on every rank: no header words, no bookkeeping

    def apply(self, knobs: Knobs) -> None:
        """Switch to ``knobs``; only between rounds, and at the same round on every rank.

        ``bucket_bytes`` is not the engine's own: each request it finishes carries the knobs of its round
        (``Request.knobs``), and gradient exchanges re-form their buckets from that (``api.bucket_knob``).
        """
        self.knobs = knobs
        self.threshold = knobs.fusion_threshold
        self.idle_s = max(knobs.cycle_time_ms / 1000.0, self.min_tick_s)
        self.chunk = knobs.chunk_bytes
        # The engine's own collectives only: synchronous ones on other threads keep the configured algorithm.
        hier = (knobs.hierarchical_allreduce, knobs.hierarchical_allgather)
        self.hierarchical = None if hier == (bool(config.get("HORO_HIERARCHICAL_ALLREDUCE")),
                                             bool(config.get("HORO_HIERARCHICAL_ALLGATHER"))) else hier
        if knobs.cache_enabled != self.cache_on:
            self.cache_on = knobs.cache_enabled
            if not self.cache_on:  # every rank drops the same cache in the same round
                self.cache.clear()
                self.cache_sigs.clear()
                self.cache_names.clear()
                self.ready_memo.clear()  # bits are handed out afresh
                self.alone_memo.clear()
        if self.threshold < self.fusion.largest() // 2:
            self.fusion.clear()  # do not keep a 64 MiB buffer alive for a 1 MiB threshold

