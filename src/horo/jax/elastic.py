"""Elastic training for JAX loops: ``hvd.elastic.JaxState`` (parameters, optimizer state, picklable values).

Also re-exports the framework-free part (``run``, ``State``, ``ObjectState``, ``HostsUpdatedInterrupt``,
``HoroInternalError``/``HorovodInternalError``), so ``import horo.jax as hvd`` gives ``hvd.elastic.run``.

JAX arrays are immutable: the loop rebinds ``state.params`` and ``state.opt_state`` after every step, and a
commit copies them to host memory (a donated buffer cannot take the saved copy with it). After a reset JAX's
compiled functions are dropped, because the world size is part of what they were traced with.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from .. import core
from ..elastic import (
    ElasticError,
    HoroInternalError,
    HorovodInternalError,
    HostsUpdatedInterrupt,
    ObjectState,
    State,
    reset_count,
    run,
)
from .functions import broadcast_parameters

__all__ = ["JaxState", "run", "State", "ObjectState", "HostsUpdatedInterrupt", "HoroInternalError",
           "HorovodInternalError", "ElasticError", "reset_count"]


def _host_copy(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda a: np.array(a, copy=True) if hasattr(a, "dtype") else a, tree)


def _device(tree: Any) -> Any:
    import jax.numpy as jnp

    return jax.tree_util.tree_map(lambda a: jnp.asarray(a) if isinstance(a, np.ndarray) else a, tree)


class JaxState(ObjectState):
    """Model parameters and optimizer state (pytrees of arrays) plus any picklable values (``epoch=0``).

    Args:
        params: a pytree of arrays (Flax params / ``nnx.state(model)``, a dict of arrays, ...).
        opt_state: the optax state (``tx.init(params)``), or None.
        **kwargs: more values to save, restore and sync (``epoch=0, batch=0``).
    """

    def __init__(self, params: Any = None, opt_state: Any = None, **kwargs: Any) -> None:
        reserved = {"params", "opt_state"} & set(kwargs)
        if reserved:
            raise ValueError(f"JaxState: {sorted(reserved)} are positional. Received: keyword arguments "
                             f"{sorted(kwargs)}. HINT: JaxState(params, opt_state, epoch=0).")
        self.params = params
        self.opt_state = opt_state
        self._saved_trees: Any = None
        super().__init__(bcast_object=core.broadcast_object, get_rank=core.rank, **kwargs)
        self._save_trees()

    def _save_trees(self) -> None:
        self._saved_trees = _host_copy((self.params, self.opt_state))

    def save(self) -> None:
        self._save_trees()
        super().save()

    def restore(self) -> None:
        self.params, self.opt_state = _device(self._saved_trees)
        super().restore()

    def reset(self) -> None:
        # Compiled steps baked in the old world's size (a size-1 world skips the exchange; 16-bit layouts).
        jax.clear_caches()

    def sync(self) -> None:
        self.params, self.opt_state = broadcast_parameters((self.params, self.opt_state), 0,
                                                           name="horo.elastic.JaxState")
        super().sync()
        self._save_trees()

    def committed(self) -> Any:
        return {**super().committed(), "trees": self._saved_trees}

    def load_committed(self, value: Any) -> None:
        self._saved_trees = value["trees"]
        super().load_committed(value)
