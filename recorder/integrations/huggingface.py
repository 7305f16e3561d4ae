"""Hugging Face ``transformers``: ``Trainer(..., callbacks=[RecorderCallback("runs")])`` records the training.

A thin adapter: each Trainer event is one recorder call (docs/record.md,
"Hugging Face Trainer").

=============================================  ==========================================
Trainer event                                  recorder call
=============================================  ==========================================
``on_train_begin``                             ``recorder.open`` (every process; config:
                                               the ``TrainingArguments``)
``on_step_begin``                              ``step_start``
``on_step_end``                                ``step_end`` (tokens: this process's share of
                                               ``state.num_input_tokens_seen``'s growth; loss:
                                               the model outputs' ``loss``, mean over the
                                               step's micro-batches)
``on_step_end`` with ``should_save`` ..        ``saving()`` (the Trainer saves after its
``on_save``                                    step-end logging)
``on_train_end``                               ``close``
=============================================  ==========================================

Tokens need ``TrainingArguments(include_num_input_tokens_seen=True)``
(the Trainer then counts them); without it MFU and tokens/s are withheld.
The Trainer has no event for an exception: wrap ``trainer.train()`` in
``with callback.failing():`` to mark the run failed with it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

import recorder


class RecorderCallback(TrainerCallback):
    """Record a ``transformers.Trainer`` run into a run directory under ``runs_dir``.

    ``name`` and the keyword ``options`` are ``recorder.open``'s; ``config``
    defaults to the ``TrainingArguments`` as a dict.
    """

    def __init__(
        self, runs_dir: str | os.PathLike[str], name: str | None = None, config: Any = None, **options: Any
    ) -> None:
        self.runs_dir, self.name, self.config, self.options = runs_dir, name, config, options
        self.rec: recorder.Recorder | None = None
        self._tokens_seen = 0
        self._losses: list[torch.Tensor] = []
        self._hook: Any = None
        self._save: AbstractContextManager[None] | None = None

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        **kwargs: Any,
    ) -> None:
        config = self.config if self.config is not None else args.to_dict()
        # The Trainer hands over accelerate's AcceleratedOptimizer, a wrapper that holds no hooks of its own.
        optimizer = getattr(optimizer, "optimizer", optimizer)
        self.rec = recorder.open(
            self.runs_dir,
            name=self.name,
            config=config,
            model=model,
            optimizer=optimizer,
            steps=state.max_steps if state.max_steps > 0 else None,
            **self.options,
        )
        self._tokens_seen = state.num_input_tokens_seen
        if model is not None:
            self._hook = model.register_forward_hook(self._output_loss)

    def _output_loss(self, module: Any, args: Any, output: Any) -> None:
        loss = getattr(output, "loss", None)
        if isinstance(loss, torch.Tensor) and module.training:
            self._losses.append(loss.detach())

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.rec is not None:
            self._losses = []
            self.rec.step_start()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.rec is None:
            return
        seen = state.num_input_tokens_seen - self._tokens_seen  # summed over processes by the Trainer
        self._tokens_seen = state.num_input_tokens_seen
        tokens = seen // max(1, args.world_size) if args.include_num_input_tokens_seen != "no" else None
        loss = torch.stack(self._losses).mean() if self._losses else None
        self.rec.step_end(tokens=tokens, loss=loss)
        if control.should_save:
            self._save = self.rec.saving()
            self._save.__enter__()

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self._save is not None:
            save, self._save = self._save, None
            save.__exit__(None, None, None)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.rec is not None:
            self.rec.close()

    @contextmanager
    def failing(self) -> Iterator[None]:
        """``with callback.failing(): trainer.train()``: an exception marks the run failed, then goes on."""
        try:
            yield
        except BaseException as exc:
            if self.rec is not None and not self.rec.closed:
                self.rec.fail(exc)
            raise
