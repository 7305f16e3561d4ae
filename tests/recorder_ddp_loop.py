"""A 2-rank DDP loop on gloo recorded with the recorder, for tests/test_recorder_ranks.py.

    PYTHONPATH=. python -m torch.distributed.run --nproc-per-node 2 tests/recorder_ddp_loop.py RUNS MODE

MODE: `all` (every rank records; rank 1 spends AFTER_WINDOW_S after the profiler window's last
step, as a rank with a slow trace export would), `rank0-only` / `rank1-only` (one rank opens the
recorder, the other trains without it), `rank1-fails` (rank 1's loop raises at step 2).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import recorder
from recorder import ProfileSchedule
from tests.recorder_loops import TOKENS, TinyLM, batch

STEPS = 5
WINDOW_END = 2  # the profiler window below: step 1 warm-up, step 2 traced, its trace written after it
AFTER_WINDOW_S = 3.0


def main() -> None:
    runs, mode = Path(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(TinyLM())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    records = mode == "all" or mode == "rank1-fails" or mode == f"rank{rank}-only"

    def slow_after_the_window(record: dict) -> None:
        if record["step"] == WINDOW_END:
            time.sleep(AFTER_WINDOW_S)

    rec = (
        recorder.open(
            runs,
            name=f"ddp-{mode}",
            model=model,
            optimizer=opt,
            meet_timeout_s=5,
            profile=ProfileSchedule(wait=1, warmup=1, active=1),
            on_step=[slow_after_the_window] if mode == "all" and rank == 1 else [],
        )
        if records
        else None
    )
    for i in range(STEPS):
        x, y = batch(gen)
        if rec is not None:
            rec.step_start()
        if mode == "rank1-fails" and rank == 1 and i == 2:
            try:
                raise ValueError("rank 1 read a corrupt shard")
            except ValueError as exc:
                rec.fail(exc)
                raise
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if rec is not None:
            rec.step_end(tokens=TOKENS, loss=loss)
    if rec is not None:
        rec.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
