"""Conformance of the analyzer against two peer tools on the shared real traces.

usage: .venv/bin/python bench/conformance.py [--shared ../shared] [--markdown]

For every trace in ``traces/tracelens-samples/`` with TraceLens's own report
beside it (``*_perf_report_csvs/`` or ``perf_csvs/``):

* breakdown parts against ``gpu_timeline.csv`` (computation, exposed comm,
  exposed memcpy, idle; percent of the GPU span), bound 0.5 points, ours
  from :func:`analyzer.metrics.overlap.span_breakdown` in TraceLens's window
  (the whole device span). Definitional difference: TraceLens counts
  memsets as computation, we count them with the copies; the row
  ``(memset as TraceLens)`` shows ours under TraceLens's rule, which must
  then be within the bound, and the plain row's difference is its size;
* kernel totals against ``kernel_summary.csv``: the total kernel time and
  the largest per-kernel-name difference, bound 0.1 %;
* GEMM FLOPs per ``GEMM.csv`` row: our formula (:func:`flops_of`) on the
  row's ``Input Dims`` plus TraceLens's bias term (``M*N`` for ops with a
  bias: TraceLens counts the bias add, torch's FLOP counter and we do not)
  must equal ``GFLOPS_first`` exactly; the table shows the worst row, and
  ``GEMM ops charged`` how many rows' ops our kernel attribution charged
  with the same count as TraceLens's ``name_count``.

The TB-plugin-era trace ``traces/kineto-samples/gpu_metrics_input.json``:
GPU utilization per device against ``gpu_metrics_expected.json``, bound 0.5
points. Its utilization is the plugin's: busy time (union of kernels) over
the device's span from its first to its last kernel.

HTA agreement on ``traces/hta-samples/`` is tested by
``tests/test_hta_crosscheck.py`` (HTA's numbers are pinned there).

Prints one table (trace x metric x ours x reference x difference x bound x
ok); ``--markdown`` prints it as the Markdown table in docs/conformance.md.
Exit 1 when a row is out of its bound.
"""

from __future__ import annotations

import argparse
import ast
import csv
from collections import Counter
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analyzer.ingest.load import load_trace  # noqa: E402
from analyzer.metrics.kernels import top_kernels  # noqa: E402
from analyzer.metrics.matmul_flops import ShapeError, flop_kernels, flops_of, matmul_ops  # noqa: E402
from analyzer.metrics.mfu import charged_ops  # noqa: E402
from analyzer.metrics.overlap import SPAN_PARTS, kernel_utilization, span_breakdown  # noqa: E402

BREAKDOWN_BOUND_PP = 0.5
KERNEL_BOUND_PCT = 0.1
UTIL_BOUND_PP = 0.5
_TL_PARTS = {
    "computation": "computation_time",
    "exposed_comm": "exposed_comm_time",
    "exposed_memcpy": "exposed_memcpy_time",
    "idle": "idle_time",
}


@dataclass
class Row:
    trace: str
    metric: str
    ours: float | None
    reference: float | None
    unit: str
    bound: float | None  # None: informational (a documented definitional difference)
    note: str = ""

    @property
    def diff(self) -> float | None:
        if self.ours is None or self.reference is None:
            return None
        if self.unit == "%rel":
            return 100.0 * (self.ours - self.reference) / self.reference if self.reference else 0.0
        return self.ours - self.reference

    @property
    def ok(self) -> bool:
        if self.bound is None:
            return True
        return self.diff is not None and abs(self.diff) <= self.bound


# The report folders TraceLens writes beside a trace: its perf report, the same report taken with
# activation-checkpointing recompute told apart (rows flagged ``is_recompute``), or ``perf_csvs/``.
REPORT_SUFFIXES = ("_perf_report_csvs", "_recompute_perf_report_csvs")


def tracelens_samples(root: Path) -> list[tuple[Path, Path]]:
    """(trace, report folder) for every TraceLens report with a gpu_timeline.csv beside a trace: each of
    ``X_perf_report_csvs/`` and ``X_recompute_perf_report_csvs/`` (a trace may have both), else ``perf_csvs/``."""
    out = []
    for trace in sorted(root.rglob("*.json.gz")):
        base = str(trace)[: -len(".json.gz")]
        reports = [
            Path(base + suffix) for suffix in REPORT_SUFFIXES if (Path(base + suffix) / "gpu_timeline.csv").exists()
        ]
        if not reports and (trace.parent / "perf_csvs" / "gpu_timeline.csv").exists():
            reports = [trace.parent / "perf_csvs"]
        out += [(trace, rep) for rep in reports]
    return out


def sample_label(root: Path, trace: Path, rep: Path) -> str:
    """The trace's path under ``root`` without ``.json.gz``; a recompute report says so."""
    label = str(trace.relative_to(root)).removesuffix(".json.gz")
    return label + " (recompute report)" if rep.name.endswith(REPORT_SUFFIXES[1]) else label


def _gpu_timeline(rep: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in csv.DictReader(open(rep / "gpu_timeline.csv")):
        if r.get("is_recompute", "False") != "True":
            out.setdefault(r["type"], float(r["percent"]))
    return out


def _kernel_summary(rep: Path) -> dict[str, float] | None:
    """Total kernel time (us) per kernel name from TraceLens's kernel_summary.csv."""
    path = rep / "kernel_summary.csv"
    if not path.exists():
        return None
    totals: dict[str, float] = {}
    for r in csv.DictReader(open(path)):
        key = next(k for k in r if k.startswith("Kernel duration") and k.endswith("_sum"))
        totals[r["Kernel name"]] = totals.get(r["Kernel name"], 0.0) + float(r[key])
    return totals


# Custom ops that wrap a GEMM: their implementation calls aten::mm/addmm, which the trace records inside
# them (sglang_decode's capture trace: every aiter::gemm_a16w16 encloses an aten::mm of its M, N, K, 144
# of 144). TraceLens's GEMM.csv lists the wrapper and the aten op each with the product's FLOPs (every
# aiter::gemm_a16w16 row there has an aten::mm twin of the same B, M, N, K and count): summing both counts
# the product twice. The aten row is kept, the op that launches the kernel and the one our count charges;
# a wrapper row without a twin is kept with TraceLens's FLOPs (nothing else counts that product).
GEMM_WRAPPERS = frozenset({"aiter::gemm_a16w16", "vllm::rocm_unquantized_gemm"})


def _gemm_key(row: dict) -> tuple:
    return tuple(row.get(f"param: {k}") for k in ("B", "M", "N", "K")) + (row.get("name_count"),)


def is_recompute(row: dict) -> bool:
    """A row of a recompute report's per-op tables that TraceLens flags as recomputed forward."""
    return str(row.get("is_recompute", "False")) == "True"


def gemm_rows(rep: Path) -> tuple[list[dict], list[dict]]:
    """GEMM.csv's rows: (rows counted, wrapper rows left out as duplicates of their aten twin; see GEMM_WRAPPERS)."""
    rows = list(csv.DictReader(open(rep / "GEMM.csv")))
    twins = Counter(_gemm_key(r) + (is_recompute(r),) for r in rows if r["name"] not in GEMM_WRAPPERS)
    kept, dropped = [], []
    for r in rows:
        key = _gemm_key(r) + (is_recompute(r),)
        if r["name"] in GEMM_WRAPPERS and twins[key] > 0:
            twins[key] -= 1
            dropped.append(r)
        else:
            kept.append(r)
    return kept, dropped


def tracelens_gemm_flops(row: dict) -> float:
    """FLOPs of a GEMM.csv row by our formula plus TraceLens's bias term (M*N when the op has a bias);
    a wrapper op (GEMM_WRAPPERS) without an aten twin: TraceLens's own figure."""
    if row["name"] in GEMM_WRAPPERS:
        return float(row["GFLOPS_first"]) * 1e9
    dims = ast.literal_eval(row["Input Dims_first"])
    flops = float(flops_of(row["name"], dims))
    if row.get("param: bias") == "True":
        flops += float(row["param: M"]) * float(row["param: N"]) * float(row.get("param: B") or 1)
    return flops


def trace_rows(trace: Path, rep: Path, label: str) -> list[Row]:
    rt = load_trace(trace)
    ev = rt.events
    rows: list[Row] = []
    ref = _gpu_timeline(rep)
    ours = span_breakdown(ev)
    # TraceLens's rules: memsets are computation, and device events whose launch is not in the trace are left out.
    as_tl = span_breakdown(ev, memset_as="compute", launched_only=True)
    for part in SPAN_PARTS:
        r = ref.get(_TL_PARTS[part])
        differs = abs(ours.get(part, 0.0) - as_tl.get(part, 0.0)) > 1e-9 if ours else False
        note = (
            f"definitional: memsets and unlaunched kernels move {ours[part] - as_tl[part]:+.3f} pp" if differs else ""
        )
        rows.append(Row(label, f"{part} %", ours.get(part), r, "pp", None if differs else BREAKDOWN_BOUND_PP, note))
        if differs:
            rows.append(Row(label, f"{part} % (TraceLens rules)", as_tl.get(part), r, "pp", BREAKDOWN_BOUND_PP))
    rows += report_rows(trace, rep, label, ours, ref)
    ks = _kernel_summary(rep)
    if ks is not None:
        table = top_kernels(ev, rt.steps.iloc[:0], rt.rank, None)
        kern = table.loc[table["kind"].isin(["compute", "comm"])]
        ours_us = dict(zip(kern["name"], kern["total_ms"] * 1e3))
        rows.append(
            Row(
                label,
                "kernel time total us",
                float(sum(ours_us.values())),
                float(sum(ks.values())),
                "%rel",
                KERNEL_BOUND_PCT,
            )
        )
        worst = max(ks, key=lambda n: abs(ours_us.get(n, 0.0) - ks[n]) / ks[n] if ks[n] else 0.0)
        rows.append(
            Row(
                label,
                "kernel time, worst name, us",
                ours_us.get(worst, 0.0),
                ks[worst],
                "%rel",
                KERNEL_BOUND_PCT,
                worst[:40],
            )
        )
    gemm = rep / "GEMM.csv"
    if gemm.exists():
        counted_rows, wrappers = gemm_rows(rep)
        worst_rel, worst_row, unmodelled = 0.0, None, []
        for r in counted_rows:
            try:
                mine = tracelens_gemm_flops(r)
            except ShapeError as e:
                unmodelled.append(f"{r['name']}: {e}")
                continue
            rel = abs(mine / 1e9 - float(r["GFLOPS_first"])) / float(r["GFLOPS_first"])
            if worst_row is None or rel > worst_rel:
                worst_rel, worst_row = rel, (mine / 1e9, float(r["GFLOPS_first"]), r["name"])
        if worst_row:
            dedup = (
                f"; {len(wrappers)} wrapper rows ({', '.join(sorted({r['name'] for r in wrappers}))}) left out: "
                "their aten twin is the same product"
                if wrappers
                else ""
            )
            rows.append(
                Row(
                    label,
                    f"GEMM GFLOPs/op, worst of {len(counted_rows) - len(unmodelled)} rows",
                    worst_row[0],
                    worst_row[1],
                    "%rel",
                    1e-6,
                    worst_row[2] + (f"; not modelled: {'; '.join(unmodelled)}" if unmodelled else "") + dedup,
                )
            )
    conv = rep / "CONV_fwd.csv"
    if conv.exists():
        from analyzer.metrics.conv_flops import conv_flops

        for r in csv.DictReader(open(conv)):
            mine = conv_flops(
                r["name"], ast.literal_eval(r["Input Dims_first"]), ast.literal_eval(r["Concrete Inputs_first"])
            )
            rows.append(Row(label, "CONV GFLOPs/op", mine / 1e9, float(r["GFLOPS_first"]), "%rel", 1e-6, r["name"]))
    if gemm.exists():
        ops = matmul_ops(ev)
        kernels = flop_kernels(ev, ops)
        charged = charged_ops(ops, kernels)
        covered = float(kernels.loc[kernels["account"] >= 0, "dur_ns"].sum())
        total = float(kernels["dur_ns"].sum())
        counts = ops.loc[charged].groupby(["name", "input_dims"]).size()
        # TraceLens writes Input Dims with spaces after commas, the loader keeps Kineto's JSON text: compare parsed.
        ours_counts = {(n, json.dumps(json.loads(d))): int(c) for (n, d), c in counts.items()}
        same = sum(
            ours_counts.get((r["name"], json.dumps(ast.literal_eval(r["Input Dims_first"])))) == int(r["name_count"])
            for r in counted_rows
        )
        # CUDA-graph replays are mapped through capture_traces/ like TraceLens does (docs/loading.md).
        rows.append(
            Row(label, "GEMM ops charged as TraceLens counts them", float(same), float(len(counted_rows)), "n", 0)
        )
        rows.append(
            Row(
                label,
                "FLOP coverage % (ours only)",
                100.0 * covered / total if total else None,
                None,
                "pp",
                None,
                "share of GEMM/attention/conv kernel time with known FLOPs",
            )
        )
    return rows


# TraceLens's per-category tables holding FLOPs, besides GEMM.csv: attention and convolution, forward and backward.
SDPA_TABLES = ("SDPA_fwd.csv", "SDPA_bwd.csv")
CONV_TABLES = ("CONV_fwd.csv", "CONV_bwd.csv")


def _table(rep: Path, name: str) -> list[dict]:
    path = rep / name
    return list(csv.DictReader(open(path))) if path.exists() else []


def tracelens_step_flops(rep: Path, causal_full: bool, *, recompute: bool = False) -> float | None:
    """FLOPs TraceLens charges the trace's GEMM, SDPA and convolution ops (``GFLOPS_first x name_count``).

    GEMM rows by our formula, i.e. without TraceLens's bias term, and without
    the wrapper rows that repeat their aten op's product (GEMM_WRAPPERS);
    SDPA and convolution rows as TraceLens writes them. ``causal_full``:
    count a causal SDPA op's FLOPs in full (torch's FLOP counter and ours)
    rather than halved (TraceLens). ``recompute``: include the rows a
    recompute report flags as recomputed forward (hardware FLOPs); without
    it, model FLOPs. None without GEMM.csv.
    """
    if not (rep / "GEMM.csv").exists():
        return None

    def counted(r: dict) -> bool:
        return recompute or not is_recompute(r)

    total = sum(tracelens_gemm_flops_unbiased(r) * int(r["name_count"]) for r in gemm_rows(rep)[0] if counted(r))
    for name in SDPA_TABLES:
        for r in _table(rep, name):
            if counted(r):
                scale = 2.0 if causal_full and r.get("param: causal") == "True" else 1.0
                total += scale * float(r["GFLOPS_first"]) * 1e9 * int(r["name_count"])
    for name in CONV_TABLES:
        total += sum(float(r["GFLOPS_first"]) * 1e9 * int(r["name_count"]) for r in _table(rep, name) if counted(r))
    return total


def tracelens_gemm_flops_unbiased(row: dict) -> float:
    """A GEMM.csv row's FLOPs without the bias term (torch's FLOP counter's and our convention)."""
    if row["name"] in GEMM_WRAPPERS:
        return float(row["GFLOPS_first"]) * 1e9
    return float(flops_of(row["name"], ast.literal_eval(row["Input Dims_first"])))


def report_rows(trace: Path, rep: Path, label: str, span: dict[str, float], ref: dict[str, float]) -> list[Row]:
    """What ``analyzer report`` shows for the trace, against TraceLens's gpu_timeline.csv.

    The report's whole-trace GPU timeline must be the span breakdown above
    (same definition, same numbers: worst part, bound 1e-9 points); its
    per-step breakdown (ProfilerStep windows) is a different window, shown
    as a documented difference with its size: compute busy time
    (``compute + overlapped_comm``) and idle, in percent of step time.
    """
    from analyzer.api import analyze

    a = analyze(trace)
    r = a.ranks[0]
    worst = max(SPAN_PARTS, key=lambda p: abs(r.gpu_timeline.get(p, math.nan) - span.get(p, math.nan)))
    rows = [
        Row(
            label,
            "report whole-trace timeline, worst part %",
            r.gpu_timeline.get(worst),
            span.get(worst),
            "pp",
            1e-9,
            f"{worst}: equals the rows above",
        )
    ]
    if a.mfu.source == "trace-shapes" and (rep / "GEMM.csv").exists():
        # Causal attention: TraceLens halves the S x S FLOPs, torch's FLOP counter and we count them in full.
        mine, halved, full = (
            float(a.mfu.flops_per_step),
            tracelens_step_flops(rep, False),
            tracelens_step_flops(rep, True),
        )
        causal = abs(full - halved) > 0
        parts = "GEMM+attention+conv" if any((rep / t).exists() for t in CONV_TABLES) else "GEMM+attention"
        rows.append(
            Row(
                label,
                f"report {parts} GFLOPs/step",
                mine / 1e9,
                halved / 1e9,
                "%rel",
                None if causal else 1e-6,
                "definitional: causal SDPA counted in full (TraceLens halves it)" if causal else "no causal attention",
            )
        )
        if causal:
            rows.append(
                Row(label, f"report {parts} GFLOPs/step (causal in full)", mine / 1e9, full / 1e9, "%rel", 1e-6)
            )
        hardware = tracelens_step_flops(rep, True, recompute=True)
        if hardware != full:
            rows.append(
                Row(
                    label,
                    "TraceLens hardware GFLOPs/step (recompute rows included)",
                    None,
                    hardware / 1e9,
                    "%rel",
                    None,
                    "reference only: the report's MFU counts model FLOPs, recompute apart",
                )
            )
    b = r.breakdown
    if not b:
        rows.append(
            Row(
                label,
                "report per-step breakdown",
                None,
                None,
                "pp",
                None,
                "no ProfilerStep windows: the whole-trace timeline is the report's only breakdown",
            )
        )
        return rows
    windows = (
        f"{r.n_steps} ProfilerStep window(s), {sum(a.steps['step_time_ms']):.2f} ms vs GPU span {r.gpu_span_ms:.2f} ms"
    )
    rows.append(
        Row(
            label,
            "report per-step compute % (step windows)",
            b["compute"]["pct"] + b["overlapped_comm"]["pct"],
            ref.get("computation_time"),
            "pp",
            None,
            "definitional: " + windows,
        )
    )
    rows.append(
        Row(
            label,
            "report per-step idle % (step windows)",
            b["idle"]["pct"],
            ref.get("idle_time"),
            "pp",
            None,
            "definitional: host time inside the windows is idle, GPU time outside them is not counted",
        )
    )
    return rows


def kineto_rows(shared: Path) -> list[Row]:
    """GPU utilization per device of the TB-plugin-era trace against the plugin's expected output.

    The plugin writes utilization as counter events ``GPU <n> Utilization``,
    one per time bucket (1 ms here; the last bucket runs to the end of the
    profiler's window). Ours: :func:`kernel_utilization` over the same
    buckets (the bucket edges are the plugin's: its window is the profiler's
    own span, an event the loader does not keep). One row per device: the
    largest difference over its buckets.
    """
    folder = shared / "traces" / "kineto-samples"
    trace, expected = folder / "gpu_metrics_input.json", folder / "gpu_metrics_expected.json"
    if not trace.exists() or not expected.exists():
        return []
    label = "kineto-samples (TB plugin era)"
    buckets = plugin_buckets(json.loads(expected.read_text()))
    rt = load_trace(trace)
    rows = []
    for dev, (edges, values) in sorted(buckets.items()):
        ours = kernel_utilization(rt.events, edges[:-1], edges[1:]).get(dev, np.zeros(len(values)))
        diff_pp = 100.0 * (ours - values)
        worst = int(np.argmax(np.abs(diff_pp)))
        rows.append(
            Row(
                label,
                f"GPU {dev} utilization %, worst of {len(values)} buckets",
                100.0 * ours[worst],
                100.0 * values[worst],
                "pp",
                UTIL_BOUND_PP,
                f"bucket at +{(edges[worst] - edges[0]) / 1e6:.0f} ms",
            )
        )
    kinds = rt.events["kind"].astype(str)
    raw = json.loads(trace.read_text())["traceEvents"]
    rows.append(
        Row(
            label,
            "Memcpy events counted as memcpy",
            float((kinds == "memcpy").sum()),
            float(sum(1 for e in raw if e.get("cat") == "Memcpy")),
            "n",
            0,
        )
    )
    return rows


def plugin_buckets(expected: dict) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per device: bucket edges (ns) and utilization (0..1) from the plugin's ``GPU <n> Utilization`` counters (percent).

    The plugin opens the series with placeholder points at its first
    timestamp (1, 0, then the first bucket's value); the last value at a
    timestamp is the bucket's, and the final 0 marks the end of the last
    bucket.
    """
    series: dict[int, dict[int, float]] = {}
    for e in expected.get("traceEvents", []):
        name = str(e.get("name", ""))
        if e.get("ph") == "C" and name.startswith("GPU ") and name.endswith(" Utilization"):
            dev = int(name.split()[1])
            # Microsecond timestamps to exact ns (they are integers in this era).
            # The plugin writes percent (0.6 is 6 us of kernels in a 1 ms bucket).
            series.setdefault(dev, {})[int(round(float(e["ts"]) * 1000))] = float(e["args"]["GPU Utilization"]) / 100.0
    out = {}
    for dev, points in series.items():
        ts = np.array(sorted(points), dtype=np.int64)
        vals = np.array([points[t] for t in ts], dtype=np.float64)
        out[dev] = (ts, vals[:-1])
    return out


def all_rows(shared: Path) -> list[Row]:
    root = shared / "traces" / "tracelens-samples"
    rows: list[Row] = []
    for trace, rep in tracelens_samples(root):
        rows += trace_rows(trace, rep, sample_label(root, trace, rep))
    return rows + kineto_rows(shared)


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.4f}" if abs(v) < 1e4 else f"{v:,.1f}"


def render(rows: list[Row], markdown: bool) -> str:
    head = ["trace", "metric", "ours", "reference", "difference", "bound", "ok", "note"]
    body = []
    for r in rows:
        unit = {"pp": " pp", "%rel": " %", "n": ""}[r.unit]
        diff = "-" if r.diff is None else f"{r.diff:+.4f}{unit}"
        bound = "documented difference" if r.bound is None else f"{r.bound:g}{unit}"
        body.append([r.trace, r.metric, _fmt(r.ours), _fmt(r.reference), diff, bound, "yes" if r.ok else "NO", r.note])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(str(x[i])) for x in [head] + body) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head] + body)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", type=Path, default=REPO.parent / "shared", help="the shared folder (default ../shared)")
    ap.add_argument("--markdown", action="store_true", help="print the Markdown table of docs/conformance.md")
    args = ap.parse_args(argv)
    if not (args.shared / "traces").is_dir():
        print(f"conformance: {args.shared / 'traces'}: no such folder (give --shared)", file=sys.stderr)
        return 2
    rows = all_rows(args.shared)
    print(render(rows, args.markdown))
    bad = [r for r in rows if not r.ok]
    print(f"\n{len(rows) - len(bad)} of {len(rows)} rows within their bounds", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
