"""What a DDP comm hook costs: process CPU time per step on 2 gloo ranks, one DDP model per variant,
the variants alternated in rotating order (docs/record.md, "Overhead").

Variants: plain (DDP's C++ all-reduce), builtin (DDP's built-in C++ ALLREDUCE hook), sum (a
minimal Python hook: one all_reduce and a `then`; the gradients are summed, not averaged: for
timing only), divsum (divide, then sum, as torch's allreduce_hook), avg (ReduceOp.AVG), timer
(recorder.instrument.CollectiveTimer's hook), timerwrap (the same with the torch.distributed
wrappers installed). Prints each variant's median CPU time per step and the median over steps of
its ratio to the first variant's, minus one.

    .venv/bin/python bench/ddp_hook_cost.py plain,builtin,sum,timer,timerwrap 150
"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from bench_instrument import make_model

from recorder.instrument import CollectiveTimer, JsonlWriter, untimed_collectives

WARMUP_STEPS = 5


def _then_tensor(fut: torch.futures.Future) -> torch.Tensor:
    return fut.value()[0]


def sum_hook(state, bucket):
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(_then_tensor)


def div_sum_hook(state, bucket):
    buffer = bucket.buffer()
    buffer.div_(dist.get_world_size())
    return dist.all_reduce(buffer, async_op=True).get_future().then(_then_tensor)


def avg_hook(state, bucket):
    return dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.AVG, async_op=True).get_future().then(_then_tensor)


PYTHON_HOOKS = {"sum": sum_hook, "divsum": div_sum_hook, "avg": avg_hook}


def worker(rank: int, variants: list[str], steps: int, tmp: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=2)
    models = {}
    timers = []
    for v in variants:
        model = DDP(make_model(256, 4), bucket_cap_mb=2.0)
        if v in PYTHON_HOOKS:
            model.register_comm_hook(None, PYTHON_HOOKS[v])
        elif v == "builtin":
            model._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
        elif v in ("timer", "timerwrap"):
            timer = CollectiveTimer(JsonlWriter(Path(tmp) / f"c{rank}{v}.jsonl"), rank, torch.device("cpu"))
            model.register_comm_hook(None, timer.ddp_comm_hook)
            timers.append(timer)
            if v == "timerwrap":
                timer.install()
        elif v != "plain":
            raise SystemExit(f"unknown variant {v!r}")
        models[v] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4))
    gen = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(256, 256, generator=gen), torch.randn(256, 256, generator=gen)) for _ in range(8)]
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    n = len(variants)
    for i in range(WARMUP_STEPS + steps):
        order = variants[i % n :] + variants[: i % n]
        if (i // n) % 2:
            order = order[::-1]
        for v in order:
            model, opt = models[v]
            with untimed_collectives():
                dist.barrier()  # both ranks start the step together
            c0 = time.process_time()
            x, y = batches[i % len(batches)]
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            for timer in timers:
                timer.flush()
            if i >= WARMUP_STEPS:
                cpu[v].append(time.process_time() - c0)
    for timer in timers:
        timer.uninstall()
    if rank == 0:
        base = cpu[variants[0]]
        for v in variants:
            ratio = statistics.median(a / b for a, b in zip(cpu[v], base)) - 1
            print(
                f"{v:10s} median cpu {statistics.median(cpu[v]) * 1e3:7.2f} ms   "
                f"vs {variants[0]} (pairs) {100 * ratio:+.2f} %"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(sys.argv[1].split(","), int(sys.argv[2]), tmp), nprocs=2)
