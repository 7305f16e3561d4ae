"""Token batches: a deterministic synthetic stream or a uint16 token file, through a real DataLoader.

Every micro-batch is addressed by (seed, rank, index) with index = step *
grad_accum + micro, and its tokens come from a random generator seeded by
exactly those three numbers. So the same seed, rank and step give the same
tokens whatever the world size, the number of workers or where a resumed run
starts. Each dataset item is a whole micro-batch (the DataLoader runs with
batch_size=None), so workers do real work per item and a slow source shows
up as real data-wait time.

Loader workers ignore SIGTERM and SIGINT (see :func:`build_loader`): a stop
is the training process's to decide, and it shuts its workers down itself.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from reftrain.config import Config, check_token_file, model_shape
from reftrain.errors import ReftrainError
from reftrain.lifeline import die_with_parent

# Synthetic text: each token follows its predecessor through a fixed random
# permutation of the vocabulary (a "bigram" the model can learn) except with
# this probability, where a uniformly random token is drawn instead. The
# entropy floor is then about -(1-p)ln(1-p) - p ln(p/V) nats per token.
SYNTHETIC_NOISE = 0.1


def _rng(seed: int, rank: int, index: int) -> np.random.Generator:
    # SeedSequence mixes the three numbers into independent streams.
    return np.random.default_rng(np.random.SeedSequence([seed, rank, index]))


class SyntheticTokens(Dataset):
    """Micro-batch `index` of one rank: (inputs, targets), int64 of shape (B, T)."""

    def __init__(
        self,
        seed: int,
        rank: int,
        micro_batch_size: int,
        seq_len: int,
        vocab_size: int,
        length: int,
        delay_ms: float = 0.0,
    ) -> None:
        self.seed, self.rank = seed, rank
        self.shape = (micro_batch_size, seq_len + 1)
        self.vocab_size = vocab_size
        self.length = length
        self.delay_s = delay_ms / 1e3
        # Same permutation on every rank: one language, different samples.
        self.successor = np.random.default_rng(np.random.SeedSequence([seed])).permutation(vocab_size)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s:
            time.sleep(self.delay_s)
        rng = _rng(self.seed, self.rank, index)
        b, t1 = self.shape
        noise = rng.random((b, t1)) < SYNTHETIC_NOISE
        random_tokens = rng.integers(0, self.vocab_size, size=(b, t1))
        tokens = np.empty((b, t1), dtype=np.int64)
        tokens[:, 0] = random_tokens[:, 0]
        for i in range(1, t1):
            tokens[:, i] = np.where(noise[:, i], random_tokens[:, i], self.successor[tokens[:, i - 1]])
        batch = torch.from_numpy(tokens)
        return batch[:, :-1], batch[:, 1:]


class TokenFile(Dataset):
    """Micro-batches of random windows from a flat uint16 token file (nanoGPT's .bin layout)."""

    def __init__(
        self,
        path: Path,
        seed: int,
        rank: int,
        micro_batch_size: int,
        seq_len: int,
        vocab_size: int,
        length: int,
        delay_ms: float = 0.0,
    ) -> None:
        self.path = Path(path)
        self.n_tokens = check_token_file(self.path, seq_len)
        self.seed, self.rank = seed, rank
        self.micro_batch_size, self.seq_len = micro_batch_size, seq_len
        self.vocab_size = vocab_size
        self.length = length
        self.delay_s = delay_ms / 1e3
        self._data: np.memmap | None = None  # opened lazily, in each worker process

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s:
            time.sleep(self.delay_s)
        if self._data is None:
            self._data = np.memmap(self.path, dtype=np.uint16, mode="r")
        rng = _rng(self.seed, self.rank, index)
        starts = rng.integers(0, self.n_tokens - self.seq_len - 1, size=self.micro_batch_size)
        rows = np.stack([self._data[s : s + self.seq_len + 1] for s in starts]).astype(np.int64)
        batch = torch.from_numpy(rows)
        return batch[:, :-1], batch[:, 1:]


class _Range(torch.utils.data.Sampler[int]):
    """Indices start..stop-1 in order (resume starts mid-stream)."""

    def __init__(self, start: int, stop: int) -> None:
        self.start, self.stop = start, stop

    def __iter__(self):
        return iter(range(self.start, self.stop))

    def __len__(self) -> int:
        return self.stop - self.start


def build_dataset(cfg: Config, rank: int) -> Dataset:
    """The dataset of this rank's micro-batches for the whole run (cfg resolved)."""
    m, t, d = model_shape(cfg.model), cfg.train, cfg.data
    length = t.steps * t.grad_accum
    if d.path is None:
        return SyntheticTokens(t.seed, rank, t.micro_batch_size, m.seq_len, m.vocab_size, length, d.delay_ms)
    return TokenFile(Path(d.path), t.seed, rank, t.micro_batch_size, m.seq_len, m.vocab_size, length, d.delay_ms)


# The signals a scheduler or Ctrl-C sends to stop a job (the recorder handles them in the rank).
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def _shield_worker(rank_pid: int, worker_id: int) -> None:
    """A loader worker's first act: ignore the stop signals, then let them through again.

    torchelastic's agent forwards a SIGTERM to each rank's whole process group
    (``os.killpg``), and Slurm signals every process of a job step, so the
    workers get it too. A worker killed by it makes the rank's next batch fail
    ("DataLoader worker (pid ...) exited unexpectedly") before the rank can
    finish its step and save. The signals are blocked in the rank while the
    workers fork (:func:`_stop_signals_blocked`), so none is lost or fatal
    before this runs; one that arrived in between is discarded when ignored.
    """
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    die_with_parent(rank_pid)  # a worker whose rank is gone has nobody to feed


@contextlib.contextmanager
def _stop_signals_blocked():
    """Hold SIGTERM/SIGINT pending in this thread (the workers fork from it and inherit the mask).

    On leaving, a signal that arrived meanwhile is delivered to the rank's own handler."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class ShieldedLoader(DataLoader):
    """A DataLoader whose worker processes start shielded from the stop signals (:func:`_shield_worker`)."""

    def __iter__(self):
        if self.num_workers == 0:
            return super().__iter__()
        with _stop_signals_blocked():  # the workers fork here (persistent_workers is off)
            return super().__iter__()


def build_loader(cfg: Config, rank: int, start_step: int, device_type: str) -> DataLoader:
    """A DataLoader yielding this rank's micro-batches from `start_step` to the end, in order.

    pin_memory applies on CUDA only (there is nothing to pin for on CPU). Its
    workers ignore SIGTERM and SIGINT and die with the rank (:func:`_shield_worker`).
    """
    d, t = cfg.data, cfg.train
    dataset = build_dataset(cfg, rank)
    sampler = _Range(start_step * t.grad_accum, t.steps * t.grad_accum)
    return ShieldedLoader(
        dataset,
        batch_size=None,
        sampler=sampler,
        num_workers=d.num_workers,
        pin_memory=d.pin_memory and device_type == "cuda",
        prefetch_factor=d.prefetch_factor if d.num_workers > 0 else None,
        persistent_workers=False,
        worker_init_fn=functools.partial(_shield_worker, os.getpid()) if d.num_workers > 0 else None,
    )


def check_batch(targets: torch.Tensor, vocab_size: int, source: str) -> None:
    """Fail with one line when a token id is outside the model's vocabulary."""
    top = int(targets.max())
    if top >= vocab_size:
        raise ReftrainError(
            f"data.path: {source}: token id {top} >= model.vocab_size={vocab_size}; "
            "set model.vocab_size to the tokenizer's size"
        )
