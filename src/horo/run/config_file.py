"""``--config-file``: Horovod's YAML file of settings (the keys of its config_parser: ``params.fusion_threshold_mb``,
``autotune.enabled``, ...), read into the arguments that no flag gave, as horovodrun does: flags win."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from horo.core.base.config import warn_once
from horo.core.base.setting import Setting
from horo.core.base.settings import SETTINGS

__all__ = ["apply_config_file", "read_config_file"]

_KEYS: dict[str, Setting] = {s.key.lstrip("!"): s for s in SETTINGS if s.key}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def read_config_file(path: str) -> dict[str, Any]:
    """The file's values by dotted key (``{"params.cycle_time_ms": 5, "controller": "mpi"}``).

    Raises:
        ValueError: the file cannot be read, is not YAML, or is not a mapping of sections; names the path.
    """
    try:
        import yaml  # lazy: PyYAML is needed only for --config-file
    except ImportError:
        raise ValueError(f"--config-file needs PyYAML. Received: --config-file={path!r}. "
                         "HINT: pip install pyyaml") from None
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise ValueError(f"cannot read the config file ({exc.strerror}). Received: --config-file={path!r}. "
                         "HINT: give the path of Horovod's YAML config file.") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise ValueError(f"the config file is not valid YAML{line}. Received: --config-file={path!r}. "
                         "HINT: sections such as 'params:' holding 'fusion_threshold_mb: 32' lines.") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ValueError(f"the config file must hold a mapping of sections. Received: --config-file={path!r} "
                         f"holding a {type(data).__name__}. HINT: e.g. 'params:' then 'cycle_time_ms: 5'.")
    flat: dict[str, Any] = {}
    for section, body in data.items():
        if isinstance(body, Mapping):
            flat.update({f"{section}.{name}": value for name, value in body.items()})
        else:
            flat[str(section)] = body
    return flat


def _value(setting: Setting, key: str, raw: Any, path: str) -> Any:
    """``raw`` as the flag would have given it: "1"/"0" for an on/off setting, a number, or text."""
    bad = (f"{path}: {key} takes {setting.kind} values. Received: {key}={raw!r}. "
           f"HINT: see Horovod's config-file keys in docs/api/launcher.md.")
    if setting.kind == "bool":
        text = str(raw).strip().lower()
        if isinstance(raw, (bool, int)):
            on = bool(raw)
        elif text in _TRUE + _FALSE:
            on = text in _TRUE
        else:
            raise ValueError(bad)
        return str(int(on != setting.key.startswith("!")))  # type: ignore[union-attr]
    if setting.kind in ("int", "float"):
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw < 0:
            raise ValueError(bad)
        return int(raw) if setting.kind == "int" else float(raw)
    return str(raw).upper() if setting.kind == "choice" else str(raw)


def apply_config_file(ns: argparse.Namespace, path: str) -> None:
    """Set each setting the file gives and no flag did (noted in ``ns.from_config``); a key Horovod's file does
    not have is warned about.

    Raises:
        ValueError: the file cannot be read, or a value is of the wrong type.
    """
    flat = read_config_file(path)
    for key in flat:
        if key not in _KEYS:
            warn_once(f"config:{key}", f"{path}: {key} is not a key of Horovod's config file; ignored. HINT: the "
                      "keys are listed in docs/api/launcher.md.")
    for key, setting in _KEYS.items():
        if flat.get(key) is None or getattr(ns, setting.name, None) is not None:
            continue
        setattr(ns, setting.name, _value(setting, key, flat[key], path))
        ns.from_config[setting.name] = key
