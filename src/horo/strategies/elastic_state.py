"""``LightningState``: what an elastic Lightning fit rolls back to, Lightning's own checkpoint of the last commit.

A commit (``state.commit()``, made by ``ElasticCallback`` at batch and epoch ends) keeps in memory the full
checkpoint the Trainer would write (``dump_checkpoint``: the LightningModule, optimizers, LR schedulers, the
loops' progress, callbacks' and the datamodule's states, precision), a copy that training does not touch. After
a reset the training function builds a new Trainer, whose ``fit(ckpt_path=state.ckpt_path)`` resumes from it:
``ckpt_path`` names the commit, and the horo strategy's ``load_checkpoint`` hands it over without any file.
Written once for both Lightning packages.
"""

from __future__ import annotations

import copy
import uuid
import weakref
from collections.abc import Callable
from typing import Any

import torch

from .. import core
from ..elastic import ObjectState
from .packages import lightning_module_classes

__all__ = ["LightningState", "PREFIX", "committed_checkpoint"]

#: ``ckpt_path`` of a commit held in memory: ``horo-elastic://<state's token>``.
PREFIX = "horo-elastic://"
_STATES: weakref.WeakValueDictionary[str, LightningState] = weakref.WeakValueDictionary()
_RESERVED = ("model", "trainer", "ckpt_path", "checkpoint")


def committed_checkpoint(path: Any) -> dict[str, Any] | None:
    """The checkpoint ``path`` names when it is a ``LightningState``'s ``ckpt_path`` (a copy: the Trainer's
    optimizers keep the tensors they load), else None.

    Raises:
        ValueError: ``path`` names a commit that no live state holds.
    """
    if not isinstance(path, str) or not path.startswith(PREFIX):
        return None
    state = _STATES.get(path[len(PREFIX):])
    if state is None or state.checkpoint is None:
        raise ValueError(f"{path!r} names an elastic commit this process does not hold. Received: "
                         f"ckpt_path={path!r}. HINT: pass fit(ckpt_path=state.ckpt_path) of the LightningState in use.")
    return copy.deepcopy(state.checkpoint)


class LightningState(ObjectState):
    """A LightningModule, the Trainer's checkpoint of the last commit, and any picklable values.

    ``save`` (through ``commit()``) keeps the running Trainer's full checkpoint; ``restore`` puts the committed
    weights back into the module; ``sync`` gives every rank rank 0's commit (new workers included). Reset
    callbacks (``register_reset_callbacks``) run on every worker, new ones included, once the next Trainer has
    restored the commit (at ``on_train_start``), where ``state.trainer`` is that Trainer: there they can
    rescale what depends on the world's size, e.g. ``state.trainer.optimizers``' learning rates.

    Args:
        model: the ``LightningModule`` given to every ``fit`` (of either Lightning package).
        **kwargs: more values to commit, restore and sync (``ObjectState``).
    """

    def __init__(self, model: Any, **kwargs: Any) -> None:
        if not _is_lightning_module(model):
            raise TypeError(f"LightningState: model must be a LightningModule. Received: model of type "
                            f"{type(model).__name__}. HINT: state = LightningState(model), and "
                            "trainer.fit(model, ..., ckpt_path=state.ckpt_path).")
        clash = [k for k in kwargs if k in _RESERVED or k.startswith("_")]
        if clash:
            raise ValueError(f"LightningState: {clash} name attributes of the state itself. Received: "
                             f"{', '.join(f'{k}=...' for k in clash)}. HINT: choose other names.")
        self.model = model
        self.checkpoint: dict[str, Any] | None = None  # the last commit: Lightning's checkpoint dict
        self._initial = _copy_tensors(model.state_dict())  # what a rollback before the first commit goes to
        self._trainer: Any = None
        self._reset_pending = False
        self._token = uuid.uuid4().hex
        _STATES[self._token] = self
        super().__init__(bcast_object=core.broadcast_object, get_rank=core.rank, **kwargs)

    @property
    def ckpt_path(self) -> str | None:
        """What to pass as ``trainer.fit(..., ckpt_path=...)``: the last commit, or None before the first."""
        return None if self.checkpoint is None else PREFIX + self._token

    @property
    def trainer(self) -> Any:
        """The Trainer of the fit in progress (set by ``ElasticCallback``), or None outside one."""
        return self._trainer

    def attach(self, trainer: Any) -> None:
        """The Trainer whose state ``commit()`` saves from now on (``ElasticCallback`` calls it; None detaches)."""
        self._trainer = trainer

    # ------------------------------------------------------------------------------------ State
    def save(self) -> None:
        trainer = self._trainer
        if trainer is None:
            raise RuntimeError("LightningState.commit() saves the running Trainer's state, and no fit is running. "
                               "HINT: let ElasticCallback(state) commit inside trainer.fit, or call state.commit() "
                               "from a hook of that fit.")
        # A deep copy: the dump shares the live parameters' and optimizer states' memory.
        self.checkpoint = copy.deepcopy(trainer._checkpoint_connector.dump_checkpoint(weights_only=False))
        super().save()

    def restore(self) -> None:
        super().restore()
        self._load_model()

    def sync(self) -> None:
        got = self._bcast_object(self.checkpoint if self._rank() == 0 else None, 0, name="horo.elastic.LightningState")
        if got is not None and self.checkpoint is None:
            self._reset_pending = True  # a new worker: it adapts to the world as the others do
        self.checkpoint = got
        super().sync()
        self._load_model()

    def committed(self) -> Any:
        return {**super().committed(), "lightning": self.checkpoint}

    def load_committed(self, value: Any) -> None:
        self.checkpoint = value.get("lightning")
        super().load_committed(value)

    def on_reset(self) -> None:
        """The world changed: the reset callbacks wait for the next Trainer (``run_reset_callbacks``)."""
        self.reset()
        self._reset_pending = True

    def run_reset_callbacks(self) -> None:
        """Run the reset callbacks if a reset happened since they last ran (``ElasticCallback``, at
        ``on_train_start``)."""
        if not self._reset_pending:
            return
        self._reset_pending = False
        callbacks: list[Callable[[], Any]] = self._reset_callbacks
        for callback in callbacks:
            callback()

    def _load_model(self) -> None:
        if self.checkpoint is not None:
            self.model.load_state_dict(self.checkpoint["state_dict"], strict=self.model.strict_loading)
        else:  # layers made in configure_model are not in the initial copy yet: they are made again
            self.model.load_state_dict(self._initial, strict=False)


def _copy_tensors(state_dict: dict[str, Any]) -> dict[str, Any]:
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v) for k, v in state_dict.items()}


def _is_lightning_module(model: Any) -> bool:
    return any(isinstance(model, cls) for cls in lightning_module_classes().values())
