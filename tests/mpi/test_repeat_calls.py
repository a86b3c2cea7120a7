"""Repeat calls of the synchronous allreduce (core/repeat.py): remembered checks never hide an error.

A call identical to an earlier checked one reuses that call's checks and signature. These tests make each
call at least twice first, so that the remembered path is the one under test.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from horo_mpi_util import agree, outcome, sync_comm
from test_runtime import _clean_env


def _twice(call):
    call()
    return call()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_repeat_calls_give_exact_results(hvd, world, rank, dtype):
    from horo.core.api import repeat

    for step in range(4):
        x = np.full(5, rank + step, dtype=dtype)
        total = sum(r + step for r in range(world))
        out = hvd.allreduce(x, op=hvd.Sum, name="repeat.sum")
        y = x.copy()
        back = hvd.allreduce_(y, op=hvd.Sum, name="repeat.sum_")
        avg = hvd.allreduce(x.astype(np.float64))  # the default op, Average
        big = hvd.allreduce(np.full(40000, rank + step, dtype=dtype), op=hvd.Sum)  # above the one-call size

        def _check(x=x, out=out, y=y, back=back, avg=avg, big=big, total=total, step=step):
            np.testing.assert_array_equal(out, np.full(5, total, dtype=dtype))
            np.testing.assert_array_equal(x, np.full(5, rank + step, dtype=dtype))  # input untouched
            assert back is y
            np.testing.assert_array_equal(y, np.full(5, total, dtype=dtype))
            np.testing.assert_allclose(avg, np.full(5, total / world))
            np.testing.assert_array_equal(big, np.full(40000, total, dtype=dtype))
            assert not np.shares_memory(out, x)

        agree(_check)
    agree(lambda: len(repeat._SEEN) > 0 or pytest.fail("no call was remembered"))


def test_a_remembered_call_still_checks_its_arguments(hvd, world, rank):
    x = np.ones(4, dtype=np.float32)
    _twice(lambda: hvd.allreduce(x, prescale_factor=1.0))  # all defaults: the short key
    _twice(lambda: hvd.allreduce(x, prescale_factor=1.0, name="repeat.args"))  # the long key
    _twice(lambda: hvd.allreduce_(x, op=hvd.Sum))
    x[:] = 1
    ro = x.copy()
    ro.flags.writeable = False
    strided = np.ones((4, 2), dtype=np.float32)[:, 0]  # same shape and dtype as x, not contiguous
    errors = {}
    for label, call in {
        "bool prescale": lambda: hvd.allreduce(x, prescale_factor=True, name="repeat.args"),
        "read-only": lambda: hvd.allreduce_(ro, op=hvd.Sum),
        "name": lambda: hvd.allreduce(x, name=5),
        "op": lambda: hvd.allreduce(x, op=object()),
    }.items():
        errors[label] = outcome(call)[1]
    out = hvd.allreduce(strided, op=hvd.Sum)

    def _check():
        assert isinstance(errors["bool prescale"], TypeError) and "prescale_factor=True" in str(
            errors["bool prescale"]), errors
        assert isinstance(errors["read-only"], ValueError) and "read-only" in str(errors["read-only"]), errors
        assert isinstance(errors["name"], TypeError) and "name=5" in str(errors["name"]), errors
        assert isinstance(errors["op"], (TypeError, ValueError)), errors
        np.testing.assert_array_equal(out, np.full(4, world, dtype=np.float32))

    agree(_check)


@pytest.mark.usefixtures("multi")
@pytest.mark.parametrize("who", ["first", "others"])
def test_a_remembered_call_still_raises_a_mismatch_on_every_rank(hvd, world, rank, who):
    x = np.ones(3, dtype=np.float32)
    _twice(lambda: hvd.allreduce(x, name="repeat.mismatch"))
    # Either rank 0 repeats its remembered call while the others change the dtype, or the reverse.
    odd = (rank == 0) == (who == "first")
    arg = x.astype(np.float64) if odd else x
    sync_comm().Barrier()
    _, exc, elapsed = outcome(lambda: hvd.allreduce(arg, name="repeat.mismatch"))

    def _check():
        assert isinstance(exc, hvd.MismatchError), f"expected MismatchError, got {exc!r}"
        assert "dtype" in str(exc) and "float64" in str(exc) and "float32" in str(exc), str(exc)
        assert elapsed < 2.0, elapsed

    agree(_check)
    out = _twice(lambda: hvd.allreduce(x, op=hvd.Sum, name="repeat.after"))
    agree(np.testing.assert_array_equal, out, np.full(3, world, dtype=np.float32))


@pytest.mark.usefixtures("multi")
def test_a_removed_process_set_is_refused_after_repeat_calls(hvd, world, rank):
    ps = hvd.add_process_set([0, world - 1] if world > 2 else [0])  # any set but the global one's ranks
    x = np.ones(2, dtype=np.float32)
    member = rank in ps.ranks
    out = _twice(lambda: hvd.allreduce(x, op=hvd.Sum, process_set=ps)) if member else None
    hvd.remove_process_set(ps)
    exc = outcome(lambda: hvd.allreduce(x, op=hvd.Sum, process_set=ps))[1] if member else None

    def _check():
        if member:
            np.testing.assert_array_equal(out, np.full(2, len(ps.ranks), dtype=np.float32))
            assert isinstance(exc, ValueError) and "not registered" in str(exc), repr(exc)

    agree(_check)


_CHILD = textwrap.dedent(
    """
    import numpy as np
    import horo
    from horo.core.base.errors import NotInitializedError

    x = np.arange(4, dtype=np.float32)
    for _ in range(2):
        horo.init()
        for _ in range(3):
            assert (horo.allreduce(x, op=horo.Sum) == x).all()
            assert (horo.allreduce_(x.copy()) == x).all()
        horo.shutdown()
        for call in (lambda: horo.allreduce(x, op=horo.Sum), lambda: horo.allreduce_(x.copy())):
            try:
                call()
            except NotInitializedError:
                pass
            else:
                raise AssertionError("a remembered call ran after shutdown")
    print("CHILD-OK")
    """
)


def test_repeat_calls_after_shutdown_and_init(hvd, rank):
    # In a fresh one-rank process: remembered calls must not outlive the runtime they were checked in.
    def _run():
        proc = subprocess.run([sys.executable, "-c", _CHILD], env=_clean_env(), capture_output=True, text=True,
                              timeout=120, check=False)
        assert proc.returncode == 0 and "CHILD-OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]

    agree(_run if rank == 0 else (lambda: None))


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_repeat_async_calls_give_exact_results(hvd, world, rank, dtype):
    from horo.core.api import repeat

    for step in range(4):
        x = np.full(5, rank + step, dtype=dtype)
        total = sum(r + step for r in range(world))
        y = x.copy()
        h_out = hvd.allreduce_async(x, op=hvd.Sum, name="repeat.async")
        h_back = hvd.allreduce_async_(y, op=hvd.Sum, name="repeat.async_")
        h_avg = hvd.allreduce_async(x.astype(np.float64), name="repeat.async.avg")  # the default op, Average
        out, back, avg = hvd.synchronize(h_out), hvd.synchronize(h_back), hvd.synchronize(h_avg)

        def _check(x=x, out=out, y=y, back=back, avg=avg, total=total, step=step):
            np.testing.assert_array_equal(out, np.full(5, total, dtype=dtype))
            np.testing.assert_array_equal(x, np.full(5, rank + step, dtype=dtype))  # input untouched
            assert back is y
            np.testing.assert_array_equal(y, np.full(5, total, dtype=dtype))
            np.testing.assert_allclose(avg, np.full(5, total / world))
            assert not np.shares_memory(out, x)

        agree(_check)
    agree(lambda: len(repeat.ASYNC) >= 3 or pytest.fail(f"async calls not remembered: {list(repeat.ASYNC)}"))


def test_a_remembered_async_call_still_checks_its_arguments(hvd, world, rank):
    x = np.ones(4, dtype=np.float32)
    _twice(lambda: hvd.synchronize(hvd.allreduce_async_(x, op=hvd.Sum, name="repeat.async.args")))
    _twice(lambda: hvd.synchronize(hvd.allreduce_async(x, prescale_factor=1.0, name="repeat.async.args2")))
    ro = np.ones(4, dtype=np.float32)
    ro.flags.writeable = False
    errors = {}
    for label, call in {
        "read-only": lambda: hvd.allreduce_async_(ro, op=hvd.Sum, name="repeat.async.args"),
        "bool prescale": lambda: hvd.allreduce_async(x, prescale_factor=True, name="repeat.async.args2"),
    }.items():
        errors[label] = outcome(call)[1]
    # A name still in flight is refused on a repeat as on a first call.
    h = hvd.allreduce_async_(x, op=hvd.Sum, name="repeat.async.args")
    errors["in flight"] = outcome(lambda: hvd.allreduce_async_(x, op=hvd.Sum, name="repeat.async.args"))[1]
    hvd.synchronize(h)

    def _check():
        assert isinstance(errors["read-only"], ValueError) and "read-only" in str(errors["read-only"]), errors
        assert isinstance(errors["bool prescale"], TypeError) and "prescale_factor=True" in str(
            errors["bool prescale"]), errors
        assert isinstance(errors["in flight"], ValueError) and "already in flight" in str(errors["in flight"]), errors

    agree(_check)


@pytest.mark.usefixtures("multi")
@pytest.mark.parametrize("who", ["first", "others"])
def test_a_remembered_async_call_still_raises_a_mismatch_on_every_rank(hvd, world, rank, who):
    x = np.ones(3, dtype=np.float32)
    _twice(lambda: hvd.synchronize(hvd.allreduce_async(x, name="repeat.async.mismatch")))
    odd = (rank == 0) == (who == "first")
    arg = x.astype(np.float64) if odd else x
    sync_comm().Barrier()
    _, exc, elapsed = outcome(lambda: hvd.synchronize(hvd.allreduce_async(arg, name="repeat.async.mismatch")))

    def _check():
        assert isinstance(exc, hvd.MismatchError), f"expected MismatchError, got {exc!r}"
        assert "float64" in str(exc) and "float32" in str(exc), str(exc)
        assert elapsed < 5.0, elapsed

    agree(_check)
    out = _twice(lambda: hvd.synchronize(hvd.allreduce_async(x, op=hvd.Sum, name="repeat.async.after")))
    agree(np.testing.assert_array_equal, out, np.full(3, world, dtype=np.float32))


# ---------------------------------------------------------------- one call or pieces, the first rank's choice
class _Scripted:
    """Stands in for a remembered call's pieces.Chooser: proposes the given forms, keeps what was run."""

    def __init__(self, lead, forms):
        self.lead, self.forms, self.ran = lead, list(forms), []

    def propose(self):
        return self.forms.pop(0) if self.lead else 0

    def record(self, form, seconds):
        if self.lead:
            self.ran.append(form)


@pytest.fixture
def small_chunks():
    """128 KiB pieces on every rank, so that a 2 MiB array lies in the chosen window (8-32 pieces); no call
    remembered before or after (entries keep the decisions made with the chunk size of their time)."""
    from horo.core.api import repeat
    from horo.core.base.config import config

    before = config["HORO_CHUNK_BYTES"]
    config["HORO_CHUNK_BYTES"] = float(128 << 10)
    repeat._SEEN.clear()
    yield
    repeat._SEEN.clear()
    config["HORO_CHUNK_BYTES"] = before


def _script(inplace, arr, forms):
    """Make ``arr``'s remembered call (made once first) propose ``forms`` on the first rank."""
    from horo.core.api import repeat

    k = repeat.key(inplace, arr, None, None, _SUM[0], 1.0, 1.0, None)
    entry = repeat._SEEN[k]
    assert entry[-1] is not None, "a 2 MiB array with 128 KiB pieces should be chosen at run time"
    fake = _Scripted(entry[1].Get_rank() == 0, forms)
    repeat._SEEN[k] = entry[:-1] + (fake,)
    return fake


_SUM: list = []


@pytest.mark.usefixtures("small_chunks")
def test_a_chosen_form_gives_exact_results_on_every_rank(hvd, world, rank):
    """The first rank switches between one call and pieces every call; every rank follows it."""
    from horo.core.scheduling.pieces import PIECES, WHOLE

    _SUM[:] = [hvd.Sum]
    n = (2 << 20) // 8
    base = np.arange(n, dtype=np.int64)
    total = base * world + sum(range(world))
    forms = [WHOLE, PIECES, WHOLE, WHOLE, PIECES, PIECES]
    buf = base + rank
    hvd.allreduce_(buf, op=hvd.Sum)  # remembered
    fake = _script(True, buf, forms)
    sent = base + rank
    hvd.allreduce(sent, op=hvd.Sum)
    fake_oop = _script(False, sent, forms)
    results = []
    for _ in forms:
        buf[...] = base + rank
        results.append((hvd.allreduce_(buf, op=hvd.Sum).copy(), hvd.allreduce(sent, op=hvd.Sum)))

    def _check():
        for i, (back, out) in enumerate(results):
            np.testing.assert_array_equal(back, total, err_msg=f"in place, call {i}")
            np.testing.assert_array_equal(out, total, err_msg=f"out of place, call {i}")
        np.testing.assert_array_equal(sent, base + rank)
        if rank == 0:
            assert fake.ran == forms and fake_oop.ran == forms, (fake.ran, fake_oop.ran)

    agree(_check)


@pytest.mark.usefixtures("small_chunks", "multi")
def test_a_rank_off_the_repeat_path_makes_every_rank_run_pieces(hvd, world, rank):
    """The last rank forgets its remembered call before each one (as after an eviction): its general path
    cannot read the first rank's choice, so every rank runs the default form, pieces."""
    from horo.core.api import repeat
    from horo.core.scheduling.pieces import PIECES, WHOLE

    _SUM[:] = [hvd.Sum]
    n = (2 << 20) // 8
    buf = np.full(n, rank, dtype=np.int64)
    hvd.allreduce_(buf, op=hvd.Sum)
    fake = _script(True, buf, [WHOLE] * 3)
    results = []
    for _ in range(3):
        if rank == world - 1:
            repeat._SEEN.clear()
        buf[...] = rank
        results.append(hvd.allreduce_(buf, op=hvd.Sum).copy())

    def _check():
        for back in results:
            np.testing.assert_array_equal(back, np.full(n, sum(range(world)), dtype=np.int64))
        if rank == 0:
            assert fake.ran == [PIECES] * 3, fake.ran

    agree(_check)


@pytest.mark.usefixtures("small_chunks", "multi")
def test_a_joined_rank_makes_every_rank_run_pieces(hvd, world, rank):
    """While the last rank is inside join() (it contributes zeros, in pieces), the others' repeat calls run
    pieces whatever the first rank proposes."""
    from horo.core.scheduling.pieces import PIECES, WHOLE

    _SUM[:] = [hvd.Sum]
    n = (2 << 20) // 8
    buf = np.full(n, rank + 1, dtype=np.int64)
    hvd.allreduce_(buf, op=hvd.Sum)
    results = []
    fake = None
    if rank == world - 1:
        hvd.join()
    else:
        fake = _script(True, buf, [WHOLE] * 2)
        for _ in range(2):
            buf[...] = rank + 1
            results.append(hvd.allreduce_(buf, op=hvd.Sum).copy())
        hvd.join()

    def _check():
        for back in results:
            np.testing.assert_array_equal(back, np.full(n, sum(r + 1 for r in range(world - 1)), dtype=np.int64))
        if rank == 0:
            assert fake.ran == [PIECES] * 2, fake.ran

    agree(_check)
