"""Tests of horo.tensorflow names that tests/data/horovod_names.json still lists as pending run once the list no
longer names them (tests/test_horovod_names.py fails while a name that exists is still listed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

PENDING = json.loads((Path(__file__).resolve().parents[1] / "data" / "horovod_names.json").read_text())["pending"]


def unless_pending(*names: str) -> pytest.MarkDecorator:
    """Skip while any of ``horovod.tensorflow.<name>`` is listed as pending."""
    listed = [n for n in names if f"horovod.tensorflow.{n}" in PENDING]
    return pytest.mark.skipif(bool(listed), reason=f"pending in horovod_names.json: {listed}")
