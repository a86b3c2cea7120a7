"""Device dispatch for GPU tensors: recognise them, view them as CuPy arrays, or stage them through the host.

Framework-free: each tensor type is read and written by a :class:`~.frameworks.Framework`, the core's own for
CuPy and DLPack producers, a facade's for its framework (see ``frameworks``). ``arrays`` recognises and
describes tensors, ``views`` makes zero-copy CuPy views on the framework's stream and hands results back,
``staging`` is the host-staging fallback used when NCCL cannot run.
"""

from .arrays import (
    DeviceMeta,
    check_writable,
    cupy_or_none,
    default_device,
    device_index,
    device_meta,
    framework_of,
    is_device_array,
    need_cupy,
)
from .frameworks import (
    KDL_CPU,
    KDL_CUDA,
    KDL_CUDA_HOST,
    KDL_CUDA_MANAGED,
    Framework,
    dlpack_device,
    host_storage,
    register,
)
from .staging import copy_back, note_staging, stage_to_host, to_device_like
from .views import DeviceView, empty_result, external_stream, hand_back, storage_view, to_device_view, wrap_result

__all__ = [
    "KDL_CPU", "KDL_CUDA", "KDL_CUDA_HOST", "KDL_CUDA_MANAGED", "DeviceMeta", "DeviceView", "Framework",
    "check_writable", "copy_back", "cupy_or_none", "default_device", "device_index", "device_meta", "dlpack_device",
    "empty_result", "external_stream", "framework_of", "hand_back", "host_storage", "is_device_array",
    "need_cupy", "note_staging", "register", "stage_to_host", "storage_view", "to_device_like", "to_device_view",
    "wrap_result",
]
