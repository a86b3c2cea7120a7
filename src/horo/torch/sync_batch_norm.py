"""``SyncBatchNorm``: batch normalisation over the batches of all ranks together (Horovod's ``hvd.SyncBatchNorm``).

In training, each rank computes its batch's per-channel count, mean and sum of squared deviations; one
allgather gives every rank everyone's, combined exactly (Chan et al.'s parallel variance), so ranks with
different batch sizes (even empty ones) are weighted by their counts. Backward allreduces the two per-channel
sums the input gradient needs (``sum(dy)``, ``sum(dy * x_hat)``), so each rank's input gradient is that of the
sum of every rank's loss, as horo's collectives' gradients are; the weight and bias gradients stay local, for
``DistributedOptimizer`` or a strategy to average. With N ranks of batch b, outputs, running statistics and
averaged gradients are those of one ``BatchNorm`` on the N x b batch. Running statistics are identical on every
rank. Evaluation mode, and a single rank, use plain batch normalisation. Works on CPU and CUDA tensors (torch's
own ``nn.SyncBatchNorm`` refuses CPU modules).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import FunctionCtx
from torch.nn.modules.batchnorm import _BatchNorm

from .. import core
from ..core.api.process_sets import ProcessSet
from .tensors import stage

__all__ = ["SyncBatchNorm"]


def _set(process_set: ProcessSet | None) -> ProcessSet:
    return core.global_process_set if process_set is None else process_set


class _SyncBatchNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                running_mean: torch.Tensor | None, running_var: torch.Tensor | None, eps: float, momentum: float,
                process_set: ProcessSet | None) -> torch.Tensor:
        c = x.shape[1]
        dims = [0, *range(2, x.dim())]
        shape = [1, c] + [1] * (x.dim() - 2)
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        count = x.numel() // c if c else 0
        if count:
            mean = xf.mean(dims)
            m2 = (xf - mean.view(shape)).square().sum(dims)
        else:
            mean = m2 = xf.new_zeros(c)
        mine = torch.cat([mean.new_full((1,), float(count)), mean, m2]).double().unsqueeze(0)
        s = stage(mine, "horo.torch.SyncBatchNorm")
        every = s.wrap(core.allgather(s.array, name=f"horo.torch.SyncBatchNorm.stats[{c}]", process_set=process_set))
        counts, means, m2s = every[:, :1], every[:, 1:1 + c], every[:, 1 + c:]
        total = float(counts.sum())
        if total <= 1:
            raise ValueError(f"horo.torch.SyncBatchNorm: expected more than 1 value per channel when training over "
                             f"all ranks. Received: {int(total)} value(s) per channel in input of shape "
                             f"{list(x.shape)} on this rank. HINT: use larger batches, or eval() mode.")
        g_mean = (counts * means).sum(0) / total
        g_m2 = m2s.sum(0) + (counts * (means - g_mean).square()).sum(0)
        var = g_m2 / total
        if running_mean is not None and running_var is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(g_mean.to(running_mean.dtype), alpha=momentum)
                running_var.mul_(1 - momentum).add_((g_m2 / (total - 1)).to(running_var.dtype), alpha=momentum)
        mean_f, invstd = g_mean.to(xf.dtype), torch.rsqrt(var + eps).to(xf.dtype)
        xhat = (xf - mean_f.view(shape)) * invstd.view(shape)
        y = xhat
        if weight is not None:
            y = y * weight.to(xf.dtype).view(shape)
        if bias is not None:
            y = y + bias.to(xf.dtype).view(shape)
        ctx.save_for_backward(xhat, weight, invstd)
        ctx.total, ctx.process_set = total, process_set  # type: ignore[attr-defined]
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx: FunctionCtx, dy: torch.Tensor) -> tuple[Any, ...]:
        xhat, weight, invstd = ctx.saved_tensors  # type: ignore[attr-defined]
        dims = [0, *range(2, xhat.dim())]
        shape = [1, xhat.shape[1]] + [1] * (xhat.dim() - 2)
        dyf = dy.to(xhat.dtype)
        sum_dy, sum_dy_xhat = dyf.sum(dims), (dyf * xhat).sum(dims)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            c = xhat.shape[1]
            s = stage(torch.cat([sum_dy, sum_dy_xhat]), "horo.torch.SyncBatchNorm (backward)")
            both = s.wrap(core.allreduce(s.array, op=core.Sum, name=f"horo.torch.SyncBatchNorm.grad[{c}]",
                                         process_set=ctx.process_set))  # type: ignore[attr-defined]
            total = ctx.total  # type: ignore[attr-defined]
            mean_dy, mean_dy_xhat = both[:c] / total, both[c:] / total
            scale = invstd if weight is None else invstd * weight.to(xhat.dtype)
            grad_x = ((dyf - mean_dy.view(shape) - xhat * mean_dy_xhat.view(shape)) * scale.view(shape))
            grad_x = grad_x.to(dy.dtype)
        if weight is not None and ctx.needs_input_grad[1]:
            grad_w = sum_dy_xhat.to(weight.dtype)
        if ctx.needs_input_grad[2]:
            grad_b = sum_dy.to(dy.dtype)
        return grad_x, grad_w, grad_b, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalisation whose training statistics cover the batches of every rank (module docstring).

    Args as ``torch.nn.BatchNorm*d`` (any input of 2 or more dims, channels in dim 1), plus ``process_set``:
    the ranks whose batches are normalised together (default: all).
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_set: ProcessSet | None = None, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        if process_set is not None and not isinstance(process_set, ProcessSet):
            raise TypeError(f"horo.torch.SyncBatchNorm: process_set must be a horo.ProcessSet. Received: "
                            f"process_set={process_set!r}. HINT: horo.torch.add_process_set([...]).")
        self.process_set = process_set

    def _check_input_dim(self, input: torch.Tensor) -> None:  # noqa: A002 - torch's name
        if input.dim() < 2:
            raise ValueError(f"horo.torch.SyncBatchNorm: expected at least 2D input. Received: input of shape "
                             f"{list(input.shape)} ({input.dim()}D). HINT: batch dim first, channels second.")

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's name
        self._check_input_dim(input)
        training = self.training or (self.running_mean is None and self.running_var is None)
        if not training or not core.is_initialized() or _set(self.process_set).size() == 1:
            return super().forward(input)
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative moving average, as BatchNorm
                momentum = 1.0 / float(self.num_batches_tracked)
        keep = self.training and self.track_running_stats
        return _SyncBatchNormFn.apply(input, self.weight, self.bias, self.running_mean if keep else None,
                                      self.running_var if keep else None, self.eps, momentum, self.process_set)

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module,
                               process_set: ProcessSet | None = None) -> torch.nn.Module:
        """Replace every ``BatchNorm*d`` (and torch's ``nn.SyncBatchNorm``) in ``module`` by a ``SyncBatchNorm``
        sharing its parameters and buffers; returns the converted module (``module`` itself when only children
        changed). ``revert_sync_batchnorm`` undoes it."""
        out = module
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            out = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
                      process_set)
            out._horo_original = type(module)  # type: ignore[assignment]  # for revert_sync_batchnorm
            _share(module, out)
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_set))
        return out

    @classmethod
    def revert_sync_batchnorm(cls, module: torch.nn.Module) -> torch.nn.Module:
        """Give back the modules ``convert_sync_batchnorm`` replaced (same parameters and buffers)."""
        out = module
        original = getattr(module, "_horo_original", None)
        if isinstance(module, cls) and original is not None:
            out = original(module.num_features, module.eps, module.momentum, module.affine,
                           module.track_running_stats)
            _share(module, out)
        for name, child in module.named_children():
            out.add_module(name, cls.revert_sync_batchnorm(child))
        return out


def _share(src: _BatchNorm, dst: _BatchNorm) -> None:
    with torch.no_grad():
        if src.affine:
            dst.weight, dst.bias = src.weight, src.bias
    dst.running_mean, dst.running_var = src.running_mean, src.running_var
    dst.num_batches_tracked = src.num_batches_tracked
    dst.train(src.training)
    if hasattr(src, "qconfig"):
        dst.qconfig = src.qconfig
