"""Autotune options (``HORO_AUTOTUNE*``, with Horovod's ``HOROVOD_AUTOTUNE*`` as aliases) and the knob set.

Rank 0 reads the options once at ``init()`` and shares them, like ``core.config``: whether tuning is on
changes the size of every engine round's header, so all ranks must agree on it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ...base.settings import ALIASES

__all__ = ["AutotuneOptions", "BUCKET_KNOB_PREFIX", "CATEGORICAL", "Knobs", "KNOB_ENV", "read_options",
           "explicit_knobs", "parse_start", "start_knobs"]

#: knob -> the variable that sets it by hand (a knob set by hand is held fixed while tuning).
KNOB_ENV: dict[str, str] = {
    "fusion_threshold": "HORO_FUSION_THRESHOLD",
    "cycle_time_ms": "HORO_CYCLE_TIME",
    "chunk_bytes": "HORO_CHUNK_BYTES",
    "cache_enabled": "HORO_CACHE_CAPACITY",  # Horovod's rule: a capacity set by hand fixes it (0 = off)
    "hierarchical_allreduce": "HORO_HIERARCHICAL_ALLREDUCE",
    "hierarchical_allgather": "HORO_HIERARCHICAL_ALLGATHER",
    "bucket_bytes": "HORO_BUCKET_BYTES",
}
#: Names of the gradient buckets that follow the ``bucket_bytes`` knob start with this. The knob is searched
#: only once such a bucket went through the engine: without one it could not change anything.
BUCKET_KNOB_PREFIX = "horo.bucket."
#: the on/off knobs, tried after the continuous search (Horovod's categorical parameters)
CATEGORICAL = ("cache_enabled", "hierarchical_allreduce", "hierarchical_allgather")

# horo name -> Horovod name accepted as an alias (the horo name wins when both are set): the settings table's.
_ALIASES: dict[str, str] = {horo: horovod for horovod, horo in ALIASES.items()}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


@dataclass(frozen=True)
class Knobs:
    """One setting of the engine's tunable knobs."""

    fusion_threshold: int = 1 << 20  # bytes
    cycle_time_ms: float = 50.0  # idle tick between engine rounds
    chunk_bytes: int = 1 << 20  # piece size for allreduces above 8x this
    cache_enabled: bool = True  # the response cache (names negotiated once, then by bit)
    hierarchical_allreduce: bool = False  # the engine's allreduces in host, across leaders, in host
    hierarchical_allgather: bool = False  # the same for its allgathers
    bucket_bytes: int = 25 << 20  # gradient bucket size of the framework exchanges that follow it

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class AutotuneOptions:
    """The ``--autotune*`` options, as agreed by every rank."""

    enabled: bool = False
    log_file: str | None = None
    warmup_samples: int = 3
    steps_per_sample: int = 10
    max_samples: int = 20
    noise: float = 0.8
    cache_file: str | None = None
    start: dict[str, float] = field(default_factory=dict)  # first trial's values (knobs stay tunable)


def _get(env: Mapping[str, str], name: str) -> tuple[str, str | None]:
    """(name actually used, raw value) for ``name`` or its Horovod alias."""
    if env.get(name) not in (None, ""):
        return name, env[name]
    alias = _ALIASES.get(name)
    if alias and env.get(alias) not in (None, ""):
        return alias, env[alias]
    return name, None


def _flag(env: Mapping[str, str], name: str) -> bool:
    used, raw = _get(env, name)
    text = (raw or "").strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{used} must be 0 or 1. Received: {used}={raw!r}. HINT: {used}=1 turns it on.")


def _number(env: Mapping[str, str], name: str, default: float, lo: float, hi: float = math.inf,
            integer: bool = True) -> float:
    used, raw = _get(env, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (lo <= value <= hi) or (integer and value != int(value)):
        what = "an integer" if integer else "a number"
        bounds = f">= {lo:g}" if hi == math.inf else f"in [{lo:g}, {hi:g}]"
        raise ValueError(f"{used} must be {what} {bounds}. Received: {used}={raw!r}. "
                         f"HINT: unset it to use the default {default:g}.")
    return int(value) if integer else value


def parse_start(text: str) -> dict[str, float]:
    """``HORO_AUTOTUNE_START``: ``"HORO_FUSION_THRESHOLD=67108864,HORO_CYCLE_TIME=5"`` -> knob values.

    The first trial uses these values instead of the defaults; unlike the plain variables, they do not fix
    the knob (the autotune benchmark starts from a deliberately bad 64 MiB this way).
    """
    by_env = {v: k for k, v in KNOB_ENV.items()}
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, raw = part.partition("=")
        knob = by_env.get(name.strip())
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if knob is None or value < 0:
            raise ValueError(f"HORO_AUTOTUNE_START takes NAME=VALUE pairs of {sorted(by_env)} with values >= 0. "
                             f"Received: HORO_AUTOTUNE_START={text!r}. HINT: e.g. HORO_FUSION_THRESHOLD=67108864.")
        out[knob] = value
    return out


def read_options(environ: Mapping[str, str] | None = None) -> AutotuneOptions:
    """Parse the autotune variables (``HORO_*`` or Horovod's ``HOROVOD_*``).

    Raises:
        ValueError: a negative count, a noise outside [0, 1], an unparsable flag; names the value.
    """
    env = os.environ if environ is None else environ
    return AutotuneOptions(
        enabled=_flag(env, "HORO_AUTOTUNE"),
        log_file=_get(env, "HORO_AUTOTUNE_LOG")[1],
        warmup_samples=int(_number(env, "HORO_AUTOTUNE_WARMUP_SAMPLES", 3, 0)),
        steps_per_sample=int(_number(env, "HORO_AUTOTUNE_STEPS_PER_SAMPLE", 10, 1)),
        max_samples=int(_number(env, "HORO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", 20, 1)),
        noise=float(_number(env, "HORO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", 0.8, 0.0, 1.0, integer=False)),
        cache_file=_get(env, "HORO_AUTOTUNE_CACHE")[1],
        start=parse_start(env.get("HORO_AUTOTUNE_START", "")),
    )


def explicit_knobs(environ: Mapping[str, str] | None = None) -> dict[str, float]:
    """Knobs the user set by hand (``HORO_*`` or ``HOROVOD_*``): knob -> value. These are not tuned."""
    env = os.environ if environ is None else environ
    out: dict[str, float] = {}
    for knob, name in KNOB_ENV.items():
        if _get(env, name)[1] is not None:
            value = _number(env, name, 0, 0, integer=False)
            out[knob] = float(value > 0) if knob in CATEGORICAL else value
    return out


def start_knobs(base: Knobs, start: Mapping[str, float], fixed: Mapping[str, float]) -> Knobs:
    """The first trial: ``base`` (the configured values), overridden by ``start``, then by ``fixed``."""
    values = {**start, **fixed}
    kw: dict[str, Any] = {}
    for knob, value in values.items():
        kw[knob] = bool(value) if knob in CATEGORICAL else (
            float(value) if knob == "cycle_time_ms" else int(value))
    return replace(base, **kw)

