"""Quiet by default: hororun and the examples keep TensorFlow's C++ start-up banners off unless --verbose.

hororun sets TensorFlow's own variable (TF_CPP_MIN_LOG_LEVEL=2) for the ranks; horo applies it also to what
TensorFlow prints while it is imported (TensorFlow 2.21 prints its oneDNN notice before reading it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BANNERS = ("oneDNN custom operations are on", "absl::InitializeLog()")


def _run(args: list[str], env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout, check=False)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def test_filter_drops_only_lines_below_the_level() -> None:
    code = textwrap.dedent("""
        import os, sys
        from horo.plugins.quiet import quiet_import
        with quiet_import("not_a_real_module_xyz", level=2):
            os.write(2, b"I0000 00:00:1.5 7 port.cc:153] info line\\n"
                        b"To enable the following instructions: AVX2, in other operations\\n"
                        b"W0000 00:00:1.5 7 x.cc:1] warning line\\n"
                        b"E0000 00:00:1.5 7 x.cc:1] error line\\n"
                        b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\\n"
                        b"plain text\\n")
            sys.stderr.write("python warning\\n")
        sys.stderr.write("after\\n")
    """)
    res = _run([sys.executable, "-c", code], _env())
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines() == ["E0000 00:00:1.5 7 x.cc:1] error line", "plain text", "python warning",
                                       "after"]


@pytest.mark.timeout(600)
def test_importing_horo_keras_shows_no_banner_at_level_2() -> None:
    pytest.importorskip("tensorflow")
    code = "import horo.keras"
    loud = _run([sys.executable, "-c", code], _env(TF_CPP_MIN_LOG_LEVEL="0", KERAS_BACKEND="tensorflow"))
    assert loud.returncode == 0, loud.stderr[-3000:]
    quiet = _run([sys.executable, "-c", code], _env(TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow"))
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert not any(b in quiet.stderr for b in BANNERS), quiet.stderr[-3000:]
    if not any(b in loud.stderr for b in BANNERS):
        pytest.skip("this TensorFlow prints no start-up banner at all: nothing to compare")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flags,preset,expected", [
    ([], None, "2"),  # quiet by default
    (["--verbose"], None, "unset"),  # --verbose lets the banners through
    ([], "0", "0"),  # the user's own setting wins
    ([], "", "2"),  # an empty value counts as unset
])
def test_hororun_sets_tensorflow_log_level(tmp_path: Path, flags: list[str], preset: str | None,
                                           expected: str) -> None:
    script = tmp_path / "show.py"
    script.write_text("import os\nprint('LEVEL', os.environ.get('TF_CPP_MIN_LOG_LEVEL', 'unset'), flush=True)\n")
    env = _env(**({"TF_CPP_MIN_LOG_LEVEL": preset} if preset is not None else {}))
    res = _run([sys.executable, "-m", "horo.run", "-np", "2", *flags, sys.executable, str(script)], env, timeout=100)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count(f"LEVEL {expected}") == 2, res.stdout
