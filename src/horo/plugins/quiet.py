"""TensorFlow's own log-level variable, applied to what it prints while it is imported.

``TF_CPP_MIN_LOG_LEVEL`` (1: no INFO, 2: no WARNING, 3: no ERROR lines) is TensorFlow's switch for its C++
log. TensorFlow 2.21 prints its oneDNN notice during import, before it reads that variable, and absl adds a
line about logging before initialisation: every rank of every job shows them. :func:`quiet_import` holds
back what is written to stderr while a framework is imported and passes on everything except the log lines
that the variable turns off. Python warnings and errors always pass.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["min_log_level", "quiet_import"]

# absl / glog line prefixes: severity letter, then MMDD (I0000 00:00:...).
_SEVERITY = re.compile(r"^([IWE])\d{4} ")
_LEVEL = {"I": 1, "W": 2, "E": 3}
_PREINIT = "All log messages before absl::InitializeLog() is called are written to STDERR"
# The second line of TensorFlow's CPU-feature INFO message has no prefix of its own.
_CONTINUED = "To enable the following instructions:"


def min_log_level(environ: dict[str, str] | None = None) -> int:
    """``TF_CPP_MIN_LOG_LEVEL`` as a number (0 when unset or not a number)."""
    raw = (os.environ if environ is None else environ).get("TF_CPP_MIN_LOG_LEVEL", "0").strip()
    return int(raw) if raw.isdigit() else 0


def _keep(line: str, level: int) -> bool:
    m = _SEVERITY.match(line)
    if m is not None:
        return _LEVEL[m.group(1)] > level
    if _PREINIT in line or line.startswith(_CONTINUED):
        return level < 1
    return True


@contextmanager
def quiet_import(module: str = "tensorflow", level: int | None = None) -> Iterator[None]:
    """Filter stderr while ``module`` is first imported (a no-op once it is imported, or at level 0).

    Args:
        level: drop C++ log lines below this ``TF_CPP_MIN_LOG_LEVEL`` (default: the variable's value).
    """
    level = min_log_level() if level is None else level
    if level < 1 or module in sys.modules:
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable fd 2 (a closed or replaced stderr): nothing to filter
        yield
        return
    # A file, not a pipe: nothing can block however much is written before it is read back.
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [ln for ln in held.read().decode(errors="replace").splitlines(keepends=True) if _keep(ln, level)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
