"""Small training loops recorded with the recorder, shared by tests/test_recorder_*.py.

The model sleeps a fixed time in its forward pass and the loop a fixed time
before each step (the "data"), so that the phases the recorder measures have
known lower bounds far beyond any timer noise (a sleep lasts at least its
duration however busy the machine is).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

import recorder
from analyzer.ingest.formats import Flops

VOCAB, SEQ, WIDTH, BATCH = 64, 8, 16, 4
TOKENS = BATCH * SEQ
FORWARD_SLEEP_S = 0.02
DATA_SLEEP_S = 0.03
# A made-up FLOP count and peak: MFU is then exactly tokens * FLOPS_PER_TOKEN / (step_s * PEAK).
FLOPS_PER_TOKEN = 1.0e6
PEAK = 1.0e12


class TinyLM(torch.nn.Module):
    """Embedding -> linear -> logits; forward sleeps FORWARD_SLEEP_S."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, WIDTH)
        self.out = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(FORWARD_SLEEP_S)
        return self.out(self.emb(x))


def batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    return x, torch.roll(x, -1, dims=1)


def train(runs: Path, steps: int, /, *, name: str = "plain", on_step: Any = None, **options: Any) -> recorder.Recorder:
    """A plain loop of `steps` steps recorded into runs/name; `on_step(rec, i)` runs before step i.

    `options` are recorder.open's (`steps=` among them: the steps the loop tells the recorder it runs)."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    options.setdefault("peak_flops_per_s", PEAK)
    options.setdefault("flops", Flops(per_token=FLOPS_PER_TOKEN, formula="test: a made-up count"))
    with recorder.open(
        runs, name=name, config={"lr": 0.1, "steps": steps}, model=model, optimizer=opt, **options
    ) as rec:
        for i in range(steps):
            if on_step is not None:
                on_step(rec, i)
            time.sleep(DATA_SLEEP_S)
            x, y = batch(gen)
            with rec.step(tokens=TOKENS) as s:
                logits = model(x)
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
                loss.backward()
                opt.step()
                opt.zero_grad()
                s.loss = loss
    return rec
