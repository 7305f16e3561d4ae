"""GPU acceptance check: reftrain on CUDA, its traces and telemetry, and three FLOP counts that must agree.

usage: .venv/bin/python bench/gpu_check.py [--dry-run] [--out DIR] [--summary FILE]

On one GPU (an H100 or H200; under 8 minutes), three one-rank reftrain runs
in this process:

* ``ddp``: DDP, fp32 (TF32 matmuls);
* ``fsdp2-bf16``: FSDP2 with bf16 mixed precision;
* ``compile``: DDP with every block ``torch.compile``d (inductor).

Each is profiled (CUDA kernels in the trace) with NVML telemetry on. Then,
per run: ``analyzer report RUN --json`` (the CLI, in this process) must
succeed; the trace must hold CUDA kernels and ``telemetry/`` samples; and
the model FLOPs per optimizer step, counted three ways, must agree within
1 %:

* **manifest**: ``run.json``'s ``flops.per_token x tokens_per_step``
  (PaLM's 6N + 12LHQT, reftrain/flops.py), the numerator of the MFU that
  reftrain logs and the report shows with source ``manifest``;
* **trace shapes**: the analyzer's count from the trace's op shapes
  (:func:`analyzer.metrics.mfu.rank_flops_from_shapes`, median over the
  profiled steps), the numerator of the MFU of foreign traces;
* **FlopCounterMode**: ``torch.utils.flop_counter`` counting one training
  step (forward and backward of every micro-batch) of the same model,
  built from the run's resolved config. The manifest is compared with it
  in PaLM's convention for attention's backward (2x the forward, torch
  counts 2.5x: :func:`palm_attention`), the trace shapes as it is.

With the same step time and peak, MFUs compare as their FLOPs do, so the
1 % bound on FLOPs is the bound on the three MFUs. One JSON summary
(``--summary``, default ``OUT/gpu_check.json``) holds every figure; the
exit status is 0 when every check passed, 1 otherwise.

``--dry-run`` runs the same on the CPU, with everything but the CUDA calls:
gloo instead of NCCL, a tiny model, ``torch.compile`` with the aot_eager
backend (inductor's C++ code generation takes minutes on a CPU), no kernels
or telemetry expected (the telemetry note must say why). ``make test`` runs
it (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SCHEMA = "bench.gpu_check/1"
FLOPS_BOUND = 0.01  # relative, each count against FlopCounterMode's


@dataclass(frozen=True)
class Case:
    """One reftrain run: its name and the config keys it sets (``--set`` syntax)."""

    name: str
    sets: tuple[str, ...]
    strategy: str = "ddp"


def cases(dry_run: bool) -> list[Case]:
    """The three runs; on a CPU, compile with aot_eager (module docstring)."""
    backend = "aot_eager" if dry_run else "inductor"
    return [
        Case("ddp", ("train.dtype=fp32",)),
        Case("fsdp2-bf16", ("train.dtype=bf16",), strategy="fsdp"),
        Case("compile", ("train.dtype=fp32", "train.compile=true", f"train.compile_backend={backend}")),
    ]


def common_args(dry_run: bool, runs_dir: Path) -> list[str]:
    """reftrain flags every run shares: one rank, a short profiled window, telemetry on."""
    if dry_run:
        size = [
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--steps",
            "6",
            "--set",
            "profile.wait=1",
            "--set",
            "train.micro_batch_size=2",
        ]
    else:
        size = [
            "--device",
            "cuda",
            "--preset",
            "125m",
            "--steps",
            "10",
            "--set",
            "profile.wait=3",
            "--set",
            "train.micro_batch_size=4",
        ]
    return size + [
        "--runs-dir",
        str(runs_dir),
        "--set",
        "profile.warmup=1",
        "--set",
        "profile.active=2",
        "--set",
        "data.num_workers=0",
        "--set",
        "train.warmup_steps=1",
        "--set",
        "telemetry.enabled=true",
    ]


@dataclass
class CaseResult:
    """What one run gave; ``checks`` maps check name -> passed, ``problems`` says why a check failed."""

    name: str
    run_dir: str | None = None
    wall_s: float = 0.0
    reftrain_rc: int | None = None
    report_rc: int | None = None
    n_kernels: int | None = None
    n_host_ops: int | None = None
    telemetry_samples: int | None = None
    telemetry_note: str | None = None
    flops_per_step: dict[str, float | None] = field(default_factory=dict)
    rel_diff_vs_flop_counter: dict[str, float | None] = field(default_factory=dict)
    mfu: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(self.checks.values())


def run_case(case: Case, common: list[str], dry_run: bool) -> CaseResult:
    """Train, report and count one case (module docstring)."""
    from reftrain.cli import main as reftrain_main

    res = CaseResult(case.name)
    start = time.perf_counter()
    runs_dir = Path(common[common.index("--runs-dir") + 1])
    run_dir = runs_dir / case.name
    argv = (
        common + ["--run-name", case.name, "--strategy", case.strategy] + [a for s in case.sets for a in ("--set", s)]
    )
    res.reftrain_rc = _quiet(reftrain_main, argv)
    res.checks["reftrain exits 0"] = res.reftrain_rc == 0
    if res.reftrain_rc != 0 or not run_dir.is_dir():
        res.problems.append(f"reftrain {' '.join(argv)} exited {res.reftrain_rc}")
        res.wall_s = time.perf_counter() - start
        return res
    res.run_dir = str(run_dir)
    report_json = run_dir / "report.json"
    from analyzer.cli import main as analyzer_main

    res.report_rc = _quiet(analyzer_main, ["report", str(run_dir), "--json", str(report_json)])
    res.checks["analyzer report exits 0"] = res.report_rc == 0
    check_trace_and_telemetry(res, run_dir, dry_run)
    count_flops(res, run_dir, report_json)
    res.wall_s = time.perf_counter() - start
    return res


def _quiet(main: Any, argv: list[str]) -> int:
    """``main(argv)`` with its stdout kept out of this script's (the summary is the output)."""
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            return int(main(argv) or 0)
        except SystemExit as exc:
            return int(exc.code or 0)


def check_trace_and_telemetry(res: CaseResult, run_dir: Path, dry_run: bool) -> None:
    """CUDA kernels in the profiled trace and NVML samples on a GPU; on a CPU, host ops and the telemetry note."""
    from analyzer.ingest.load import load_traces

    traces = sorted((run_dir / "traces").rglob("*.json.gz"))
    ts = load_traces(traces, cache=False)
    events = ts.events()
    kinds = events["kind"].astype(str)
    res.n_kernels = int((kinds == "compute").sum())
    res.n_host_ops = int((kinds == "cpu_op").sum())
    manifest = json.loads((run_dir / "run.json").read_text())
    res.telemetry_note = manifest.get("telemetry_note")
    samples = [p for p in (run_dir / "telemetry").glob("*")] if (run_dir / "telemetry").is_dir() else []
    res.telemetry_samples = sum(sum(1 for _ in open(p)) for p in samples if p.is_file())
    if dry_run:
        res.checks["trace has host ops with shapes"] = bool(res.n_host_ops > 0 and events["input_dims"].notna().any())
        res.checks["telemetry says why it did not sample"] = bool(res.telemetry_note)
    else:
        res.checks["trace has CUDA kernels"] = res.n_kernels > 0
        res.checks["NVML telemetry sampled"] = res.telemetry_samples > 0


def count_flops(res: CaseResult, run_dir: Path, report_json: Path) -> None:
    """The three FLOP counts per optimizer step and the MFUs the report shows (module docstring)."""
    manifest = json.loads((run_dir / "run.json").read_text())
    manifest_flops = (
        float(manifest["flops"]["per_token"]) * float(manifest["tokens_per_step"]) / int(manifest["world_size"])
    )
    shapes = trace_shape_flops(run_dir)
    counter, counter_palm = flop_counter_flops(manifest["config"])
    res.flops_per_step = {
        "manifest": manifest_flops,
        "trace_shapes": shapes,
        "flop_counter": counter,
        "flop_counter_palm_attention": counter_palm,
    }
    for key, reference in (("manifest", counter_palm), ("trace_shapes", counter)):
        value = res.flops_per_step[key]
        rel = None if value is None else (value - reference) / reference
        res.rel_diff_vs_flop_counter[key] = rel
        res.checks[f"{key} FLOPs within 1 % of FlopCounterMode"] = bool(rel is not None and abs(rel) <= FLOPS_BOUND)
        if rel is None or abs(rel) > FLOPS_BOUND:
            res.problems.append(
                f"{key}: {value} FLOPs/step against FlopCounterMode's {reference:.6g}"
                + ("" if rel is None else f" ({100 * rel:+.3f} %)")
            )
    if report_json.exists():
        mfu = json.loads(report_json.read_text())["run"]["mfu"]
        res.mfu = {
            k: mfu.get(k)
            for k in (
                "source",
                "median",
                "hfu_median",
                "flops_per_step",
                "peak_flops_per_s",
                "flop_coverage",
                "lower_bound",
            )
        }


def trace_shape_flops(run_dir: Path) -> float | None:
    """Median model FLOPs per profiled step from the trace's op shapes (rank 0), None without steps."""
    from analyzer.ingest.load import load_traces
    from analyzer.metrics.mfu import rank_flops_from_shapes

    traces = sorted((run_dir / "traces").rglob("rank0*.json.gz"))
    ts = load_traces(traces, cache=False)
    if 0 not in ts.ranks or ts.ranks[0].steps.empty:
        return None
    rt = ts.ranks[0]
    rf = rank_flops_from_shapes(0, rt.events, rt.steps)
    return float(rf.steps["flops"].median())


def flop_counter_flops(config: dict[str, Any]) -> tuple[float, float]:
    """torch's FlopCounterMode over one optimizer step (forward and backward of every micro-batch) of the
    run's model: (its total, the same with attention backward at PaLM's 2x forward; see :func:`palm_attention`)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from recorder.flops import ADDED_FORMULAS
    from reftrain.config import from_dict
    from reftrain.model import Transformer

    cfg = from_dict(config)
    device = (
        "cuda" if cfg.train.device == "cuda" or (cfg.train.device == "auto" and torch.cuda.is_available()) else "cpu"
    )
    model = Transformer(cfg.model).to(device)
    m = cfg.model
    assert m.vocab_size is not None and m.seq_len is not None  # resolved in run.json
    idx = torch.randint(0, m.vocab_size, (cfg.train.micro_batch_size, m.seq_len), device=device)
    # torch's counter has no formula for SDPA's CPU flash kernels (the path SDPA takes on a CPU): the
    # recorder's, torch's own SDPA counts (causal not halved).
    with FlopCounterMode(display=False, custom_mapping=ADDED_FORMULAS) as counter:
        for _ in range(cfg.train.grad_accum):
            model(idx, idx).backward()
    total = float(counter.get_total_flops())
    return total, palm_attention(total, counter.get_flop_counts().get("Global", {}))


def palm_attention(total: float, by_op: dict[Any, int]) -> float:
    """``total`` with SDPA's backward counted as PaLM counts it: twice the forward.

    PaLM's 12LHQT (the manifest's formula) counts attention's backward as
    its two gradient matmuls per forward matmul (2x the forward); torch's
    counter counts five matmuls for the backward of two (2.5x: the scores
    QK^T are recomputed). The difference is definitional, so the manifest
    is compared with the counter in PaLM's convention; the trace-shape
    count, which follows torch's, with the counter as it is.
    """
    fwd = sum(v for k, v in by_op.items() if "scaled_dot_product" in str(k) and "backward" not in str(k))
    bwd = sum(v for k, v in by_op.items() if "scaled_dot_product" in str(k) and "backward" in str(k))
    return total - bwd + 2 * fwd


def summarize(results: list[CaseResult], dry_run: bool, wall_s: float) -> dict[str, Any]:
    """The JSON summary (schema SCHEMA)."""
    import torch

    device = torch.cuda.get_device_name(0) if (not dry_run and torch.cuda.is_available()) else "cpu"
    return {
        "schema": SCHEMA,
        "dry_run": dry_run,
        "device": device,
        "torch": torch.__version__,
        "wall_s": wall_s,
        "flops_bound": FLOPS_BOUND,
        "ok": bool(results) and all(r.ok for r in results),
        "cases": [dict(asdict(r), ok=r.ok) for r in results],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="run on the CPU: everything but the CUDA calls")
    ap.add_argument(
        "--out", type=Path, default=Path("gpu-check"), help="folder for the run directories (must not exist)"
    )
    ap.add_argument("--summary", type=Path, default=None, help="the JSON summary (default OUT/gpu_check.json)")
    args = ap.parse_args(argv)
    if args.out.exists():
        print(f"gpu_check: {args.out}: exists; give a new --out folder", file=sys.stderr)
        return 2
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device; run with --dry-run on a CPU machine", file=sys.stderr)
            return 2
    args.out.mkdir(parents=True)
    start = time.perf_counter()
    common = common_args(args.dry_run, args.out)
    results = []
    for case in cases(args.dry_run):
        res = run_case(case, common, args.dry_run)
        results.append(res)
        status = "ok" if res.ok else "FAILED: " + "; ".join(k for k, v in res.checks.items() if not v)
        print(f"gpu_check: {case.name}: {status} ({res.wall_s:.1f} s)", file=sys.stderr)
    summary = summarize(results, args.dry_run, time.perf_counter() - start)
    path = args.summary or args.out / "gpu_check.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"gpu_check: {'all checks passed' if summary['ok'] else 'some checks failed'}; summary in {path}",
        file=sys.stderr,
    )
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
