"""Horovod's environment around a rank: the ``HOROVOD_*`` variables horo does not honour (one warning each,
never silence), the rank variables Horovod's launcher sets (``HOROVOD_RANK``, ...), and Horovod's log level
and time stamps (``HORO_LOG_LEVEL``, ``HORO_LOG_HIDE_TIME``) on horo's ``horo`` logger."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping, MutableMapping
from typing import Any

from .config import warn_once
from .settings import BUILD_VARIABLES, by_horovod, by_var

__all__ = ["RANK_VARIABLES", "check_environment", "configure_logging", "set_rank_variables",
           "unsupported"]

RANK_VARIABLES = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
                  "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME")
_LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING,
           "ERROR": logging.ERROR, "FATAL": logging.CRITICAL}
_handler: list[logging.Handler] = []


def unsupported(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """``(name, why)`` for each ``HOROVOD_*`` variable of ``environ`` that horo does not honour, sorted."""
    out: list[tuple[str, str]] = []
    for name in sorted(n for n in environ if n.startswith("HOROVOD_")):
        setting = by_horovod(name)
        if setting is not None:
            if setting.group != "rank" and not setting.honoured(environ[name]):
                out.append((name, setting.why))
        elif name in BUILD_VARIABLES:
            out.append((name, "a Horovod build option; horo has nothing to compile"))
        else:
            out.append((name, "not a variable Horovod 0.28 or horo reads (check its spelling; docs/api/launcher.md "
                              "lists them)"))
    return out


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Warn once per process about each ``HOROVOD_*`` variable horo does not honour (rank 0 only, and not in a
    rank whose launcher, hororun, already did: ``config.warn_once``)."""
    environ = os.environ if environ is None else environ
    for name, why in unsupported(environ):
        warn_once(name, f"{name}={environ[name]!r} is ignored: {why}.", environ)


def set_rank_variables(world: Any, local: Any, cross: Any, environ: MutableMapping[str, str] | None = None) -> None:
    """Set Horovod's rank variables from horo's communicators (called by every ``init()``, so an elastic
    world's changes reach them). The host is an elastic worker's logical one, else this machine's name."""
    environ = os.environ if environ is None else environ
    values = (world.Get_rank(), world.Get_size(), local.Get_rank(), local.Get_size(), cross.Get_rank(),
              cross.Get_size())
    environ.update({name: str(v) for name, v in zip(RANK_VARIABLES, values)})
    environ["HOROVOD_HOSTNAME"] = environ.get("HORO_HOSTNAME") or socket.gethostname()


def configure_logging(environ: Mapping[str, str] | None = None) -> None:
    """Apply ``HORO_LOG_LEVEL`` and ``HORO_LOG_HIDE_TIME`` (or Horovod's names, already copied) to the ``horo``
    logger: its records from that level on go to stderr, with the time unless hidden.

    Raises:
        ValueError: a level that is not one of Horovod's, named with its variable.
    """
    environ = os.environ if environ is None else environ
    level, hide = environ.get("HORO_LOG_LEVEL", "").strip(), environ.get("HORO_LOG_HIDE_TIME", "").strip()
    if not level and not hide:
        return
    if level and level.upper() not in _LEVELS:
        src = _source("HORO_LOG_LEVEL", environ)
        raise ValueError(f"{src} must be one of {', '.join(_LEVELS)}. Received: {src}={level!r}. "
                         "HINT: e.g. HOROVOD_LOG_LEVEL=INFO, or unset it for WARNING.")
    logger = logging.getLogger("horo")
    if not _handler:
        _handler.append(logging.StreamHandler())
        logger.addHandler(_handler[0])
        logger.propagate = False  # one line per record, not a second one from the root logger's handler
    stamp = "" if hide not in ("", "0") else "%(asctime)s "
    _handler[0].setFormatter(logging.Formatter(f"{stamp}horo: %(levelname)s: %(name)s: %(message)s"))
    logger.setLevel(_LEVELS[level.upper()] if level else logging.WARNING)


def _source(var: str, environ: Mapping[str, str]) -> str:
    """The variable the user wrote: Horovod's alias when it holds the same value, else ``var``."""
    setting = by_var(var)
    alias = setting.horovod if setting is not None else None
    return alias if alias and environ.get(alias, "").strip() == environ.get(var, "").strip() else var
