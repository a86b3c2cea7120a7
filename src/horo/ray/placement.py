"""Where a :class:`~horo.ray.RayExecutor`'s workers go: a placement group (Horovod's strategies).

- ``num_workers=N``: N bundles of one worker's resources, packed (``PACK``) on as few nodes as fit;
- ``num_hosts=H, num_workers_per_host=W``: H bundles of W workers' resources, one per node (``STRICT_SPREAD``);
- inside a placement group already (a task or actor scheduled in one, ``use_current_placement_group=True``):
  that group, which the executor neither made nor removes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Placement", "place"]


@dataclass
class Placement:
    """A placement group and the bundle of each worker (-1: any bundle of a group the executor did not make)."""

    group: Any
    created: bool
    bundles: list[int] = field(default_factory=list)

    def remove(self) -> None:
        """Remove the group if the executor made it (its bundles are then free again)."""
        import ray

        if self.created and self.group is not None:
            ray.util.remove_placement_group(self.group)
            self.created = False


def _resources(cpus: float, gpus: float) -> dict[str, float]:
    return {"CPU": float(cpus), **({"GPU": float(gpus)} if gpus else {})}


def place(*, num_workers: int | None, num_hosts: int | None, num_workers_per_host: int, cpus_per_worker: float,
          gpus_per_worker: float, use_current: bool, timeout_s: float) -> Placement:
    """The placement of the workers (see the module docstring); raises ``TimeoutError`` naming the resources
    where the cluster cannot hold them within ``timeout_s`` seconds."""
    import ray
    from ray.util.placement_group import get_current_placement_group

    current = get_current_placement_group() if use_current else None
    total = num_workers if num_workers is not None else num_hosts * num_workers_per_host  # type: ignore[operator]
    if current is not None:
        return Placement(group=current, created=False, bundles=[-1] * total)
    if num_workers is not None:
        bundles = [_resources(cpus_per_worker, gpus_per_worker) for _ in range(num_workers)]
        strategy, per_bundle = "PACK", 1
    else:
        per_bundle = num_workers_per_host
        bundles = [_resources(cpus_per_worker * per_bundle, gpus_per_worker * per_bundle)
                   for _ in range(num_hosts)]  # type: ignore[arg-type]
        strategy = "STRICT_SPREAD"
    group = ray.util.placement_group(bundles, strategy=strategy)
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        ray.util.remove_placement_group(group)
        raise TimeoutError(
            f"horo.ray: the cluster could not hold {total} workers within {timeout_s:g} s "
            f"(placement_group_timeout_s): asked for {len(bundles)} x {bundles[0]} ({strategy}); the cluster has "
            f"{_rounded(ray.available_resources())} free of {_rounded(ray.cluster_resources())}. HINT: ask for "
            "fewer workers or resources per worker, add nodes, or raise placement_group_timeout_s.")
    return Placement(group=group, created=True, bundles=[b for b in range(len(bundles)) for _ in range(per_bundle)])


def _rounded(resources: dict[str, float]) -> dict[str, float]:
    # CPUs, GPUs and custom resources; not the markers of nodes and placement groups, nor memory's bytes
    return {k: round(v, 2) for k, v in sorted(resources.items())
            if not k.startswith("node:") and "_group_" not in k and k not in ("memory", "object_store_memory")}
