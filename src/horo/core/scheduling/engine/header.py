"""The engine's round header: its flag bits and words, and the bit vector of cached names."""

from __future__ import annotations

from ...base.state import state
from ..negotiation import BLOCKED

__all__ = ["BLOCKED_SHIFT", "DIVERGED", "HDR", "JOINED", "LEAVING", "SEQ_SHIFT", "SHUTDOWN", "STALLED", "TUNE",
           "TUNED", "UNCACHED", "WAITING", "blocked_word", "mask_words", "set_bits"]

SHUTDOWN, UNCACHED, STALLED, JOINED, LEAVING, TUNED = 1, 2, 4, 8, 16, 32
# A caller of this rank waits in synchronize(); rank 0 saw ranks wait for each other (diverge.py).
WAITING, DIVERGED = 64, 128
# Flags bits 8-23: 1 + id of the process set whose agreement this rank's caller waits in (0: none); bits 24-55:
# that agreement's sequence number, so the same wait seen in two rounds is known to be one wait.
BLOCKED_SHIFT, SEQ_SHIFT = 8, 24
HDR = 2  # flags, round-entry wall time (µs); then, while autotuning, TUNE words; then the bit vector
TUNE = 6  # rank 0's setting: sequence number, fusion bytes, cycle time (µs), chunk bytes, on/off bits, bucket bytes
WORD = (1 << 64) - 1


def signed(word: int) -> int:
    """An unsigned 64-bit word as the int64 it is sent as."""
    return word - (1 << 64) if word >> 63 else word


def mask_words(mask: int, words: int) -> list[int]:
    """A bit mask as ``words`` int64 words, least significant first (the header's bit vector)."""
    return [signed((mask >> (64 * i)) & WORD) for i in range(words)]


def set_bits(words: list[int]) -> list[int]:
    """Indices of the set bits of little-endian int64 ``words``, ascending."""
    out: list[int] = []
    for i, w in enumerate(words):
        w &= WORD
        while w:
            low = w & -w
            out.append(64 * i + low.bit_length() - 1)
            w ^= low
    return out


def blocked_word() -> int:
    """The flag bits saying in which set's agreement this rank's caller waits (see BLOCKED_SHIFT)."""
    comm = BLOCKED.comm
    if comm is None:
        return 0
    for set_id, ps in list(state.process_sets.items()):
        if ps.comm is comm:
            return ((set_id + 1) << BLOCKED_SHIFT) | ((BLOCKED.seq & 0xFFFFFFFF) << SEQ_SHIFT)
    return 0

