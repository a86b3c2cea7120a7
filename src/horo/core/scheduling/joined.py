"""A joined rank's part in the others' allreduces: zeros, in exactly the form the others reduce in.

A rank inside ``horo.join()`` has no tensor of its own; it contributes zeros of the agreed signature. The form
decides the MPI calls, so it must be the others' in every respect: the shapes and dtypes, in place or not
(``signatures.IN_PLACE_FIELD``: out of place may go round horo's ring, in place never does), and, for GPU
tensors (``signatures.DEVICE_FIELD``), one call per name, which the engine never packs with other ops: GPU
ranks stage such an allreduce through host memory on its own while a rank is joined. The synchronous
``join()`` and the engine both take their zeros from here.
"""

from __future__ import annotations

import numpy as np

from ..transport.prepared import Allreduce, Grouped, Prepared
from .negotiation import Signature

__all__ = ["zeros"]


def zeros(sig: Signature) -> Prepared:
    """The zeros a joined rank reduces for the allreduce or grouped allreduce of signature ``sig``."""
    f = dict(sig)
    in_place = bool(f.get("in_place"))
    op, pre, post = f["op"], f["prescale_factor"], f["postscale_factor"]
    if f["collective"] == "allreduce":
        z = np.zeros(f["shape"], dtype=f["dtype"])
        return Allreduce(z, z if in_place else np.zeros_like(z), op, pre, post, fusable=not f.get("device"))
    arrs = [np.zeros(shape, dtype=d) for shape, d in zip(f["shapes"], f["dtypes"])]
    return Grouped(arrs, op, pre, post, outs=arrs if in_place else None)
