"""CPU unit tests of the NCCL / GPU layer (horo.core.transport.nccl, device, backends.gpu, the operand checks).

Only pure functions and the CPU branches of the staging helpers are tested here: no GPU, no MPI job and no
fake collectives. The GPU paths are exercised by tests/gpu/test_nccl_gpu.py on a CUDA machine.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from horo.core.api import backends, checks, collectives
from horo.core.api.backends import gpu as gpu_backend
from horo.core.api.backends import host as host_backend
from horo.core.base.dtypes import BFLOAT16, SUPPORTED_DTYPES
from horo.core.base.ops import Adasum, Average, Max, Min, Product, Sum
from horo.core.scheduling import signatures
from horo.core.transport import device, mpi_ops, nccl

pytestmark = pytest.mark.unit  # no MPI job, no cluster: make test-quick runs it

ml_dtypes = pytest.importorskip("ml_dtypes")

RAW = bytes((i * 37 + 11) % 256 for i in range(nccl.UNIQUE_ID_BYTES))  # has bytes above 127


# ------------------------------------------------------------------------------------------ unique id
def test_unique_id_bytes_pass_through() -> None:
    assert nccl.normalize_unique_id(RAW) == RAW
    assert nccl.normalize_unique_id(bytearray(RAW)) == RAW
    assert nccl.normalize_unique_id(memoryview(RAW)) == RAW


def test_unique_id_tuples_of_signed_or_unsigned_chars() -> None:
    signed = tuple(b - 256 if b > 127 else b for b in RAW)  # CuPy 13 on x86
    unsigned = tuple(RAW)  # CuPy 13 on ARM / POWER
    assert min(signed) < 0
    assert nccl.normalize_unique_id(signed) == RAW
    assert nccl.normalize_unique_id(unsigned) == RAW
    assert nccl.normalize_unique_id(list(signed)) == RAW
    assert nccl.normalize_unique_id(tuple(np.int8(v) for v in signed)) == RAW


@pytest.mark.parametrize("version", ["14.0.0", "14.2.0", "15.0.0a1"])
def test_unique_id_for_cupy_14_is_bytes(version: str) -> None:
    assert nccl.unique_id_for_cupy(RAW, version) == RAW


@pytest.mark.parametrize("signed", [True, False])
def test_unique_id_for_cupy_13_is_a_char_tuple(signed: bool) -> None:
    uid = nccl.unique_id_for_cupy(RAW, "13.6.0", signed_char=signed)
    assert isinstance(uid, tuple) and len(uid) == nccl.UNIQUE_ID_BYTES
    assert (min(uid) < 0) is signed and (max(uid) > 127) is not signed
    assert all((-128 <= v <= 127) if signed else (0 <= v <= 255) for v in uid)
    assert nccl.normalize_unique_id(uid) == RAW


def test_unique_id_rejects_bad_input_with_hint() -> None:
    with pytest.raises(ValueError, match=r"Received: 127 bytes.*HINT"):
        nccl.normalize_unique_id(RAW[:-1])
    with pytest.raises(ValueError, match=r"Received: values \[300\].*HINT"):
        nccl.normalize_unique_id((300,) + tuple(RAW[1:]))
    with pytest.raises(TypeError, match=r"Received: uid of type str.*HINT"):
        nccl.normalize_unique_id("abc")
    with pytest.raises(TypeError, match="Received"):
        nccl.normalize_unique_id((1.5,) * 128)
    with pytest.raises(TypeError, match="Received"):
        nccl.normalize_unique_id((True,) * 128)


def test_char_signedness_by_platform() -> None:
    assert nccl.char_is_signed("x86_64") and nccl.char_is_signed("AMD64")
    assert not nccl.char_is_signed("aarch64") and not nccl.char_is_signed("ppc64le")


def _cupy_nccl() -> object:
    try:
        return nccl.load_cupy()[1]
    except ImportError:
        return None


def test_real_cupy_unique_id_normalises() -> None:
    mod = _cupy_nccl()
    if mod is None:
        pytest.skip("cupy with a loadable NCCL library is not installed (the nccl extra)")
    raw = nccl.normalize_unique_id(mod.get_unique_id())  # needs no GPU
    assert len(raw) == nccl.UNIQUE_ID_BYTES


# ------------------------------------------------------------------------------------------ dtype mapping
def test_nccl_codes_are_nccl_h_values() -> None:
    assert nccl.NCCL_DTYPE_CODES == {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
                                     "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}
    assert nccl.NCCL_OP_CODES == {"sum": 0, "prod": 1, "max": 2, "min": 3}


def test_nccl_codes_match_cupy_constants() -> None:
    mod = _cupy_nccl()
    if mod is None:
        pytest.skip("cupy with a loadable NCCL library is not installed (the nccl extra)")
    for name, code in nccl.NCCL_DTYPE_CODES.items():
        if hasattr(mod, "NCCL_" + name.upper()):
            assert getattr(mod, "NCCL_" + name.upper()) == code, name
    for name, code in nccl.NCCL_OP_CODES.items():
        assert getattr(mod, "NCCL_" + name.upper()) == code, name


OPS = [Sum, Average, Min, Max, Product]
NATIVE = {"uint8", "int8", "int32", "int64", "float16", "float32", "float64"}


@pytest.mark.parametrize("bf16_native", [True, False])
@pytest.mark.parametrize("op", OPS, ids=repr)
@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
def test_reduce_plan_covers_every_supported_dtype(dtype: np.dtype, op: object, bf16_native: bool) -> None:
    if dtype == np.bool_ and op is Average:
        with pytest.raises(TypeError, match="Received: op=horo.Average.*HINT"):
            nccl.reduce_plan(dtype, op, bf16_native)
        return
    plan = nccl.reduce_plan(dtype, op, bf16_native)
    assert plan.nccl_type in nccl.NCCL_DTYPE_CODES and plan.nccl_op in nccl.NCCL_OP_CODES
    if dtype == np.bool_:
        assert (plan.nccl_type, plan.work_dtype, plan.cast) == ("uint8", np.uint8, "bool")
        assert plan.nccl_op == ("max" if op in (Sum, Max) else "min")  # or = max, and = min on 0/1
        return
    assert plan.nccl_op == {Sum: "sum", Average: "sum", Min: "min", Max: "max", Product: "prod"}[op]
    if dtype == BFLOAT16:
        expected = ("bfloat16", np.uint16, "bf16") if bf16_native else ("float32", np.float32, "upcast")
        assert (plan.nccl_type, plan.work_dtype, plan.cast) == expected
    elif dtype in (np.int16, np.uint16):  # NCCL has no 16-bit integers
        assert (plan.nccl_type, plan.work_dtype, plan.cast) == ("int32", np.int32, "upcast")
    else:
        assert dtype.name in NATIVE
        assert (plan.nccl_type, plan.work_dtype, plan.cast) == (dtype.name, dtype, "none")


def test_reduce_plan_rejects_what_nccl_cannot_do() -> None:
    with pytest.raises(TypeError, match=r"Received: dtype=complex64.*HINT"):
        nccl.reduce_plan(np.dtype(np.complex64), Sum, True)
    with pytest.raises(TypeError, match=r"Received: op=horo.Adasum.*HINT"):
        nccl.reduce_plan(np.dtype(np.float32), Adasum, True)


def test_bf16_native_needs_nccl_2_10_and_the_constant() -> None:
    assert nccl.nccl_bf16_supported(21000, True)
    assert nccl.nccl_bf16_supported(22501, True)
    assert not nccl.nccl_bf16_supported(20906, True)
    assert not nccl.nccl_bf16_supported(2804, True)  # 2.8.4 used the old 1000-based code
    assert not nccl.nccl_bf16_supported(23203, False)


# ------------------------------------------------------------------------------------------ decisions
def _info(host: str = "n0", gpu: str = "0000:01:00.0", ok: bool = True, why: str = "",
          gpu_ops: str = "NCCL") -> dict[str, object]:
    return {"ok": ok, "why": why, "host": host, "gpu": gpu, "gpu_ops": gpu_ops}


def test_decide_mode() -> None:
    assert nccl.decide_mode([_info()]) == (True, "")
    assert nccl.decide_mode([_info(gpu="a"), _info(gpu="b"), _info("n1", "a")]) == (True, "")
    use, why = nccl.decide_mode([_info(gpu="a"), _info(gpu="a")])
    assert not use and "ranks [0, 1] share GPU a on host n0" in why
    use, why = nccl.decide_mode([_info(gpu="a"), _info(gpu="b", ok=False, why="ImportError: no cupy")])
    assert not use and "rank 1" in why and "no cupy" in why
    use, why = nccl.decide_mode([_info(gpu="a"), _info(gpu="b", gpu_ops="MPI")])
    assert not use and "HORO_GPU_OPERATIONS=MPI on ranks [1]" in why


def test_environment_switches() -> None:
    assert nccl.hierarchical_requested({"HORO_HIERARCHICAL_ALLREDUCE": "1"})
    assert not nccl.hierarchical_requested({"HORO_HIERARCHICAL_ALLREDUCE": "0"})
    assert not nccl.hierarchical_requested({})
    assert nccl.gpu_operations({}) == "NCCL"
    assert nccl.gpu_operations({"HORO_GPU_OPERATIONS": "mpi"}) == "MPI"
    with pytest.raises(ValueError, match=r"Received: HORO_GPU_OPERATIONS='GLOO'.*HINT"):
        nccl.gpu_operations({"HORO_GPU_OPERATIONS": "gloo"})


# ------------------------------------------------------------------------------------------ layouts
@pytest.mark.parametrize("size", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("dim0", [0, 1, 2, 5, 6, 13])
def test_padded_blocks_match_the_host_split(dim0: int, size: int) -> None:
    rows, starts, block = nccl.padded_blocks(dim0, size)
    assert rows == mpi_ops.scatter_counts(dim0, size).tolist()
    assert starts == np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(int).tolist()
    assert block == max(rows) and block * size >= dim0


def test_allgather_displacements() -> None:
    assert nccl.allgather_displacements([2, 0, 3], 12) == ([24, 0, 36], [0, 24, 24])
    assert nccl.allgather_displacements([4], 8) == ([32], [0])


# ------------------------------------------------------------------------------------------ arithmetic
def test_bf16_widening_is_exact_for_every_pattern() -> None:
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    got = nccl.bf16_bits_to_f32(np, bits)
    want = bits.view(BFLOAT16).astype(np.float32)
    finite = ~np.isnan(want)
    assert np.array_equal(got[finite], want[finite])
    assert np.isnan(got[~finite]).all()


def test_bf16_rounding_matches_ml_dtypes() -> None:
    rng = np.random.default_rng(0)
    special = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 1e-40, -1e-40, 3.4028235e38, 1.00390625,
                        1.01171875, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -9], dtype=np.float32)
    values = np.concatenate([special, rng.standard_normal(20000).astype(np.float32) * 1e3,
                             rng.integers(0, 1 << 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)])
    got = nccl.f32_to_bf16_bits(np, values)
    with np.errstate(invalid="ignore"):  # NaN inputs
        want = values.astype(BFLOAT16).view(np.uint16)
    nan = np.isnan(values)
    assert np.array_equal(got[~nan], want[~nan])
    assert np.isnan(got[nan].view(BFLOAT16).astype(np.float32)).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64, np.int8, np.uint8])
@pytest.mark.parametrize("op", [Sum, Average, Max])
def test_finish_reduction_matches_mpi_ops(dtype: type, op: object) -> None:
    base = np.array([-7, -3, 0, 5, 9, 100], dtype=np.float64)
    a = (np.abs(base) if np.dtype(dtype).kind == "u" else base).astype(dtype)
    post = 0.5 if np.dtype(dtype).kind == "f" else 1.0
    got = nccl.finish_reduction(np, a.copy(), op, 3, post)
    want = a.copy()
    mpi_ops._finish(want, op, 3, post)
    assert got.dtype == want.dtype and np.array_equal(got, want)


# ------------------------------------------------------------------------------------------ dispatch
class _DLPackDevice:
    """A bare DLPack device descriptor (device detection reads nothing else)."""

    def __init__(self, kind: int, index: int = 0) -> None:
        self.kind, self.index = kind, index

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.kind, self.index


class _BrokenDLPack:
    def __dlpack_device__(self) -> tuple[int, int]:
        raise RuntimeError("no device")


class _CudaArrayInterface:
    @property
    def __cuda_array_interface__(self) -> dict[str, object]:
        return {"shape": (1,), "typestr": "<f4", "data": (0, False), "version": 3}


@pytest.mark.parametrize("value", [np.zeros(3), np.float32(1.0), np.zeros(2, dtype=BFLOAT16), [1.0, 2.0], (1,),
                                   memoryview(b"ab"), b"ab", 3, 2.5, None, "x", _BrokenDLPack(),
                                   _DLPackDevice(device.KDL_CPU), _DLPackDevice(device.KDL_CUDA_HOST)],
                         ids=lambda v: type(v).__name__)
def test_host_values_are_not_device_arrays(value: object) -> None:
    assert device.is_device_array(value) is False


def test_cuda_descriptors_are_device_arrays() -> None:
    assert device.is_device_array(_DLPackDevice(device.KDL_CUDA, 1))
    assert device.is_device_array(_DLPackDevice(device.KDL_CUDA_MANAGED))
    assert device.is_device_array(_CudaArrayInterface())
    assert device.dlpack_device(_DLPackDevice(2, 3)) == (2, 3)
    assert device.device_index(_DLPackDevice(2, 3)) == 3
    assert device.dlpack_device(np.zeros(1)) == (device.KDL_CPU, 0)


def test_objects_of_other_torch_named_packages_are_told_apart_from_torch_tensors() -> None:
    # e.g. torch_geometric's Data: its package name starts with "torch", but it is no tensor (no is_cuda).
    data = type("Data", (), {"__module__": "torch_geometric.data"})()
    assert device.is_device_array(data) is False
    assert device.is_device_array(type("Arr", (_DLPackDevice,), {"__module__": "torchfoo"})(device.KDL_CUDA, 2))
    assert device.device_index(type("Arr", (_DLPackDevice,), {"__module__": "torchfoo"})(device.KDL_CUDA, 2)) == 2


def test_torch_cpu_tensors_are_host_and_described() -> None:
    torch = pytest.importorskip("torch")
    names = ["uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
             "bool"]
    for name in names:
        t = torch.zeros((2, 3), dtype=getattr(torch, name))
        assert device.is_device_array(t) is False
        assert device.is_device_array(t.requires_grad_() if t.is_floating_point() else t) is False
        meta = device.device_meta(t)
        assert meta.shape == (2, 3) and meta.ndim == 2 and meta.size == 6
        assert meta.dtype == (BFLOAT16 if name == "bfloat16" else np.dtype(name)), name
    assert device.framework_of(torch.zeros(1)) == "torch"
    assert device.framework_of(torch.nn.Parameter(torch.zeros(1))) == "torch"
    with pytest.raises(TypeError, match=r"Received: tensor.dtype=torch.complex64.*HINT"):
        device.device_meta(torch.zeros(2, dtype=torch.complex64))


def test_tensorflow_cpu_tensors_are_host_and_immutable() -> None:
    tf = pytest.importorskip("tensorflow")
    t = tf.constant([[1.0, 2.0]], dtype=tf.bfloat16)
    assert device.is_device_array(t) is False
    assert device.framework_of(t) == "tensorflow"
    assert device.device_meta(t) == device.DeviceMeta(BFLOAT16, (1, 2))
    with pytest.raises(TypeError, match=r"immutable.*Received: tensor of type EagerTensor.*HINT"):
        device.check_writable(t, "horo.allreduce_")
    host = device.stage_to_host(t)
    assert host.dtype == BFLOAT16 and host.tolist() == [[1.0, 2.0]]
    back = device.to_device_like(host.astype(np.float32).astype(BFLOAT16) * 2, t)
    assert back.dtype == tf.bfloat16 and back.numpy().astype(np.float32).tolist() == [[2.0, 4.0]]


# ------------------------------------------------------------------------------------------ staging (CPU)
def test_stage_to_host_copies_torch_tensors() -> None:
    torch = pytest.importorskip("torch")
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()  # not contiguous
    h = device.stage_to_host(t)
    assert h.flags.c_contiguous and h.tolist() == t.tolist()
    h[...] = -1
    assert t[0, 0].item() == 0  # a copy, not a view
    b = torch.tensor([1.5, -2.25], dtype=torch.bfloat16)
    hb = device.stage_to_host(b)
    assert hb.dtype == BFLOAT16 and hb.astype(np.float32).tolist() == [1.5, -2.25]
    assert device.stage_to_host(torch.tensor([True, False])).dtype == np.bool_


def test_copy_back_and_to_device_like_torch() -> None:
    torch = pytest.importorskip("torch")
    t = torch.zeros(3, dtype=torch.bfloat16, requires_grad=True)
    out = device.copy_back(np.array([1.0, 2.0, 3.0], dtype=BFLOAT16), t)
    assert out is t and t.detach().float().tolist() == [1.0, 2.0, 3.0]
    like = device.to_device_like(np.array([4.0, 5.0], dtype=BFLOAT16), torch.zeros(2, dtype=torch.bfloat16))
    assert like.dtype == torch.bfloat16 and like.float().tolist() == [4.0, 5.0]
    ints = device.to_device_like(np.array([[1, 2]], dtype=np.int16), torch.zeros((1, 2), dtype=torch.int16))
    assert ints.dtype == torch.int16 and ints.tolist() == [[1, 2]]
    arr = np.zeros(2)
    assert device.copy_back(np.ones(2), arr) is arr and arr.tolist() == [1.0, 1.0]


def test_staging_is_announced_once(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device.staging, "_staging_noted", False)
    with caplog.at_level("WARNING", logger="horo"):
        assert device.note_staging("test reason") is True
        assert device.note_staging("again") is False
    lines = [r.getMessage() for r in caplog.records if "staged through host memory" in r.getMessage()]
    assert len(lines) == 1 and "test reason" in lines[0] and "HINT" in lines[0]


# ------------------------------------------------------------------------------------------ routing
BACKEND_FUNCS = sorted(set(host_backend.__all__) - {"reduce_group"})


@pytest.mark.parametrize("name", BACKEND_FUNCS)
def test_both_backends_take_the_same_arguments(name: str) -> None:
    def params(fn: object) -> list[str]:
        return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]

    assert name in gpu_backend.__all__
    assert params(getattr(gpu_backend, name)) == params(getattr(host_backend, name))


class _CudaLike:
    """Something a producer could hand over: CUDA memory per DLPack, with a dtype and a shape."""

    dtype = np.dtype(np.float32)
    shape = (4, 2)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (device.KDL_CUDA, 0)


def test_operands_pick_the_backend_by_where_the_buffers_live() -> None:
    host_x = checks.operand(np.zeros(3, np.float32), "horo.allreduce")
    gpu_x = checks.operand(_CudaLike(), "horo.allreduce")
    assert isinstance(host_x, np.ndarray) and backends.of(host_x) is host_backend
    assert gpu_x == device.DeviceMeta(np.dtype(np.float32), (4, 2)) and backends.of(gpu_x) is gpu_backend


def test_mixing_host_and_gpu_tensors_in_one_call_raises_before_any_communication() -> None:
    with pytest.raises(TypeError, match=r"tensors\[1\].*HINT: do not mix host and GPU tensors"):
        checks.operands([_CudaLike(), np.zeros(2, np.float32)], "horo.grouped_allreduce")
    with pytest.raises(TypeError, match=r"tensors\[2\]"):
        checks.operands([np.zeros(2), np.zeros(2), _CudaLike()], "horo.grouped_allreduce")


def test_the_core_has_no_device_twins() -> None:
    import horo.core as core

    assert not hasattr(core, "device_collectives")
    for mod in (collectives, core.api.async_ops):
        assert not [n for n in vars(mod) if n.startswith("device_")], mod.__name__


def test_device_signature_marker() -> None:
    meta = device.DeviceMeta(np.dtype(np.float32), (2,))
    sig = signatures.allreduce_sig(meta, "g", Average, 1.0, 1.0)
    assert signatures.is_device_signature(sig)
    host_sig = signatures.allreduce_sig(np.zeros(2, np.float32), "g", Average, 1.0, 1.0)
    assert not signatures.is_device_signature(host_sig)
    assert sig[:-1] == host_sig  # same fields as the host op, plus device=cuda


def test_imports_and_errors_without_cupy() -> None:
    code = textwrap.dedent("""
        import sys
        sys.modules["cupy"] = None  # as if the nccl extra were not installed
        from horo.core.transport import device, nccl
        from horo.core.api.backends import gpu
        assert device.cupy_or_none() is None
        try:
            nccl.load_cupy()
        except ImportError as exc:
            assert "Received:" in str(exc) and "HINT: pip install 'horo-mpi[nccl]'" in str(exc), exc
        else:
            raise AssertionError("load_cupy should fail")
        try:
            device.to_device_view(object(), what="horo.allreduce")
        except TypeError as exc:
            assert "HINT" in str(exc) and "horo.allreduce" in str(exc), exc
        info = nccl.local_capability(None)
        assert info["ok"] is False and info["why"], info
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stdout + res.stderr


def test_gpu_bench_without_a_gpu_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    if device.cupy_or_none() is not None:
        pytest.skip("a GPU is present: tests/gpu/test_nccl_gpu.py runs the benchmark itself")
    from horo.bench import gpu

    assert gpu.main(["--sizes", "1KiB"]) == 0
    assert "needs the nccl extra and a GPU" in capsys.readouterr().out
    assert gpu.main(["--sizes", "bogus"]) == 2
    assert "Received: 'bogus'" in capsys.readouterr().err
