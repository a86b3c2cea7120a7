"""The gradient bucket size as an autotune knob, for the framework exchanges that bucket gradients.

The bucket size (``HORO_BUCKET_BYTES``) is one of autotune's knobs, but buckets belong to a framework's
gradient exchange, not to the engine. Ranks must re-form their buckets at the same step, or their
exchanges stop matching, and "the value I see now" differs across ranks by an idle tick. So the engine
records, on each op it finishes, the knobs of the round that ran it (the same round, so the same knobs, on
every rank); an exchange reads them off its step's last bucket and re-forms at the next step boundary.
Exchanges whose bucket names start with :data:`BUCKET_KNOB_PREFIX` follow the knob; the knob is searched
only once such a bucket went through the engine, and a bucket size set by hand is held fixed
(docs/autotune.md, "What is tuned").
"""

from __future__ import annotations

from ..scheduling.autotune.settings import BUCKET_KNOB_PREFIX
from ..scheduling.request import knobs_of

__all__ = ["BUCKET_KNOB_PREFIX", "bucket_bytes_of"]


def bucket_bytes_of(handle: int) -> int | None:
    """Wait for the async op behind ``handle`` (the handle stays valid for ``synchronize``) and return the
    bucket size in effect in the engine round that ran it; None when no engine round ran it."""
    knobs = knobs_of(handle)
    return None if knobs is None else int(knobs.bucket_bytes)
