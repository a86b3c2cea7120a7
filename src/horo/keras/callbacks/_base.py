"""The Keras Callback base class, imported lazily so that ``import horo`` never needs Keras."""

from __future__ import annotations

from typing import Any

from ..optimizer import import_keras

__all__ = ["Callback"]

Callback: Any = import_keras().callbacks.Callback
