"""DDP's options, as the horo strategies take them: accepted where they mean something for horo, refused with
horo's equivalent otherwise (a script moving from ``DDPStrategy(...)`` keeps its arguments or learns what to do)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from ..torch.compression import Compression, Compressor

__all__ = ["DdpOptions", "ddp_options"]

#: DDP options horo has no use for, with what to do instead.
_REFUSED = {
    "static_graph": "horo needs no static graph: its buckets follow the first step's gradient order by themselves. "
                    "HINT: drop static_graph.",
    "process_group_backend": "horo's collectives run over MPI (and NCCL on GPUs); torch.distributed gets a 'horo' "
                             "group. HINT: drop process_group_backend.",
    "model_averaging_period": "horo has no post-local SGD: every step averages the gradients. "
                              "HINT: drop model_averaging_period.",
    "ddp_comm_state": "horo takes no communication hook state. HINT: drop ddp_comm_state; compression=... "
                      "sets how gradients travel.",
    "ddp_comm_wrapper": "horo takes no hook wrapper. HINT: compression=horo.torch.Compression.fp16 (or bf16).",
    "start_method": "horo starts the ranks with MPI (hororun, or from `python train.py` itself). "
                    "HINT: drop start_method.",
    "delay_all_reduce_named_params": "horo exchanges every gradient as backward produces it. HINT: drop it.",
    "param_to_hook_all_reduce": "horo exchanges every gradient as backward produces it. HINT: drop it.",
    "skip_all_reduce_unused_params": "horo already skips what no rank used (find_unused_parameters). "
                                     "HINT: drop it.",
    "mixed_precision": "horo takes Lightning's precision. HINT: Trainer(precision=...) / Fabric(precision=...).",
    "device_ids": "each horo rank uses its local device. HINT: drop device_ids.",
    "output_device": "each horo rank uses its local device. HINT: drop output_device.",
    "dim": "horo does not split batches: each rank loads its own. HINT: drop dim.",
    "check_reduction": "DDP ignores it too. HINT: drop check_reduction.",
    "init_sync": "horo always starts every rank from rank 0's parameters and buffers. HINT: drop init_sync.",
}

#: Values of refused options that ask for what horo does anyway (DDP's defaults, mostly).
_HARMLESS: dict[str, Any] = {"static_graph": False, "check_reduction": False, "init_sync": True,
                             "start_method": "popen"}


@dataclass
class DdpOptions:
    """What DDP's options set in horo (None: horo's default)."""

    bucket_bytes: int | None = None
    broadcast_buffers: bool = True
    gradient_as_bucket_view: bool = False
    compression: type[Compressor] | None = None
    timeout_s: float | None = None


def _bool(name: str, value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{what}: {name} must be True or False. Received: {name}={value!r}.")
    return value


def _hook_compression(hook: Any, what: str) -> type[Compressor]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if hook is default_hooks.fp16_compress_hook:
        return Compression.fp16
    if hook is getattr(default_hooks, "bf16_compress_hook", None):
        return Compression.bf16
    raise ValueError(f"{what} does not take DDP's ddp_comm_hook other than fp16_compress_hook and "
                     f"bf16_compress_hook (horo's compression). Received: ddp_comm_hook="
                     f"{getattr(hook, '__name__', hook)!r}. HINT: compression=horo.torch.Compression.fp16 (or bf16), "
                     "or drop ddp_comm_hook.")


def ddp_options(kwargs: dict[str, Any], what: str) -> DdpOptions:
    """Read DDP's options out of ``kwargs`` (all of them: an unknown name raises TypeError, as Python would).

    Raises:
        ValueError: a DDP option horo has no use for (the message names horo's equivalent), or a bad value.
        TypeError: a name DDP does not know either, or a value of the wrong type.
    """
    out = DdpOptions()
    for name, value in kwargs.items():
        if name in _REFUSED:
            if name in _HARMLESS and value == _HARMLESS[name] and type(value) is type(_HARMLESS[name]):
                continue
            raise ValueError(f"{what} does not take DDP's {name}. Received: {name}={value!r}. {_REFUSED[name]}")
        if name == "bucket_cap_mb":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{what}: bucket_cap_mb must be a non-negative number of MiB. Received: "
                                 f"bucket_cap_mb={value!r}. HINT: 25 is DDP's default.")
            out.bucket_bytes = int(value * 2**20)
        elif name == "broadcast_buffers":
            out.broadcast_buffers = _bool(name, value, what)
        elif name == "gradient_as_bucket_view":
            out.gradient_as_bucket_view = _bool(name, value, what)
        elif name == "find_unused_parameters":
            _bool(name, value, what)  # horo always finds them (see docs/torch-lightning.md): either value is fine
        elif name == "timeout":
            if value is not None:
                if not isinstance(value, datetime.timedelta) or value.total_seconds() <= 0:
                    raise ValueError(f"{what}: timeout must be a positive datetime.timedelta. Received: "
                                     f"timeout={value!r}. HINT: timeout=datetime.timedelta(minutes=30).")
                out.timeout_s = value.total_seconds()
        elif name == "ddp_comm_hook":
            if value is not None:
                out.compression = _hook_compression(value, what)
        else:
            raise TypeError(f"{what} got an unexpected keyword argument {name!r}. Received: {name}={value!r}. "
                            "HINT: horo takes compression, gradient_predivide_factor, overlap, op, and DDP's "
                            "bucket_cap_mb, broadcast_buffers, find_unused_parameters, gradient_as_bucket_view, "
                            "timeout, ddp_comm_hook.")
    return out
