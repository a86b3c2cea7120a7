"""Scale factors and averaging on a reduced buffer, with Horovod's integer semantics (numpy or CuPy).

Horovod scales an integer tensor by multiplying in float64 and casting back, which truncates toward zero;
its Average is that same multiply by ``postscale / size``. horo matches that, except that a plain integer
Average (no post-scale) is an exact truncating division: ``k * (1 / n)`` in float64 can land just below an
integer (``49 * (1 / 49) == 0.999...``), where Horovod then returns one less than the true quotient.
"""

from __future__ import annotations

from typing import Any

from .ops import Average, ReduceOp

__all__ = ["scale_into", "finish_reduction"]


def scale_into(xp: Any, src: Any, factor: float, out: Any) -> Any:
    """``out[...] = src * factor``; integers are scaled in float64 and truncated toward zero, as in Horovod."""
    if src.dtype.kind in "iu":
        out[...] = (src.astype(xp.float64) * factor).astype(out.dtype)
    else:
        xp.multiply(src, factor, out=out)
    return out


def _truncating_divide(xp: Any, buf: Any, size: int) -> None:
    """``buf //= size`` rounding toward zero (C integer division), in place."""
    if buf.dtype.kind == "u":
        xp.floor_divide(buf, size, out=buf)
        return
    bump = (buf < 0) & (buf % size != 0)  # floor went one below the truncated quotient
    xp.floor_divide(buf, size, out=buf)
    buf += bump.astype(buf.dtype)


def finish_reduction(xp: Any, buf: Any, op: ReduceOp, size: int, postscale: float) -> Any:
    """Average (sum / size) and post-scale a reduced buffer in place; see the module docstring for integers."""
    integer = buf.dtype.kind in "iu"
    if op is Average:
        if not integer:
            xp.divide(buf, size, out=buf)
        elif postscale == 1.0:
            _truncating_divide(xp, buf, size)
        else:  # Horovod folds 1/size into the post-scale factor: one float64 multiply, then truncation
            return scale_into(xp, buf, postscale / size, buf)
    if postscale != 1.0:
        scale_into(xp, buf, postscale, buf)
    return buf
