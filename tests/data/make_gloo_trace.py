"""Regenerate tests/data/gloo_cpu/rank{0,1}.json.gz: a real CPU-only trace
of a 2-process DDP job over gloo, written by the installed PyTorch.

    .venv/bin/torchrun --nproc-per-node 2 tests/data/make_gloo_trace.py tests/data/gloo_cpu

Two profiled steps (ProfilerStep#1, #2) of a tiny MLP with phase
annotations like reftrain's (data, forward, backward, optimizer), DDP's
bucket all-reduce and one explicit all_reduce / broadcast per step. On CPU,
PyTorch writes no record_param_comms for gloo: collectives appear as
``c10d::*`` ops on the main thread and ``gloo:*`` annotations (with the
input shape) on gloo's worker thread.
"""

import gzip
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 16)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def on_ready(prof: profile) -> None:
        tmp = os.path.join(out, f".rank{rank}.json")
        prof.export_chrome_trace(tmp)
        with open(tmp, "rb") as src, gzip.open(os.path.join(out, f"rank{rank}.json.gz"), "wb", compresslevel=9) as dst:
            dst.write(src.read())
        os.remove(tmp)

    sched = schedule(wait=0, warmup=1, active=2, repeat=1)
    with profile(
        activities=[ProfilerActivity.CPU], schedule=sched, on_trace_ready=on_ready, record_shapes=True
    ) as prof:
        for _ in range(3):
            with record_function("data"):
                x = torch.randn(32, 64)
            with record_function("forward"):
                loss = model(x).square().mean()
            with record_function("backward"):
                loss.backward()
            with record_function("optimizer"):
                opt.step()
                opt.zero_grad()
            t = torch.ones(10)
            dist.all_reduce(t)
            dist.broadcast(t, 0)
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
