"""What reftrain's instrumentation costs: always-on (every step) and profiler windows.

    .venv/bin/python bench/bench_reftrain.py --quick     # ~2 minutes on 2 busy cores
    .venv/bin/python bench/bench_reftrain.py             # more pairs, tighter numbers

Two gloo ranks on CPU (started through torch.distributed.run, as `reftrain
--nproc 2` does) each hold two identical copies of the same model, optimizer
and data stream:

- plain: a bare PyTorch DDP step (data, forward, backward, clip, AdamW,
  loss.item()), no hook, no timers, nothing written;
- reftrain: `reftrain.train.TrainStep.run`, the trainer's own step recorded
  by the recorder as reftrain opens it: phase timing, the comm hook and
  wrapped torch.distributed timing every collective, the metrics record
  written and flushed, collective records flushed, RSS read, the heartbeat
  note, the machine-speed canary every 5th step. Profiler off.

Steps alternate plain/reftrain, reftrain/plain, ... so each pair sees the same
machine load; a barrier (not timed) lines the ranks up before every step. The
step time of the job is the slower rank's. Printed: median step time of each
variant, overhead = median(reftrain) / median(plain) - 1, and the median of
the per-pair ratios (robust to load drifting between pairs). Both copies see
the same batches, so their losses must agree; the script checks it.

Profiler windows, separately: the reftrain step of a third copy, recorded with
a profiler schedule (wait 1, warm-up 1, active 1, repeating), so unprofiled,
warm-up and active steps interleave. Printed: median step time of each kind
(the step's own record), the active steps' overhead over unprofiled ones, and
the time to write each window's trace (the wall time of the window's last
step less its recorded time: the export and the ranks' meeting after it,
outside any step time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="40 pairs and 10 profiler windows")
    p.add_argument("--pairs", type=int, default=200, help="plain/reftrain step pairs (default 200)")
    p.add_argument("--windows", type=int, default=30, help="profiler windows (3 steps each; default 30)")
    p.add_argument("--preset", default="small", help="model preset (default: small, the demo's)")
    p.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    args = p.parse_args(argv)
    if args.quick:
        args.pairs, args.windows = 40, 10
    return args


def launch(argv: list[str]) -> None:
    """Start 2 ranks of this script through torch's launcher (the torchrun code path)."""
    import logging

    import torch.distributed.run as torchrun

    logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // 2)))
    torchrun.run(torchrun.parse_args(["--standalone", "--nproc-per-node=2", __file__, *argv]))


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import recorder
    from analyzer.ingest import formats as fmt
    from recorder.instrument import untimed_collectives
    from reftrain import data, flops, parallel
    from reftrain.config import Config, apply_set, resolve
    from reftrain.inject import Injector
    from reftrain.model import Transformer, block_parameter_count, parameter_counts
    from reftrain.train import TrainStep, _optimizer, lr_at

    warmup_pairs = 3
    total_b_steps = warmup_pairs + args.pairs + 3 * args.windows
    cfg = Config()
    for s in (
        f"model.preset={args.preset}",
        f"train.steps={total_b_steps}",
        "train.device=cpu",
        "profile.enabled=false",
        "telemetry.enabled=false",
    ):
        apply_set(cfg, s)
    cfg = resolve(cfg)
    env = parallel.init_distributed(cfg)
    rank = env.rank

    def build():
        torch.manual_seed(cfg.train.seed)
        model = parallel.apply_ddp(Transformer(cfg.model), cfg, env)
        return model, _optimizer(model, cfg)

    model_a, opt_a = build()
    model_b, opt_b = build()
    raw = Transformer(cfg.model)
    pc = parameter_counts(raw)
    m = cfg.model
    fpt = flops.flops_per_token(
        pc["non_embedding"],
        block_parameter_count(raw),
        m.n_layers,
        m.n_heads,
        m.d_model // m.n_heads,
        m.seq_len,
        m.d_ff,
        False,
    )
    peak = flops.PeakFlops(1e12, "override", "bench: MFU not reported", "fp32")
    batches_a = iter(data.build_loader(cfg, rank, 0, "cpu"))
    batches_b = iter(data.build_loader(cfg, rank, 0, "cpu"))

    out_dir = Path(tempfile.mkdtemp(prefix=f"bench-reftrain-r{rank}-"))

    def recorded(name: str, model, optimizer, profile: recorder.ProfileSchedule) -> recorder.Recorder:
        """The recorder as reftrain.train opens it (rank 0's directory under its own temporary folder)."""
        return recorder.open(
            out_dir,
            name,
            model=model,
            optimizer=optimizer,
            phase_hooks=False,
            flops=fmt.Flops.from_json(fpt.to_manifest()),
            peak_flops_per_s=fmt.PeakFlops.from_json(peak.to_manifest()),
            profile=profile,
            telemetry_interval_ms=None,
        )

    rec_b = recorded("always-on", model_b, opt_b, recorder.ProfileSchedule(enabled=False))
    step_b = TrainStep(cfg, env, model_b, opt_b, batches_b, Injector(cfg, rank, env.device), rec_b)
    params_a = [p for p in model_a.parameters() if p.requires_grad]

    def plain(step: int) -> float:
        lr = lr_at(step, cfg)
        for group in opt_a.param_groups:
            group["lr"] = lr
        x, y = next(batches_a)
        loss = model_a(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params_a, cfg.optim.grad_clip)
        opt_a.step()
        opt_a.zero_grad(set_to_none=True)
        return loss.item()

    def instrumented(step: int) -> float:
        record = step_b.run(step)
        assert record is not None
        return record["loss"]

    def timed(fn, step: int) -> tuple[float, float]:
        with untimed_collectives():
            dist.barrier()
        start = time.perf_counter()
        loss = fn(step)
        return (time.perf_counter() - start) * 1e3, loss

    plain_ms, instr_ms, mismatches = [], [], 0
    for i in range(warmup_pairs + args.pairs):
        order = (("plain", plain), ("reftrain", instrumented))
        if i % 2:
            order = order[::-1]
        result = {}
        for name, fn in order:
            result[name] = timed(fn, i)
        if i >= warmup_pairs:
            plain_ms.append(result["plain"][0])
            instr_ms.append(result["reftrain"][0])
        mismatches += result["plain"][1] != result["reftrain"][1]

    rec_b.close()

    # Profiler windows: wait 1, warm-up 1, active 1, repeating, on a third copy recorded with them.
    model_c, opt_c = build()
    schedule = recorder.ProfileSchedule(enabled=True, wait=1, warmup=1, active=1, repeat=0)
    rec_c = recorded("windows", model_c, opt_c, schedule)
    step_c = TrainStep(
        cfg, env, model_c, opt_c, iter(data.build_loader(cfg, rank, 0, "cpu")), Injector(cfg, rank, env.device), rec_c
    )
    kinds: dict[str, list[float]] = {"unprofiled": [], "warmup": [], "active": []}
    export_ms: list[float] = []
    for step in range(3 * args.windows):
        action = rec_c.profiler.action(step).name
        with untimed_collectives():
            dist.barrier()
        start = time.perf_counter()
        record = step_c.run(step)
        wall_ms = (time.perf_counter() - start) * 1e3
        assert record is not None
        kind = {"NONE": "unprofiled", "WARMUP": "warmup"}.get(action, "active")
        kinds[kind].append(record["step_time_ms"])
        if action == "RECORD_AND_SAVE":
            export_ms.append(wall_ms - record["step_time_ms"])
    traces = len(rec_c.profiler.traces)
    rec_c.close()

    mine = {
        "plain_ms": plain_ms,
        "instr_ms": instr_ms,
        "mismatches": mismatches,
        "kinds": kinds,
        "export_ms": export_ms,
        "traces": traces,
    }
    everyone: list = [None] * env.world_size
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        report(args, cfg, everyone)
    parallel.shutdown()


def _job(everyone: list[dict], get) -> list[float]:
    """Per-step job time: the slower rank's."""
    return [max(vals) for vals in zip(*(get(e) for e in everyone))]


def report(args: argparse.Namespace, cfg, everyone: list[dict]) -> None:
    plain = _job(everyone, lambda e: e["plain_ms"])
    instr = _job(everyone, lambda e: e["instr_ms"])
    med_plain, med_instr = statistics.median(plain), statistics.median(instr)
    ratios = [b / a for a, b in zip(plain, instr)]
    kinds = {k: _job(everyone, lambda e, k=k: e["kinds"][k]) for k in ("unprofiled", "warmup", "active")}
    export = _job(everyone, lambda e: e["export_ms"])
    m = cfg.model
    out = {
        "config": {
            "preset": m.preset,
            "tokens_per_rank_step": cfg.train.micro_batch_size * m.seq_len,
            "pairs": args.pairs,
            "windows": args.windows,
            "ranks": len(everyone),
            "omp_threads": int(os.environ.get("OMP_NUM_THREADS", "0")),
        },
        "always_on": {
            "plain_median_ms": med_plain,
            "reftrain_median_ms": med_instr,
            "overhead": med_instr / med_plain - 1,
            "paired_ratio_median": statistics.median(ratios),
            "loss_mismatches": sum(e["mismatches"] for e in everyone),
        },
        "profiler": {k + "_median_ms": statistics.median(v) for k, v in kinds.items()}
        | {
            "active_overhead": statistics.median(kinds["active"]) / statistics.median(kinds["unprofiled"]) - 1,
            "warmup_overhead": statistics.median(kinds["warmup"]) / statistics.median(kinds["unprofiled"]) - 1,
            # each window's active step over the unprofiled step two steps before it
            "active_paired_ratio_median": statistics.median(
                a / u for a, u in zip(kinds["active"], kinds["unprofiled"])
            ),
            "trace_export_median_ms": statistics.median(export),
            "windows": len(export),
        },
    }
    a, pr = out["always_on"], out["profiler"]
    print(
        f"\nreftrain instrumentation cost: preset {m.preset}, 2 gloo ranks, "
        f"{out['config']['tokens_per_rank_step']} tokens/rank/step, {args.pairs} interleaved step pairs"
    )
    print(f"  plain PyTorch DDP step   median {a['plain_median_ms']:8.2f} ms")
    print(f"  reftrain step (always-on) median {a['reftrain_median_ms']:8.2f} ms")
    print(
        f"  overhead {a['overhead']:+.2%} (ratio of medians)   {a['paired_ratio_median'] - 1:+.2%} (median of pair ratios)"
        f"   losses identical: {'yes' if a['loss_mismatches'] == 0 else 'NO (' + str(a['loss_mismatches']) + ')'}"
    )
    print(f"\nprofiler windows ({len(export)} windows of wait 1 / warm-up 1 / active 1):")
    print(
        f"  unprofiled {pr['unprofiled_median_ms']:8.2f} ms   warm-up {pr['warmup_median_ms']:8.2f} ms "
        f"({pr['warmup_overhead']:+.1%})   active {pr['active_median_ms']:8.2f} ms ({pr['active_overhead']:+.1%}; "
        f"{pr['active_paired_ratio_median'] - 1:+.1%} median of per-window ratios)"
    )
    print(f"  trace export (between steps) median {pr['trace_export_median_ms']:.1f} ms per window")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


def main() -> None:
    argv = sys.argv[1:]
    args = parse(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        worker(args)
    else:
        launch(argv)


if __name__ == "__main__":
    main()
