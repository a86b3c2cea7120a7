"""Elastic training for ``Trainer(strategy="horo")`` under ``hororun --min-np/--max-np`` (Horovod's elastic API).

Put the Trainer and its ``fit`` in a function decorated with ``hvd.elastic.run``; ``LightningState`` holds the
model and the last commit, ``ElasticCallback`` commits at batch and epoch ends. After a reset (a worker died,
hosts were added or removed) the function runs again: it builds a new Trainer, for the new world, and resumes
from the last commit::

    import lightning as L
    import horo.torch as hvd
    from horo.lightning import elastic

    hvd.init()
    state = elastic.LightningState(MyModule())

    @hvd.elastic.run
    def train(state):
        trainer = L.Trainer(strategy="horo", max_epochs=10, callbacks=[elastic.ElasticCallback(state)])
        trainer.fit(state.model, datamodule=dm, ckpt_path=state.ckpt_path)

    train(state)

The rest of an interrupted epoch is served over the new world: no committed sample is trained again in it.
"""

from __future__ import annotations

from typing import Any

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
from ..strategies.bind import classes
from ..strategies.elastic_data import ElasticDistributedSampler
from ..strategies.elastic_state import LightningState
from ..strategies.packages import lightning_module_classes

__all__ = ["LightningState", "ElasticCallback", "ElasticDistributedSampler", "run", "State", "ObjectState",
           "HostsUpdatedInterrupt", "HoroInternalError", "HorovodInternalError", "ElasticError", "reset_count"]


def ElasticCallback(state: LightningState, commit_every_n_batches: int = 1) -> Any:  # noqa: N802 - a class to users
    """The callback that commits ``state`` during ``trainer.fit``: after every ``commit_every_n_batches``-th
    optimizer step and at every epoch's end. Of the Lightning package ``state.model`` belongs to (``lightning``
    or ``pytorch_lightning``); see ``horo.strategies.elastic_callback.ElasticCallbackImpl``.

    Raises:
        TypeError: ``state`` is not a ``LightningState``.
        ValueError: ``commit_every_n_batches`` is not a positive int.
    """
    if not isinstance(state, LightningState):
        raise TypeError(f"ElasticCallback takes a LightningState. Received: state of type {type(state).__name__}. "
                        "HINT: ElasticCallback(horo.lightning.elastic.LightningState(model)).")
    package = next(p for p, cls in lightning_module_classes().items() if isinstance(state.model, cls))
    return classes(package).ElasticCallback(state, commit_every_n_batches)
