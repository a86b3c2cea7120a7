"""The benches' paired statistics: a ratio taken within each repeat, then the median over repeats."""

from __future__ import annotations

import pytest

from horo.bench._util import Timing

pytestmark = pytest.mark.unit  # no MPI job, no cluster: make test-quick runs it


def test_paired_ratio_is_the_median_of_the_ratios_within_repeats() -> None:
    # Two machine states (x5); in repeat 3 the state flipped between the two variants' samples. The medians
    # pair x's slow sample with base's fast one (5.25x); within repeats x is 1.05x base in four repeats of five.
    base = [100.0, 100.0, 100.0, 500.0, 500.0]
    x = [105.0, 105.0, 525.0, 525.0, 525.0]
    t = Timing({"base": base, "x": x})
    assert t.median("x") / t.median("base") == pytest.approx(5.25)
    assert t.paired("x", "base") == pytest.approx(1.05)
    assert t.paired_delta("x", "base") == pytest.approx(25.0)


def test_paired_ratio_against_the_quickest_of_several_bases() -> None:
    t = Timing({"x": [11.0, 12.0, 13.0], "a": [10.0, 20.0, 10.0], "b": [20.0, 10.0, 20.0]})
    assert t.paired("x", "a", "b") == pytest.approx(1.2)
    assert t.paired("x", "a") == pytest.approx(1.1)


def test_keras_bench_refuses_zero_rounds_before_starting_anything(capsys: pytest.CaptureFixture[str]) -> None:
    from horo.bench import keras as bench

    assert bench.main(["--rounds", "0"]) == 2
    err = capsys.readouterr().err
    assert "Received: --rounds=0" in err and "HINT:" in err, err
