"""``ElasticCallback``: commits an elastic Lightning fit (``LightningState``) at batch and epoch ends.

A commit is taken in ``on_train_batch_end`` after an optimizer step (every ``commit_every_n_batches`` steps) and
in ``on_train_epoch_end``, where Lightning's own checkpoints are taken; ``commit()`` then raises
``HostsUpdatedInterrupt`` when hororun has new hosts or some must leave, which leaves ``trainer.fit`` (Lightning
tears the fit down and re-raises) and lets ``hvd.elastic.run`` re-form the world. Its state in the commit is
which samples of the current epoch are trained: after a reset the strategy's ``ElasticDistributedSampler``
serves the others, over the new world (see ``elastic_data``). Written once for both Lightning packages (``bind``).
"""

from __future__ import annotations

import warnings
from typing import Any

from torch.utils.data import DistributedSampler
from typing_extensions import override

from .. import core
from .elastic_data import ElasticDistributedSampler, batches_in, resume_mid_epoch
from .elastic_state import LightningState
from .strategy import HoroStrategyImpl

__all__ = ["ElasticCallbackImpl"]

# Lightning warns that a loader without state cannot resume mid-epoch; the elastic sampler does resume it.
_NOT_RESUMABLE = r"You're resuming from a checkpoint that ended before the epoch ended"


class ElasticCallbackImpl:
    """Commits ``state`` (a ``LightningState``) during ``trainer.fit`` and makes the fit resumable in any world.

    Needs ``Trainer(strategy="horo")``; the fit's model must be ``state.model``, and after a commit the fit must
    resume from it: ``trainer.fit(model, ..., ckpt_path=state.ckpt_path)``. The training DataLoader must be
    map-style with a ``batch_size`` (Lightning then adds its ``DistributedSampler``, which the strategy makes
    elastic).

    Args:
        state: the ``LightningState`` of ``model``.
        commit_every_n_batches: commit after every n-th optimizer step (1: each), and at every epoch's end.
    """

    _lightning: Any  # the package's own classes (bind.Bound)

    def __init__(self, state: LightningState, commit_every_n_batches: int = 1) -> None:
        if not isinstance(state, LightningState):
            raise TypeError(f"ElasticCallback takes a LightningState. Received: state of type {type(state).__name__}. "
                            "HINT: ElasticCallback(horo.lightning.elastic.LightningState(model)).")
        n = commit_every_n_batches
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"ElasticCallback: commit_every_n_batches must be a positive int. Received: "
                             f"commit_every_n_batches={n!r}.")
        self.state = state
        self.commit_every_n_batches = n
        self._trainer: Any = None
        self._sampler: ElasticDistributedSampler | None = None
        self._loaded: dict[str, Any] | None = None  # this callback's state in the commit the fit resumes from
        self._steps = 0  # optimizer steps since the last commit
        self._batches = 0  # batches trained since the sampler's pass over the epoch began
        self._batch_size = 1
        self._drop_last = False

    # ------------------------------------------------------------------------------------ fit
    @override
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        what = "ElasticCallback"
        if not isinstance(trainer.strategy, HoroStrategyImpl):
            raise ValueError(f"{what} needs Trainer(strategy='horo'). Received: strategy of type "
                             f"{type(trainer.strategy).__name__}. HINT: L.Trainer(strategy='horo', callbacks=[...]).")
        if pl_module is not self.state.model:
            raise ValueError(f"{what}: the fit's model is not the LightningState's. Received: model of type "
                             f"{type(pl_module).__name__}. HINT: trainer.fit(state.model, ...).")
        mine = [cb for cb in trainer.callbacks if isinstance(cb, ElasticCallbackImpl)]
        if len(mine) > 1:
            raise ValueError(f"{what}: a fit takes one. Received: {len(mine)} ElasticCallbacks. HINT: keep one.")
        self._trainer = trainer
        self._steps = self._batches = 0
        trainer.strategy.elastic = self
        self.state.attach(trainer)
        warnings.filterwarnings("ignore", message=_NOT_RESUMABLE)

    @override
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        path = self.state.ckpt_path
        if path is not None and trainer.ckpt_path != path:
            raise ValueError(f"ElasticCallback: this fit does not resume from the last commit. Received: "
                             f"ckpt_path={trainer.ckpt_path!r}. HINT: trainer.fit(model, ..., "
                             "ckpt_path=state.ckpt_path) inside the @hvd.elastic.run function.")

    @override
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._resume_mid_epoch(trainer)
        self.state.run_reset_callbacks()

    @override
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._batches = 0

    @override
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._batches += 1
        loop = trainer.fit_loop.epoch_loop
        if loop._should_accumulate():  # mid-accumulation: gradients are not part of a commit
            return
        self._steps += 1
        # The last batch's commit is the epoch's, at its end (after the epoch's validation and LR schedulers).
        if self._steps >= self.commit_every_n_batches and not loop.batch_progress.is_last_batch:
            self._commit()

    @override
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._commit()

    @override
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._detach(trainer)

    @override
    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self._detach(trainer)

    def _commit(self) -> None:
        self._steps = 0
        self.state.commit()

    def _detach(self, trainer: Any) -> None:
        if getattr(trainer.strategy, "elastic", None) is self:
            trainer.strategy.elastic = None
        if self.state.trainer is trainer:
            self.state.attach(None)
        self._trainer = None

    # ------------------------------------------------------------------------------------ state
    @override
    def state_dict(self) -> dict[str, Any]:
        """The epoch the fit is in and which of its samples are trained (by every rank), for a resume."""
        trainer, sampler = self._trainer, self._sampler
        epoch = trainer.fit_loop.epoch_progress.current.processed if trainer is not None else 0
        if sampler is None or epoch != sampler.epoch:  # at an epoch's end: the next one starts afresh
            return {"epoch": epoch, "history": []}
        return {"epoch": epoch, "history": sampler.history_after(self._batches, self._batch_size)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._loaded = dict(state_dict)

    # ------------------------------------------------------------------------------------ data
    def process_dataloader(self, dataloader: Any) -> Any:
        """The training DataLoader with an ``ElasticDistributedSampler`` in place of Lightning's
        ``DistributedSampler`` (the strategy's ``process_dataloader`` calls it); other loaders as they are."""
        trainer = self._trainer
        if trainer is None or not trainer.training:
            return dataloader
        sampler = getattr(dataloader, "sampler", None)
        # Lightning's wrapper of a user's own sampler draws anew each pass: no sample is known to be trained.
        plain = isinstance(sampler, DistributedSampler) and not isinstance(sampler, self._lightning.SamplerWrapper)
        if not plain or getattr(dataloader, "batch_size", None) is None:
            raise ValueError(
                "ElasticCallback re-partitions the training data after a reset: it needs a map-style DataLoader "
                "with a batch_size, which Lightning gives its DistributedSampler. Received: a training loader "
                f"of type {type(dataloader).__name__} with sampler {type(sampler).__name__}. HINT: "
                "DataLoader(dataset, batch_size=..., shuffle=...) with Trainer(use_distributed_sampler=True).")
        epoch = trainer.fit_loop.epoch_progress.current.processed
        loaded = self._loaded or {}
        history = loaded.get("history", []) if loaded.get("epoch") == epoch else []
        self._sampler = ElasticDistributedSampler(sampler.dataset, num_replicas=core.size(), rank=core.rank(),
                                                  shuffle=sampler.shuffle, seed=sampler.seed,
                                                  drop_last=sampler.drop_last, epoch=epoch, history=history)
        self._batch_size = int(dataloader.batch_size)
        self._drop_last = bool(dataloader.drop_last)
        self._batches = 0
        return self._lightning.update_dataloader(dataloader, self._sampler, mode=self._lightning.RunningStage.TRAINING)

    def _resume_mid_epoch(self, trainer: Any) -> None:
        """After a commit taken mid-epoch: let Lightning's epoch end when the samples left are trained."""
        loaded, self._loaded = self._loaded, None
        sampler = self._sampler
        if not loaded or not loaded.get("history") or sampler is None or loaded.get("epoch") != sampler.epoch:
            return
        epoch_batches = trainer.num_training_batches
        if not isinstance(epoch_batches, int):
            return
        rest = batches_in(len(sampler.shares()[sampler.rank]), self._batch_size, self._drop_last)
        resume_mid_epoch(trainer.fit_loop.epoch_loop.batch_progress, epoch_batches, rest)
