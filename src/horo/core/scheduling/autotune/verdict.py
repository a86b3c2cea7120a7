"""The one rule for keeping a tuned choice over the default: it must win beyond the noise, pair by pair.

Autotune's final check (``search``) and the first rank's choice between one MPI call and pieces (``pieces``)
both measure a candidate and the default form in turn, in pairs measured back to back, and keep the
candidate only when it beat the default in every pair and by ``FINAL_MARGIN`` in the median pair. On a
shared machine a paired ratio moves by 3-5 % between runs; a candidate inside that band is noise, and
keeping it could only make a job slower than the defaults.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["FINAL_MARGIN", "Decision", "decide"]

FINAL_MARGIN = 0.05


@dataclass(frozen=True)
class Decision:
    """The final check: the winner's score over the defaults', pair by pair, and what was kept."""

    kept: str  # "tuned" or "defaults"
    ratios: tuple[float, ...]  # winner / defaults per pair (scores are throughputs: > 1 means the winner is faster)
    margin: float

    @property
    def median(self) -> float:
        return statistics.median(self.ratios) if self.ratios else 1.0

    def describe(self) -> str:
        pairs = ", ".join(f"{r:.3f}" for r in self.ratios)
        if not self.ratios:
            return "kept defaults: the search's winner is the default setting"
        return (f"kept {self.kept}: winner/defaults = {self.median:.3f} (median of {len(self.ratios)} interleaved "
                f"pairs: {pairs}; the winner must beat the defaults in every pair and by {100 * self.margin:.0f} % "
                "in the median)")


def decide(winner_scores: Sequence[float], default_scores: Sequence[float], margin: float = FINAL_MARGIN) -> Decision:
    """Keep the winner only when it beats the defaults in every pair and by ``margin`` in the median pair.

    Scores are rates (higher is better), one per pair, in the same order for both.
    """
    ratios = tuple(w / d if d > 0 else math.inf for w, d in zip(winner_scores, default_scores))
    wins = bool(ratios) and min(ratios) > 1.0 and statistics.median(ratios) >= 1.0 + margin
    return Decision("tuned" if wins else "defaults", ratios, margin)
