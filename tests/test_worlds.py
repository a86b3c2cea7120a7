"""Per-world state (core.base.worlds): what one MPI world agreed on is forgotten on every rank when it ends.

The registry alone, then a one-process job that ends its world (``shutdown``) and starts another: the caches
and a torch optimizer's gradient buckets start the second world as a fresh process would. The elastic suites
(test_elastic_scenarios.py, FRAMEWORK=torch) grow and shrink real jobs whose optimizers use those buckets.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from horo.core.base import worlds

REPO = Path(__file__).resolve().parents[1]


def test_a_world_cache_is_emptied_when_the_world_ends() -> None:
    c = worlds.cache("a test cache")
    c["k"] = 1
    before = worlds.ends()
    worlds.end()
    assert c == {} and worlds.ends() == before + 1


def test_callbacks_run_in_registration_order_and_bound_methods_are_held_weakly() -> None:
    seen: list[str] = []

    class Holder:
        def __init__(self, tag: str) -> None:
            self.tag = tag
            worlds.on_change(self.forget)

        def forget(self) -> None:
            seen.append(self.tag)

    a, b = Holder("a"), Holder("b")
    worlds.on_change(lambda: seen.append("fn"))
    worlds.end()
    assert seen == ["a", "b", "fn"]
    del a
    gc.collect()
    seen.clear()
    worlds.end()
    assert seen == ["b", "fn"], "a dead object's callback ran"
    del b


def test_every_callback_runs_when_one_raises() -> None:
    seen: list[int] = []

    def bad() -> None:
        raise RuntimeError("boom")

    kept = list(worlds._CALLBACKS)  # noqa: SLF001 - restored below: no raising callback for later tests
    try:
        worlds.on_change(bad)
        worlds.on_change(lambda: seen.append(1))
        with pytest.raises(RuntimeError, match="boom"):
            worlds.end()
        assert seen == [1]
    finally:
        worlds._CALLBACKS[:] = kept  # noqa: SLF001


def test_on_change_refuses_what_it_cannot_call() -> None:
    with pytest.raises(TypeError, match="Received: callback=3"):
        worlds.on_change(3)  # type: ignore[arg-type]


_CHILD = textwrap.dedent(
    """
    import numpy as np
    import torch

    import horo.torch as hvd
    from horo import core
    from horo.core.scheduling import request

    def one_world():
        hvd.init()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        return model, opt

    def step(model, opt):
        opt.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        opt.step()

    model, opt = one_world()
    buckets = opt._exchange.buckets
    fresh = [[id(p) for p in b.params] for b in buckets.buckets]
    core.synchronize(core.allreduce_async(np.ones(3), op=hvd.Sum))  # unnamed: numbered from 0 in this world
    step(model, opt)
    step(model, opt)
    assert buckets.checked and buckets.rebuilt and buckets.exchanges == 2 * len(buckets.buckets)
    assert request._auto_ids, "the unnamed op was not counted"
    hvd.shutdown()
    assert not buckets.checked and not buckets.rebuilt and not request._auto_ids
    assert [[id(p) for p in b.params] for b in buckets.buckets] == fresh, "not the layout a new optimizer builds"
    hvd.init()
    h = core.allreduce_async(np.ones(3), op=hvd.Sum)
    assert request.get(h).name.endswith(".noname.0"), request.get(h).name
    core.synchronize(h)
    step(model, opt)
    assert buckets.checked and buckets.rebuilt
    print("CHILD-OK")
    """
)


@pytest.mark.timeout(120)
def test_a_new_world_starts_without_the_old_worlds_state(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_", "HORO"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH", "")) if p)
    env["HORO_FIRST_BUCKET_BYTES"], env["HORO_BUCKET_BYTES"] = "64", "128"  # several buckets
    proc = subprocess.run([sys.executable, "-c", _CHILD], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=110, check=False)
    assert proc.returncode == 0 and "CHILD-OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
