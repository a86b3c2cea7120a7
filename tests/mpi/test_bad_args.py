"""Bad arguments are refused locally with TypeError/ValueError naming the value (`Received: ...`, `HINT:`).

Every rank makes the same bad call, so no rank is left waiting; each test then checks the runtime still
works.
"""

from __future__ import annotations

import numpy as np
import pytest
from horo_mpi_util import agree


def _refused(call, exc_types, *values):
    """`call` raises one of `exc_types` whose message has `Received:`, `HINT:` and each of `values`
    (a value may be a tuple of accepted spellings)."""
    with pytest.raises(exc_types) as info:
        call()
    msg = str(info.value)
    assert "Received:" in msg, f"no 'Received:' in: {msg}"
    assert "HINT:" in msg, f"no 'HINT:' in: {msg}"
    for value in values:
        spellings = value if isinstance(value, tuple) else (value,)
        assert any(v in msg for v in spellings), f"none of {spellings!r} in: {msg}"
    return msg


def _forms(seq) -> tuple[str, ...]:
    """Ways a message may spell a list of ints."""
    return (str(list(seq)), str(tuple(seq)), str(np.array(seq)), repr(np.array(seq)))


def _expect(hvd, call, exc_types, *values: str):
    agree(_refused, call, exc_types, *values)
    out = hvd.allreduce(np.ones(2), op=hvd.Sum, name="after.bad.arg")
    agree(np.testing.assert_array_equal, out, np.full(2, float(hvd.size())))


@pytest.mark.parametrize("kind", ["broadcast", "broadcast_", "broadcast_async", "broadcast_object"])
@pytest.mark.parametrize("where", ["size", "negative"])
def test_root_out_of_range(hvd, world, kind, where):
    root = world if where == "size" else -1
    calls = {
        "broadcast": lambda: hvd.broadcast(np.ones(3), root),
        "broadcast_": lambda: hvd.broadcast_(np.ones(3), root),
        "broadcast_async": lambda: hvd.broadcast_async(np.ones(3), root),
        "broadcast_object": lambda: hvd.broadcast_object({"a": 1}, root_rank=root),
    }
    _expect(hvd, calls[kind], ValueError, str(root))


_KINDS = ["allreduce", "allreduce_", "allgather", "broadcast", "alltoall", "reducescatter", "allreduce_async"]


def _call(hvd, kind, x):
    return {
        "allreduce": lambda: hvd.allreduce(x),
        "allreduce_": lambda: hvd.allreduce_(x),
        "allgather": lambda: hvd.allgather(x),
        "broadcast": lambda: hvd.broadcast(x, 0),
        "alltoall": lambda: hvd.alltoall(x),
        "reducescatter": lambda: hvd.reducescatter(x),
        "allreduce_async": lambda: hvd.allreduce_async(x),
    }[kind]


@pytest.mark.parametrize("kind", _KINDS)
@pytest.mark.parametrize("dtype", ["complex64", "object"])
def test_unsupported_dtype(hvd, world, kind, dtype):
    x = np.ones(world * 2, dtype=dtype)
    _expect(hvd, _call(hvd, kind, x), TypeError, dtype)


@pytest.mark.parametrize("kind", ["grouped_allreduce", "grouped_allgather", "grouped_reducescatter"])
def test_unsupported_dtype_in_list(hvd, world, kind):
    tensors = [np.ones(2), np.ones(2, dtype=np.complex128)]
    grouped = {
        "grouped_allreduce": lambda: hvd.grouped_allreduce(tensors),
        "grouped_allgather": lambda: hvd.grouped_allgather(tensors),
        "grouped_reducescatter": lambda: hvd.grouped_reducescatter(tensors),
    }
    _expect(hvd, grouped[kind], TypeError, "complex128")


@pytest.mark.parametrize("kind", _KINDS)
def test_non_array_input(hvd, kind):
    _expect(hvd, _call(hvd, kind, {"not": "an array"}), TypeError, "{'not': 'an array'}")


def test_alltoall_splits_do_not_sum_to_dim0(hvd, world):
    splits = [1] * world
    x = np.ones((world + 1, 2))
    _expect(hvd, lambda: hvd.alltoall(x, splits=splits), ValueError, "splits", _forms(splits))


@pytest.mark.parametrize("length", ["short", "long"])
def test_alltoall_splits_wrong_length(hvd, world, length):
    if length == "short" and world < 2:
        pytest.skip("an empty splits list is a different case")
    n = world - 1 if length == "short" else world + 1
    splits = [2] * n
    x = np.ones((2 * n, 3))
    _expect(hvd, lambda: hvd.alltoall(x, splits=splits), ValueError, "splits", _forms(splits))


def test_alltoall_negative_splits(hvd, world, multi):
    splits = [-1, 2] + [1] * (world - 2)  # sums to dim 0, but a negative count
    x = np.ones((sum(splits), 2))
    _expect(hvd, lambda: hvd.alltoall(x, splits=splits), ValueError, "splits", "-1")


def test_alltoall_even_split_impossible(hvd, world, multi):
    # No splits: dim 0 must divide evenly by the set size.
    x = np.ones((world + 1, 2))
    _expect(hvd, lambda: hvd.alltoall(x), ValueError, str(world + 1))


@pytest.mark.parametrize("kind", ["allreduce", "allreduce_", "grouped_allreduce", "reducescatter",
                                  "allreduce_async"])
@pytest.mark.parametrize("op", ["bogus", 12345])
def test_bad_op(hvd, kind, op):
    x = np.ones(4)
    calls = {
        "allreduce": lambda: hvd.allreduce(x, op=op),
        "allreduce_": lambda: hvd.allreduce_(x, op=op),
        "grouped_allreduce": lambda: hvd.grouped_allreduce([x], op=op),
        "reducescatter": lambda: hvd.reducescatter(x, op=op),
        "allreduce_async": lambda: hvd.allreduce_async(x, op=op),
    }
    # The contract does not say which of the two a bad op raises.
    _expect(hvd, calls[kind], (ValueError, TypeError), str(op))


def test_op_and_average_both_given(hvd):
    _expect(hvd, lambda: hvd.allreduce(np.ones(2), average=True, op=hvd.Sum), ValueError, "average")


def test_process_set_without_this_rank(hvd, world, rank, multi):
    ps = hvd.add_process_set([world - 1])
    try:
        if rank == world - 1:
            out = hvd.allreduce(np.ones(2), op=hvd.Sum, process_set=ps)
            agree(np.testing.assert_array_equal, out, np.ones(2))
        else:
            agree(_refused, lambda: hvd.allreduce(np.ones(2), process_set=ps), ValueError, str(world - 1))
    finally:
        hvd.remove_process_set(ps)
    out = hvd.allreduce(np.ones(2), op=hvd.Sum)
    agree(np.testing.assert_array_equal, out, np.full(2, float(world)))


# ------------------------------------------------------- Horovod's exception types still catch
def test_float_splits_catch_as_horovods_value_error_too(hvd, world):
    """horo's TypeError for float splits is also a ValueError, which Horovod raises there."""
    x = np.ones((world, 2))
    msg = _expect(hvd, lambda: hvd.alltoall(x, splits=[1.0] * world), ValueError, "splits")
    del msg
    _expect(hvd, lambda: hvd.alltoall(x, splits=[1.0] * world), TypeError, "splits")


@pytest.mark.parametrize("form", ["reducescatter", "reducescatter_async", "grouped_reducescatter"])
def test_reducescatter_adasum_catches_as_runtime_error_too(hvd, world, form):
    """Horovod's core refuses reducescatter(op=Adasum) with a RuntimeError; horo's ValueError is one too."""
    x = np.ones((world, 2), np.float32)
    calls = {
        "reducescatter": lambda: hvd.reducescatter(x, op=hvd.Adasum),
        "reducescatter_async": lambda: hvd.reducescatter_async(x, op=hvd.Adasum),
        "grouped_reducescatter": lambda: hvd.grouped_reducescatter([x], op=hvd.Adasum),
    }
    for exc_type in (RuntimeError, ValueError):
        _expect(hvd, calls[form], exc_type, "Adasum")


def test_horovod_internal_error_is_exported(hvd):
    import horo

    agree(lambda: (horo.HorovodInternalError is horo.HoroInternalError
                   and issubclass(horo.HorovodInternalError, RuntimeError)) or (_ for _ in ()).throw(
        AssertionError("horo.HorovodInternalError is not HoroInternalError")))
