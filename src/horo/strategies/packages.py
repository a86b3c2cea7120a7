"""The Lightning packages horo binds to: the unified ``lightning`` and the standalone ``pytorch_lightning``."""

from __future__ import annotations

import importlib
import importlib.util

__all__ = ["PACKAGES", "installed", "lightning_module_classes"]

#: package -> (its Trainer package, its Fabric package), the unified one first (Lightning's recommendation).
PACKAGES = {"lightning": ("lightning.pytorch", "lightning.fabric"),
            "pytorch_lightning": ("pytorch_lightning", "lightning_fabric")}


def installed() -> list[str]:
    """The Lightning packages installed here, the unified one first."""
    return [p for p in PACKAGES if importlib.util.find_spec(p) is not None]


def lightning_module_classes() -> dict[str, type]:
    """Each installed package's ``LightningModule``, by package."""
    # lazy: only the installed packages, whichever they are
    return {p: importlib.import_module(f"{PACKAGES[p][0]}.core.module").LightningModule for p in installed()}
