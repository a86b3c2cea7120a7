"""pieces.Chooser: the first rank's choice between one MPI call and pieces follows the measured times, and keeps the
default (pieces) unless one call wins beyond the noise (autotune's rule)."""

from __future__ import annotations

import pytest

from horo.core.scheduling.pieces import PIECES, WHOLE, Chooser, in_window

pytestmark = pytest.mark.unit  # no MPI job, no cluster: make test-quick runs it


def _run(chooser: Chooser, times: dict[int, float], calls: int) -> list[int]:
    """``calls`` calls whose time depends only on the form; returns the forms used."""
    used = []
    for _ in range(calls):
        form = chooser.propose()
        chooser.record(form, times[form])
        used.append(form)
    return used


def test_the_window_lies_between_eight_and_sixteen_pieces():
    chunk = 1 << 20
    assert not in_window(8 * chunk, chunk)
    assert in_window(8 * chunk + 1, chunk) and in_window(16 * chunk, chunk)
    assert not in_window(16 * chunk + 1, chunk)


def test_it_settles_on_the_faster_form_and_tries_the_other_ever_more_rarely():
    c = Chooser(lead=True)
    used = _run(c, {PIECES: 1.7e-3, WHOLE: 2.3e-3}, 200)
    assert used[:2] == [PIECES, WHOLE]  # the default first, then the other, once, to measure it
    assert c.form == PIECES
    tries = [i for i, f in enumerate(used) if f == WHOLE]
    assert len(tries) <= 10, tries  # tried every 4, 8, 16, then 32 calls
    assert tries[-1] - tries[-2] == 32, tries


def test_it_follows_the_machine_when_the_faster_form_changes():
    c = Chooser(lead=True)
    _run(c, {PIECES: 1.7e-3, WHOLE: 2.3e-3}, 100)
    assert c.form == PIECES
    used = _run(c, {PIECES: 5.8e-3, WHOLE: 3.9e-3}, 100)  # the pieces became the slower
    assert c.form == WHOLE
    assert used[10:].count(PIECES) <= 5, used  # it switched within a few calls and stayed
    used = _run(c, {PIECES: 1.7e-3, WHOLE: 2.3e-3}, 100)  # and back: found by a try of the pieces
    assert c.form == PIECES
    assert used[32:].count(WHOLE) <= 4, used  # a try comes within 32 calls


def test_a_single_slow_call_does_not_keep_it_on_the_slower_form():
    c = Chooser(lead=True)
    _run(c, {PIECES: 1.7e-3, WHOLE: 2.3e-3}, 50)
    c.record(PIECES, 50e-3)  # one call descheduled
    used = _run(c, {PIECES: 1.7e-3, WHOLE: 2.3e-3}, 50)
    assert c.form == PIECES
    assert used[5:].count(WHOLE) <= 3, used


def test_the_other_ranks_always_propose_the_default_and_keep_nothing():
    c = Chooser(lead=False)
    assert _run(c, {PIECES: 9e-3, WHOLE: 1e-3}, 20) == [PIECES] * 20
    assert c.est == [0.0, 0.0]


def test_a_form_within_the_noise_never_replaces_the_default():
    c = Chooser(lead=True)
    used = _run(c, {PIECES: 2.0e-3, WHOLE: 1.94e-3}, 200)  # one call 3 % faster: inside the noise band
    assert c.form == PIECES and used.count(WHOLE) <= 12, used
    c = Chooser(lead=True)
    _run(c, {PIECES: 2.0e-3, WHOLE: 1.8e-3}, 40)  # 11 % faster in every pair: taken
    assert c.form == WHOLE


def test_one_pair_the_default_wins_brings_it_back():
    c = Chooser(lead=True)
    _run(c, {PIECES: 5.8e-3, WHOLE: 3.9e-3}, 40)
    assert c.form == WHOLE
    c.record(PIECES, 3.0e-3)  # a try of the pieces that beats the last call in one piece
    assert c.form == PIECES
