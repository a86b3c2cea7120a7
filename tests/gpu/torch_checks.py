"""horo.torch on CUDA tensors, run inside MPI ranks by tests/gpu/test_nccl_gpu.py (not collected by pytest).

    mpiexec -n N python tests/gpu/torch_checks.py {nccl|staged}

Every horo.torch op, ``DistributedOptimizer`` and the broadcasts run on CUDA tensors and are compared with the
same calls on CPU copies. With NCCL (EXPECTED_MODE ``nccl``) the GPU calls must make no host<->device copy:
CUPTI's memcpy records (through ``torch.profiler``) are counted over them, and two control blocks show the
counter does see a torch and a CuPy copy. Prints ``TORCH GPU CHECKS OK`` on rank 0, or the failures.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from gpu_checks import report


def host_copies(fn: Callable[[], Any]) -> tuple[Any, dict[str, int]]:
    """``fn()``'s result and the host<->device memcpys the CUDA driver recorded while it ran."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        out = fn()
        torch.cuda.synchronize()
    counts = {"HtoD": 0, "DtoH": 0}
    for e in prof.events():
        for k in counts:
            if e.name.startswith("Memcpy") and k in e.name:
                counts[k] += 1
    return out, counts


def main(argv: list[str]) -> int:
    expect = argv[0]
    import horo
    import horo.torch as hvd
    from horo.core.api.process_sets import global_process_set
    from horo.core.transport import nccl

    hvd.init()
    n, me = hvd.size(), hvd.rank()
    dev = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    fails: list[str] = []
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.uint8,
              torch.bool]

    def data(dt: torch.dtype, rows: int = 2 * n) -> torch.Tensor:
        g = torch.Generator().manual_seed(11 + me)
        if dt == torch.bool:
            return torch.randint(0, 2, (rows, 3), generator=g).bool()
        return torch.randint(0, 5, (rows, 3), generator=g).to(dt)

    def ops(x: torch.Tensor) -> dict[str, Any]:
        """One call of each op; keyed results (tensors, or lists of them)."""
        r: dict[str, Any] = {}
        tag = f"{x.device.type}.{x.dtype}"
        r["allreduce"] = hvd.allreduce(x, op=hvd.Sum, name=f"ar.{tag}")
        if x.dtype.is_floating_point:
            r["average"] = hvd.allreduce(x, name=f"avg.{tag}")
            r["prescaled"] = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, name=f"pre.{tag}")
        if x.dtype != torch.bool:
            r["max"] = hvd.allreduce(x, op=hvd.Max, name=f"max.{tag}")
        y = x.clone()
        r["allreduce_ returns its input"] = torch.tensor(hvd.allreduce_(y, op=hvd.Sum, name=f"ar_.{tag}") is y)
        r["allreduce_"] = y
        r["async"] = hvd.synchronize(hvd.allreduce_async(x, op=hvd.Sum, name=f"as.{tag}"))
        z = x.clone()
        hvd.synchronize(hvd.allreduce_async_(z, op=hvd.Sum, name=f"as_.{tag}"))
        r["async_"] = z
        r["grouped"] = hvd.grouped_allreduce([x, x[:1].clone()], op=hvd.Sum, name=f"gr.{tag}")
        r["allgather"] = hvd.allgather(x, name=f"ag.{tag}")
        r["broadcast"] = hvd.broadcast(x, root_rank=0, name=f"bc.{tag}")
        b = x.clone()
        hvd.broadcast_(b, root_rank=n - 1, name=f"bc_.{tag}")
        r["broadcast_"] = b
        r["alltoall"] = hvd.alltoall(x, name=f"a2a.{tag}")[0]
        if x.dtype != torch.bool:
            r["reducescatter"] = hvd.reducescatter(x, op=hvd.Sum, name=f"rs.{tag}")
        r["strided"] = hvd.allreduce(x.t(), op=hvd.Sum, name=f"st.{tag}")
        # The core itself on strided CUDA tensors (horo.torch hands it contiguous ones): its zero-copy views
        # must follow torch's strides, zero strides included. CPU tensors go through horo.torch.
        c = x.clone().t()
        if x.is_cuda:
            horo.allreduce_(c, op=horo.Sum, name=f"core_st_.{tag}")
            r["core expanded"] = horo.allreduce(x[:1].expand_as(x), op=horo.Sum, name=f"core_ex.{tag}")
        else:
            hvd.allreduce_(c, op=hvd.Sum, name=f"core_st_.{tag}")
            r["core expanded"] = hvd.allreduce(x[:1].expand_as(x), op=hvd.Sum, name=f"core_ex.{tag}")
        r["core strided_"] = c
        return r

    def compare(what: str, got: Any, want: Any) -> None:
        if isinstance(want, (list, tuple)):
            for i, (g, w) in enumerate(zip(got, want)):
                compare(f"{what}[{i}]", g, w)
            return
        # One-element results may sit on the CPU: the "returns its input" flags are made there on both runs.
        if not isinstance(got, torch.Tensor) or (got.device != dev and got.numel() > 1):
            fails.append(f"{what}: result is not on {dev}: {type(got).__name__} {getattr(got, 'device', '')}")
            return
        g = got.detach().cpu()
        if g.dtype != want.dtype or g.shape != want.shape:
            fails.append(f"{what}: {g.dtype}{tuple(g.shape)}, want {want.dtype}{tuple(want.shape)}")
        elif not torch.allclose(g.double(), want.double(), rtol=1e-2, atol=1e-2):
            fails.append(f"{what}: got {g.flatten()[:6].tolist()}, want {want.flatten()[:6].tolist()}")

    # Warm-up: the backends (collective set-up) and CUDA's own lazy initialisation are not the ops' copies.
    hvd.allreduce(torch.ones(4, device=dev), name="warm")
    hvd.synchronize(hvd.allreduce_async(torch.ones(4, device=dev), name="warm.async"))
    be = nccl.backend_for(global_process_set.comm, None)
    if be.mode != expect:
        fails.append(f"backend mode {be.mode!r} ({be.reason}), expected {expect!r}")

    for dt in dtypes:
        x = data(dt)
        want = ops(x)
        xg = x.to(dev)
        got, copies = host_copies(lambda: ops(xg))  # noqa: B023 - called at once
        for k, w in want.items():
            compare(f"{dt} {k}", got[k], w)
        if expect == "nccl" and any(copies.values()):
            fails.append(f"{dt}: host copies during the GPU ops: {copies}")

    # Repeated in-place allreduces run from the plan of their first, checked call (horo.torch.prepared): the
    # same results as on the CPU, no host copy, and a rank that changes its call still raises on every rank.
    from horo.torch import prepared

    for dt in (torch.float32, torch.float16, torch.bfloat16, torch.int32):
        x = data(dt)
        kinds = [("sum", {"op": hvd.Sum})]
        if dt.is_floating_point:
            kinds.append(("avg x2", {"postscale_factor": 2.0} if dt != torch.bfloat16 else {}))
        for kind, kw in kinds:
            cpu_y, gpu_y = x.clone(), x.to(dev)
            for _ in range(3):
                hvd.allreduce_(cpu_y, name=f"rep.{dt}.{kind}", **kw)
            _, copies = host_copies(lambda: [hvd.allreduce_(gpu_y, name=f"rep.{dt}.{kind}", **kw)  # noqa: B023
                                             for _ in range(3)])
            compare(f"repeated allreduce_ {dt} {kind}", gpu_y, cpu_y)
            if expect == "nccl" and any(copies.values()):
                fails.append(f"repeated allreduce_ {dt} {kind}: host copies {copies}")
    if not prepared._PLANS:
        fails.append("repeated allreduce_: no plan was kept for CUDA tensors")
    if n > 1:
        y = torch.ones(4, device=dev)
        for _ in range(2):
            hvd.allreduce_(y, op=hvd.Sum, name="rep.mismatch")
        try:
            hvd.allreduce_(y, op=hvd.Sum, name="rep.mismatch" if me else "rep.other")
            fails.append("repeated allreduce_ with different names on two ranks did not raise")
        except horo.MismatchError:
            pass

    # A burst of async allreduces, all pending in one round: they run as NCCL groups, one per reduction
    # (backends.gpu.ops.Allreduce.run_batch), in place and out of place, dtypes mixed.
    from horo.core.api.backends.gpu import ops as gpu_ops

    groups: list[int] = []
    plain_run = gpu_ops.Allreduce.__dict__["run_batch"]

    def counting(cls: Any, comm: Any, ops: Any) -> Any:
        groups.append(len(ops))
        return plain_run.__func__(cls, comm, ops)

    xs = [data(dt) for dt in (torch.float32, torch.float16, torch.int32, torch.bfloat16) for _ in range(4)]
    want_burst = [hvd.allreduce(x, op=hvd.Sum, name=f"burst.cpu.{i}") for i, x in enumerate(xs)]
    gs = [x.to(dev) for x in xs]
    gpu_ops.Allreduce.run_batch = classmethod(counting)
    try:
        with global_process_set.engine.round_lock:  # the engine thread starts no round until all are in
            hs = [(hvd.allreduce_async_ if i % 2 else hvd.allreduce_async)(g, op=hvd.Sum, name=f"burst.{i}")
                  for i, g in enumerate(gs)]
        got_burst, copies = host_copies(lambda: [hvd.synchronize(h) for h in hs])
    finally:
        gpu_ops.Allreduce.run_batch = plain_run
    for i, (g, w) in enumerate(zip(got_burst, want_burst)):
        compare(f"burst {i}", g, w)
        if i % 2 and g is not gs[i]:
            fails.append(f"burst {i}: allreduce_async_ did not return its input")
    print(f"rank {me}: burst of {len(gs)} async allreduces ran in groups of {groups}", flush=True)
    if groups != [len(gs)]:
        fails.append(f"burst: expected one group of {len(gs)}, got {groups}")
    if expect == "nccl" and any(copies.values()):
        fails.append(f"burst: host copies {copies}")

    # DistributedOptimizer: three steps on GPU equal three on CPU, from parameters broadcast from rank 0.
    def train(device: torch.device) -> tuple[list[torch.Tensor], dict[str, int]]:
        torch.manual_seed(100 + me)  # different on each rank: broadcast_parameters must make them equal
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        g = torch.Generator().manual_seed(7 + me)
        batches = [(torch.randn(6, 8, generator=g).to(device), torch.randn(6, 4, generator=g).to(device))
                   for _ in range(3)]

        def steps() -> None:
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            for xb, yb in batches:
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(xb), yb).backward()
                opt.step()
            hvd.broadcast_optimizer_state(opt, root_rank=0)

        _, copies = host_copies(steps) if device.type == "cuda" else (None, {})
        if device.type == "cpu":
            steps()
        return [p.detach().cpu() for p in model.parameters()], copies

    want_p, _ = train(torch.device("cpu"))
    got_p, copies = train(dev)
    # Gradient buckets on the GPU: the exchange above ran one prepared allreduce per bucket and step.
    ps = [torch.nn.Parameter(torch.full((1000 + i,), float(me + i), device=dev)) for i in range(6)]
    ex = hvd.GradientExchange([(f"b{i}", p) for i, p in enumerate(ps)], first_bucket_bytes=4000,
                              bucket_bytes=8000)
    for step in range(3):
        for p in ps:
            p.grad = p.detach() * (step + 1)
        _, bcopies = host_copies(ex.synchronize)
        want = [torch.full((1000 + i,), (step + 1) * (sum(range(n)) / n + i)) for i in range(6)]
        for i, (p, w) in enumerate(zip(ps, want)):
            compare(f"bucket step {step} grad {i}", p.grad, w)
        if expect == "nccl" and any(bcopies.values()):
            fails.append(f"bucket step {step}: host copies {bcopies}")
    nb = len(ex.buckets.buckets)
    if ex.exchanges != 3 * nb or nb < 3:
        fails.append(f"buckets: {ex.exchanges} exchanges in 3 steps over {nb} buckets")
    print(f"rank {me}: 6 gradients in {nb} buckets, {ex.exchanges} exchanges in 3 steps", flush=True)
    ex.remove_hooks()
    for i, (g, w) in enumerate(zip(got_p, want_p)):
        if not torch.allclose(g, w, rtol=1e-4, atol=1e-5):
            fails.append(f"DistributedOptimizer: parameter {i} differs from the CPU run by {(g - w).abs().max()}")
    print(f"rank {me}: training on {dev}: host copies {copies}", flush=True)
    if expect == "nccl" and any(copies.values()):
        fails.append(f"DistributedOptimizer on {dev}: host copies {copies}")

    # Controls: the counter sees a torch and a CuPy device-to-host copy.
    import cupy

    _, c1 = host_copies(lambda: torch.ones(8, device=dev).cpu())
    _, c2 = host_copies(lambda: cupy.asnumpy(cupy.ones(8)))
    if not c1["DtoH"] or not c2["DtoH"]:
        fails.append(f"the copy counter missed a control copy: torch {c1}, cupy {c2}")

    code = report(global_process_set.comm, fails, "TORCH GPU CHECKS", shown=30)
    hvd.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
