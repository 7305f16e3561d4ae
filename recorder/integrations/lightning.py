"""PyTorch Lightning: ``Trainer(callbacks=[RecorderCallback("runs", tokens=...)])`` records the fit.

A thin adapter: each Lightning event is one recorder call (docs/record.md,
"PyTorch Lightning").

=============================================  ==========================================
Lightning event                                recorder call
=============================================  ==========================================
``on_train_start``                             ``recorder.open`` (every rank; the model
                                               as the strategy runs it, DDP-wrapped or not)
first ``on_train_batch_start`` of a step       ``step_start``
``on_train_batch_end`` that stepped the        ``step_end`` (tokens of the step's batches,
optimizer (``global_step`` moved)              the loss Lightning returned, summed over
                                               accumulated batches as Lightning scales them)
``on_save_checkpoint`` .. the next event       ``saving()``
``on_exception``                               ``fail``
``on_train_end``                               ``close``
=============================================  ==========================================
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import lightning.pytorch as pl

import recorder


class RecorderCallback(pl.Callback):
    """Record a Lightning fit into a run directory under ``runs_dir``.

    ``tokens(batch)``: the tokens (or samples) in one training batch on this
    rank, e.g. ``lambda batch: batch[0].numel()``; without it MFU and
    tokens/s are withheld. ``name`` and the keyword ``options`` are
    ``recorder.open``'s; ``config`` defaults to the module's ``hparams``.
    """

    def __init__(
        self,
        runs_dir: str | os.PathLike[str],
        tokens: Callable[[Any], int] | None = None,
        name: str | None = None,
        config: Any = None,
        **options: Any,
    ) -> None:
        self.runs_dir, self.tokens, self.name, self.config, self.options = runs_dir, tokens, name, config, options
        self.rec: recorder.Recorder | None = None
        self._step_tokens: int | None = None
        self._step_loss: Any = None
        self._global_step = 0
        self._save: AbstractContextManager[None] | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        config = self.config if self.config is not None else dict(pl_module.hparams)
        self.rec = recorder.open(
            self.runs_dir,
            name=self.name,
            config=config,
            model=trainer.strategy.model,
            optimizer=trainer.optimizers[0] if trainer.optimizers else None,
            steps=trainer.max_steps if trainer.max_steps > 0 else None,
            **self.options,
        )

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._saved()
        if self.rec is None:
            return
        if self._step_tokens is None and self._step_loss is None:
            self._global_step = trainer.global_step
            self._step_tokens, self._step_loss = 0, 0.0
            self.rec.step_start()
        if self.tokens is not None and self._step_tokens is not None:
            self._step_tokens += int(self.tokens(batch))

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.rec is None or self._step_loss is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self._step_loss = self._step_loss + loss.detach()
        if trainer.global_step != self._global_step:  # the optimizer stepped: the step is complete
            self.rec.step_end(
                tokens=self._step_tokens if self.tokens is not None else None,
                loss=self._step_loss if loss is not None else None,
            )
            self._step_tokens = self._step_loss = None

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Lightning calls this just before it writes the checkpoint and has no event after the
        # write: the save's stall ends at the next event the loop reaches.
        if self.rec is not None and self._save is None:
            self._save = self.rec.saving()
            self._save.__enter__()

    def _saved(self) -> None:
        if self._save is not None:
            save, self._save = self._save, None
            save.__exit__(None, None, None)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._saved()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._save = None  # the failed save is not a stall to record
        if self.rec is not None:
            self.rec.fail(exception)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._saved()
        if self.rec is not None:
            self.rec.close()
