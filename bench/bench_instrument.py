"""Overhead of always-on instrumentation: plain DDP vs reftrain's instrumented step, or vs the recorder.

Two gloo ranks on CPU train the same model on the same batches in two variants,
interleaved in alternating order (A B, B A, ...) so machine load drifts hit both:

  plain         DDP with its built-in C++ all-reduce, nothing else.
  instrumented  (--against reftrain, the default) DDP + CollectiveTimer comm hook
                (and torch.distributed wrappers installed) + PhaseTimer around
                data/forward/backward/optimizer + per-step metrics JSONL record +
                collective flush + RSS read: what reftrain does on every step
                outside profiler windows.
  recorder      (--against recorder) the same plain loop with `recorder.open(...)`
                and `with rec.step(tokens=N) as s: ...; s.loss = loss` around each
                step: the recorder's hooks, comm hook, metrics record, heartbeats
                and its per-step preemption agreement (profiler windows off: the
                profiled steps are slower by design and left out of steady state).
  recorder-no-ddp-hook  (--against recorder-no-ddp-hook) the same, opened with
                `ddp_comm_hook=False`: DDP keeps its C++ all-reduce and its bucket
                all-reduces go untimed.
  torch-python-hook  (--against torch-python-hook) DDP with torch's own Python
                comm hook (`default_hooks.allreduce_hook`) and nothing else: what
                any Python comm hook costs, whatever it records.

Step time is rank 0's host wall time per optimizer step. Reported: median
step time per variant over all measured steps, overhead = median_instr /
median_plain - 1, and the median over step pairs of instrumented/plain - 1
(the two steps of a pair run back to back, so it is robust to load drift on a
shared machine); the same paired median of rank 0's process CPU time per step
(`time.process_time`, all threads): on a machine whose cores are shared, time
spent descheduled is wall time but not CPU time, so this figure is the work the
instrumentation adds, far less disturbed by neighbours. Also reported: the host cost of the instrumentation calls
alone, timed in a tight loop, as a share of the plain step: a low-noise
floor for the overhead (it leaves out the hook's future callback and the
effects on caches and scheduling, which the paired measurement includes).

    .venv/bin/python bench/bench_instrument.py --quick
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from recorder.instrument import CollectiveTimer, JsonlWriter, PhaseTimer, process_memory_bytes, untimed_collectives

WORLD = 2


class Block(torch.nn.Module):
    """Pre-norm residual MLP block (the MLP half of a transformer layer)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def make_model(width: int, layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[Block(width) for _ in range(layers)], torch.nn.Linear(width, width))


def plain_step(model, opt, batch, set_to_none: bool = True) -> None:
    x, y = batch
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=set_to_none)


class Instrumented:
    """The per-step work reftrain's loop adds around the same training step."""

    def __init__(self, model, opt, rank: int, out: Path, tokens_per_step: int, set_to_none: bool) -> None:
        self.model, self.opt, self.rank, self.set_to_none = model, opt, rank, set_to_none
        self.coll_writer = JsonlWriter(out / "collectives" / f"rank{rank}.jsonl")
        self.metrics = JsonlWriter(out / "metrics" / f"rank{rank}.jsonl")
        self.timer = CollectiveTimer(self.coll_writer, rank=rank, device=torch.device("cpu"))
        self.phases = PhaseTimer(torch.device("cpu"), phases=("data", "forward", "backward", "optimizer"))
        model.register_comm_hook(state=None, hook=self.timer.ddp_comm_hook)
        self.tokens = tokens_per_step
        self.step_index = 0

    def step(self, batch) -> None:
        step = self.step_index
        self.timer.set_step(step)
        self.phases.start_step()
        with self.phases.phase("data"):
            x, y = batch
        with self.phases.phase("forward"):
            loss = torch.nn.functional.mse_loss(self.model(x), y)
        with self.phases.phase("backward"):
            loss.backward()
        with self.phases.phase("optimizer"):
            self.opt.step()
            self.opt.zero_grad(set_to_none=self.set_to_none)
        times = self.phases.end_step()
        mem_bytes, mem_kind = process_memory_bytes(torch.device("cpu"))
        step_s = times["step_time_ms"] / 1e3
        self.metrics.write(
            {
                "step": step,
                "rank": self.rank,
                "loss": loss.detach().item(),
                "step_time_ms": times["step_time_ms"],
                "data_wait_ms": times["data_ms"],
                "forward_ms": times["forward_ms"],
                "backward_ms": times["backward_ms"],
                "optimizer_ms": times["optimizer_ms"],
                "grad_sync_ms": 0.0,
                "comm_ms": self.timer.step_comm_ms(step),
                "tokens": self.tokens,
                "tokens_per_s": self.tokens / step_s,
                "mfu": 0.0,
                "hfu": 0.0,
                "mem_bytes": mem_bytes,
                "mem_kind": mem_kind,
                "profiled": False,
                "time_ns": time.time_ns(),
            }
        )
        self.timer.flush()
        self.metrics.flush()
        self.step_index += 1

    def close(self) -> None:
        self.timer.flush(wait=True)
        self.coll_writer.close()
        self.metrics.close()


class Recorded:
    """The plain loop with the recorder around each step (what docs/record.md tells a user to add)."""

    def __init__(
        self, model, opt, out: Path, tokens_per_step: int, set_to_none: bool, ddp_comm_hook: bool = True
    ) -> None:
        import recorder

        self.model, self.opt, self.set_to_none, self.tokens = model, opt, set_to_none, tokens_per_step
        self.rec = recorder.open(
            out,
            name="bench",
            model=model,
            optimizer=opt,
            profile=recorder.ProfileSchedule(enabled=False),
            ddp_comm_hook=ddp_comm_hook,
        )

    def step(self, batch) -> None:
        with self.rec.step(tokens=self.tokens) as s:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=self.set_to_none)
            s.loss = loss

    def close(self) -> None:
        self.rec.close()


class PythonHooked:
    """The plain step on a DDP model with a Python comm hook registered, nothing recorded."""

    def __init__(self, model, opt, set_to_none: bool) -> None:
        self.model, self.opt, self.set_to_none = model, opt, set_to_none

    def step(self, batch) -> None:
        plain_step(self.model, self.opt, batch, self.set_to_none)

    def close(self) -> None:
        pass


def host_cost_us(tmp: Path, rank: int, collectives_per_step: int, repeats: int = 2000) -> tuple[float, float]:
    """Host time of the instrumentation calls alone, in a tight loop: (phases + memory +
    metrics record per step, collective bookkeeping per step), both in microseconds.

    The collective part uses CollectiveTimer's internal begin/end (what the hook
    and the wrappers call around each collective), so the collective itself is
    not in the time; then step_comm_ms and flush, as the loop calls them.
    """
    writer = JsonlWriter(tmp / f"cost-collectives{rank}.jsonl")
    timer = CollectiveTimer(writer, rank=rank, device=torch.device("cpu"))
    group = dist.group.WORLD
    t0 = time.perf_counter()
    for i in range(repeats):
        timer.set_step(i)
        for _ in range(collectives_per_step):
            timer._end_now(timer._begin("all_reduce", 4 << 20, "float32", group))
        timer.step_comm_ms(i)
        timer.flush()
    collectives_us = (time.perf_counter() - t0) / repeats * 1e6
    writer.close()
    metrics = JsonlWriter(tmp / f"cost-metrics{rank}.jsonl")
    cpu = torch.device("cpu")
    phases = PhaseTimer(cpu, phases=("data", "forward", "backward", "optimizer"))
    t0 = time.perf_counter()
    for i in range(repeats):
        phases.start_step()
        for name in ("data", "forward", "backward", "optimizer"):
            with phases.phase(name):
                pass
        times = phases.end_step()
        mem_bytes, mem_kind = process_memory_bytes(cpu)
        metrics.write(
            {
                "step": i,
                "rank": rank,
                "loss": 1.0,
                **times,
                "mem_bytes": mem_bytes,
                "mem_kind": mem_kind,
                "tokens": 1,
                "tokens_per_s": 1.0,
                "mfu": 0.0,
                "hfu": 0.0,
                "profiled": False,
                "time_ns": time.time_ns(),
            }
        )
        metrics.flush()
    step_us = (time.perf_counter() - t0) / repeats * 1e6
    metrics.close()
    return step_us, collectives_us


def worker(rank: int, args: argparse.Namespace, tmp: str) -> None:
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=WORLD)
    ddp_kwargs = {"bucket_cap_mb": args.bucket_cap_mb, "gradient_as_bucket_view": args.grad_as_bucket_view}
    plain = DDP(make_model(args.width, args.layers), **ddp_kwargs)
    instr_model = DDP(make_model(args.width, args.layers), **ddp_kwargs)
    set_to_none = not args.grad_as_bucket_view
    opt_plain = torch.optim.AdamW(plain.parameters(), lr=1e-4)
    opt_instr = torch.optim.AdamW(instr_model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(rank)
    batches = [
        (torch.randn(args.batch, args.width, generator=gen), torch.randn(args.batch, args.width, generator=gen))
        for _ in range(8)
    ]
    if args.against in ("recorder", "recorder-no-ddp-hook"):
        instr = Recorded(
            instr_model,
            opt_instr,
            Path(tmp) / "runs",
            tokens_per_step=args.batch,
            set_to_none=set_to_none,
            ddp_comm_hook=args.against == "recorder",
        )
        colls_file = instr.rec.run_dir / "collectives" / f"rank{rank}.jsonl"
    elif args.against == "torch-python-hook":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        instr_model.register_comm_hook(state=None, hook=allreduce_hook)
        instr = PythonHooked(instr_model, opt_instr, set_to_none)
        colls_file = None
    else:
        instr = Instrumented(
            instr_model, opt_instr, rank, Path(tmp) / "run", tokens_per_step=args.batch, set_to_none=set_to_none
        )
        instr.timer.install()
        colls_file = Path(tmp) / "run" / "collectives" / f"rank{rank}.jsonl"
    run = {"plain": lambda b: plain_step(plain, opt_plain, b, set_to_none), "instrumented": instr.step}
    times_ms: dict[str, list[float]] = {"plain": [], "instrumented": []}
    pair_ratios = []
    cpu_pair_ratios = []
    # Steps alternate A B / B A: the two steps of a pair see the same machine
    # load, so the paired ratio cancels drift that a busy machine adds.
    for i in range(args.warmup_steps + args.steps):
        batch = batches[i % len(batches)]
        order = ("plain", "instrumented") if i % 2 == 0 else ("instrumented", "plain")
        pair, cpu = {}, {}
        for variant in order:
            with untimed_collectives():  # the bench's own sync is not a training collective
                dist.barrier()  # both ranks start the step together
            t0, c0 = time.perf_counter(), time.process_time()
            run[variant](batch)
            pair[variant] = (time.perf_counter() - t0) * 1e3
            cpu[variant] = time.process_time() - c0
        if i >= args.warmup_steps:
            for variant, ms in pair.items():
                times_ms[variant].append(ms)
            pair_ratios.append(pair["instrumented"] / pair["plain"])
            cpu_pair_ratios.append(cpu["instrumented"] / cpu["plain"])
    if args.against == "reftrain":
        instr.timer.uninstall()
    instr.close()
    n_records = sum(1 for _ in open(colls_file)) if colls_file is not None else 0
    buckets = len(plain._get_ddp_logging_data().get("rebuilt_bucket_sizes", "").split(","))
    step_us, collectives_us = host_cost_us(Path(tmp), rank, collectives_per_step=buckets)
    if rank == 0:
        med_plain = statistics.median(times_ms["plain"])
        med_instr = statistics.median(times_ms["instrumented"])
        result = {
            "against": args.against,
            "world_size": WORLD,
            "params": sum(p.numel() for p in plain.parameters()),
            "buckets": buckets,
            "steps_per_variant": args.steps,
            "median_step_ms_plain": round(med_plain, 3),
            "median_step_ms_instrumented": round(med_instr, 3),
            "overhead_ratio": round(med_instr / med_plain - 1, 4),
            "median_paired_overhead_ratio": round(statistics.median(pair_ratios) - 1, 4),
            "median_paired_cpu_overhead_ratio": round(statistics.median(cpu_pair_ratios) - 1, 4),
            "collective_records_rank0": n_records,
            "host_cost_us_per_step": round(step_us + collectives_us, 2),
        }
        host_share = (step_us + collectives_us) / (med_plain * 1e3)
        print(
            f"model: {result['params'] / 1e6:.2f} M params, {result['buckets']} DDP buckets, "
            f"batch {args.batch}, gradient_as_bucket_view={args.grad_as_bucket_view}, "
            f"{WORLD} ranks gloo, {args.steps} steps per variant, alternating; plain vs {args.against}"
        )
        print(f"median step time  plain        {med_plain:8.3f} ms")
        print(f"median step time  {args.against:<12} {med_instr:8.3f} ms")
        print(f"overhead (median step)         {100 * result['overhead_ratio']:+.2f} %")
        print(f"overhead (median of pairs)     {100 * result['median_paired_overhead_ratio']:+.2f} %")
        print(
            f"CPU-time overhead (pairs)      {100 * result['median_paired_cpu_overhead_ratio']:+.2f} %  "
            "(rank 0's process CPU time per step: the work added, whatever the neighbours' load)"
        )
        print(
            f"host cost of the calls alone   {step_us:.0f} us (phases, memory, metrics) + {collectives_us:.0f} us "
            f"({buckets} collective records, flush) per step = {100 * host_share:.3f} % of the plain step"
        )
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="60 measured steps per variant (under a minute)")
    p.add_argument("--steps", type=int, default=300, help="measured steps per variant")
    p.add_argument("--warmup-steps", type=int, default=10, help="unmeasured leading step pairs")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument(
        "--batch",
        type=int,
        default=256,
        help="rows (tokens) per rank per step; small batches exaggerate the hook's per-parameter cost",
    )
    p.add_argument("--bucket-cap-mb", type=float, default=2.0, help="small: several buckets, more hook calls")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument(
        "--grad-as-bucket-view",
        action="store_true",
        help="DDP gradient_as_bucket_view=True in both variants (zero_grad keeps grads)",
    )
    p.add_argument(
        "--against",
        choices=("reftrain", "recorder", "recorder-no-ddp-hook", "torch-python-hook"),
        default="reftrain",
        help="what plain DDP is compared with: reftrain's instrumented step, the recorder in a plain loop "
        "(with or without its DDP comm hook), or torch's own Python comm hook alone",
    )
    p.add_argument("--json", help="also write the result as JSON here")
    args = p.parse_args(argv)
    if args.quick:
        args.steps = 60
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(args, tmp), nprocs=WORLD, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
