"""The response cache: matching every rank's pending names, identically on every rank, within a round."""

from __future__ import annotations

import numpy as np

from ..negotiation import JOIN, Signature, joinable
from ..request import AUTO
from .header import set_bits

__all__ = ["Matching"]


class Matching:
    """Mixin of :class:`Engine`: deciding what runs, what mismatched and what still waits."""

    def _match(self, words: np.ndarray, gathered: list[list[tuple[str, Signature]]] | None
               ) -> tuple[list[str], list[tuple[str, list[Signature]]], dict[str, set[int]]]:
        """Decide, identically on every rank, what runs now, what mismatched, what is still waiting."""
        if gathered is None and not self.absent and words.shape[1]:
            rows = words.tolist()
            if rows.count(rows[0]) == len(rows):  # the steady state: every rank has the same names pending
                key = tuple(rows[0])
                names = self.ready_memo.get(key)
                if names is None:
                    if len(self.ready_memo) >= 256:  # a step has few distinct sets; bound it all the same
                        self.ready_memo.clear()
                    names = self.ready_memo[key] = [self.cache_names[b] for b in set_bits(rows[0])]
                return list(names), [], {}
        ready_bits: list[int] = []
        partial: dict[str, set[int]] = {}
        holders: dict[int, set[int]] = {}
        if words.shape[1]:
            per_rank = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")
            counts = per_rank.sum(axis=0)
            for bit in np.nonzero(counts)[0].tolist():
                holders[bit] = set(np.nonzero(per_rank[:, bit])[0].tolist())
                if counts[bit] + len(self.absent - holders[bit]) == self.n:
                    ready_bits.append(bit)
        reports: dict[str, dict[int, Signature]] = {}
        for r, lst in enumerate(gathered or ()):
            for name, sig in lst:
                reports.setdefault(name, {})[r] = sig
        fresh: list[str] = []
        mismatched: list[tuple[str, list[Signature]]] = []
        for name in sorted(reports):
            sigs = dict(reports[name])
            bit = self.cache.get(name)
            if bit is not None:
                for r in holders.pop(bit, ()):
                    sigs.setdefault(r, self.cache_sigs[bit])
                if bit in ready_bits:
                    ready_bits.remove(bit)
            if len(sigs) + len(self.absent - set(sigs)) < self.n:
                partial[name] = set(sigs)
                continue
            present = [sigs[r] for r in sorted(sigs)]
            ordered = [sigs.get(r, JOIN) for r in range(self.n)]
            if len(present) < self.n and not (all(x == present[0] for x in present) and joinable(present[0])):
                mismatched.append((name, ordered))
                continue
            self.sig_of[name] = present[0]
            ordered = [sigs.get(r, present[0]) for r in range(self.n)]
            if any(s != ordered[0] for s in ordered):
                mismatched.append((name, ordered))
                continue
            fresh.append(name)
            if bit is not None:
                self.cache_sigs[bit] = ordered[0]
            elif AUTO not in name and self.cache_on and len(self.cache_sigs) < self.capacity:
                self.cache[name] = len(self.cache_sigs)
                self.cache_sigs.append(ordered[0])
                self.cache_names.append(name)
        for bit, who in holders.items():
            if bit not in ready_bits:
                partial[self.cache_names[bit]] = who
        order = sorted(ready_bits + [self.cache[n] for n in fresh if n in self.cache])
        ready = [self.cache_names[b] for b in order] + sorted(n for n in fresh if n not in self.cache)
        return ready, mismatched, partial

