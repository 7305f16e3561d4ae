"""Benchmark trace loading: ``analyzer.ingest.load.load_traces`` (cold and warm
cache) against HTA's ``TraceAnalysis`` load, on the same folders.

    .venv/bin/python bench/bench_load.py [--repeats 3] [--out bench/out/load] [--cases NAME ...]

Each measurement is a fresh Python process running one *tool* on one
*case* (folder), interleaved (every tool on a case, then the next case;
the tool order alternates between repeats). Per run:

* ``load_s``: the load call alone, timed inside the child (no interpreter
  start or imports); ``wall_s``: the whole child process.
* ``peak PSS``: peak of the summed proportional set size (``Pss`` of
  /proc/PID/smaps_rollup) over the child and all its descendants, sampled
  every 20 ms. PSS splits pages shared between a parent and its forked
  workers, so a process tree is not double-counted; ``peak RSS`` (summed
  VmRSS) is given beside it and does count shared pages in each process.
  Sampling can miss a peak shorter than the period; both tools are
  measured the same way.
* ``MB/s``: uncompressed trace JSON / ``load_s``.

Tools (:data:`TOOLS`; a child is ``python -c CODE FOLDER CACHE_DIR`` that
prints one JSON line with ``load_s`` and ``ranks``): ``hta`` is
``TraceAnalysis(trace_dir=FOLDER, include_last_profiler_step=True)``;
``ours-cold`` is ``load_traces(FOLDER, cache=CACHE_DIR)`` with an empty
cache folder (it parses and writes the cache, as a first run does);
``ours-warm`` the same with the cache filled. To benchmark more than the
load (say ``analyzer report`` against HTA's load plus
``get_comm_comp_overlap`` and ``get_temporal_breakdown``), add entries to
:data:`TOOLS` whose code does that work inside the timed region.

Cases: the two largest shared HTA samples (df_index_resolver, 54 MB JSON;
trace_diff/control, 35 MB) and ``8-ranks``: df_index_resolver copied as
ranks 0..7 (``distributedInfo.rank`` and ``world_size`` rewritten), built
once under ``--out``. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from proctree import run_tree  # noqa: E402

SHARED = REPO.parent / "shared" / "traces" / "hta-samples"
SAMPLE_PERIOD_S = 0.02

_OURS = """
import json, sys, time
from pathlib import Path
from analyzer.ingest.load import load_traces
t = time.perf_counter()
ts = load_traces(Path(sys.argv[1]), cache=Path(sys.argv[2]), progress=False)
load_s = time.perf_counter() - t
assert not ts.errors, ts.errors
print(json.dumps({"load_s": load_s, "ranks": len(ts.ranks), "rows": sum(len(r.events) for r in ts.ranks.values())}))
"""

_HTA = """
import json, logging, sys, time
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
t = time.perf_counter()
analysis = TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=True)
load_s = time.perf_counter() - t
print(json.dumps({"load_s": load_s, "ranks": len(analysis.t.traces), "rows": sum(len(d) for d in analysis.t.traces.values())}))
"""

# tool name -> (child code, cache state before the run: "empty", "filled" or None)
TOOLS: dict[str, tuple[str, str | None]] = {
    "hta": (_HTA, None),
    "ours-cold": (_OURS, "empty"),
    "ours-warm": (_OURS, "filled"),
}


@dataclass
class Run:
    case: str
    tool: str
    repeat: int
    load_s: float
    wall_s: float
    peak_pss_mb: float
    peak_rss_mb: float
    json_mb: float
    ranks: int
    rows: int

    @property
    def mb_per_s(self) -> float:
        return self.json_mb / self.load_s


def run_child(code: str, argv: list[str]) -> tuple[dict, float, int, int]:
    """Run ``python -c code argv``; (its JSON line, wall s, peak PSS, peak RSS)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    r = run_tree([sys.executable, "-c", code, *argv], env, REPO, SAMPLE_PERIOD_S)
    if r.returncode != 0:
        raise SystemExit(f"child failed ({r.returncode}):\n{r.stderr.decode(errors='replace')[-3000:]}")
    return json.loads(r.stdout.decode().strip().splitlines()[-1]), r.wall_s, r.peak_pss_bytes, r.peak_rss_bytes


# ------------------------------------------------------------ cases
_DIST_INFO_RE = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*\}')


def copy_as_rank(src: Path, dst: Path, rank: int, world_size: int) -> None:
    """``src`` (.json.gz) as rank ``rank`` of ``world_size``: only the
    distributedInfo object changes."""
    with gzip.open(src, "rb") as f:
        data = f.read()
    m = _DIST_INFO_RE.search(data)
    if m is None:
        raise SystemExit(f"{src}: no distributedInfo object to rewrite")
    info = json.loads(m.group(0).split(b":", 1)[1])
    info.update(rank=rank, world_size=world_size)
    data = data[: m.start()] + b'"distributedInfo": ' + json.dumps(info).encode() + data[m.end() :]
    tmp = dst.with_name(dst.name + ".tmp")
    with gzip.open(tmp, "wb", compresslevel=6) as f:
        f.write(data)
    os.replace(tmp, dst)


def prepare_cases(out: Path) -> dict[str, Path]:
    if not SHARED.is_dir():
        raise SystemExit(f"{SHARED}: not found (the shared HTA sample traces are needed)")
    cases = {"df_index_resolver": SHARED / "df_index_resolver", "trace_diff-control": SHARED / "trace_diff" / "control"}
    eight = out / "8-ranks"
    eight.mkdir(parents=True, exist_ok=True)
    src = next((SHARED / "df_index_resolver").glob("*.json.gz"))
    for rank in range(8):
        if not (eight / f"rank{rank}.json.gz").exists():
            copy_as_rank(src, eight / f"rank{rank}.json.gz", rank, 8)
    cases["8-ranks"] = eight
    return cases


def json_mb(folder: Path) -> float:
    total = 0
    for p in folder.iterdir():
        if p.name.endswith(".json.gz"):
            with gzip.open(p, "rb") as f:
                while chunk := f.read(1 << 24):
                    total += len(chunk)
        elif p.name.endswith(".json"):
            total += p.stat().st_size
    return total / 1e6


# ------------------------------------------------------------ main
def measure(case: str, folder: Path, tool: str, repeat: int, mb: float, caches: Path) -> Run:
    code, cache_state = TOOLS[tool]
    cache_dir = caches / case
    if cache_state == "empty":
        shutil.rmtree(cache_dir, ignore_errors=True)
    elif cache_state == "filled" and not any(cache_dir.glob("*.npz")):
        run_child(code, [str(folder), str(cache_dir)])  # fill it, untimed
    result, wall, pss, rss = run_child(code, [str(folder), str(cache_dir)])
    run = Run(case, tool, repeat, result["load_s"], wall, pss / 1e6, rss / 1e6, mb, result["ranks"], result["rows"])
    print(
        f"  {case:20s} {tool:10s} load {run.load_s:7.2f} s  wall {wall:7.2f} s  "
        f"PSS {run.peak_pss_mb:7.0f} MB  RSS {run.peak_rss_mb:7.0f} MB  {run.mb_per_s:7.1f} MB/s  rows {run.rows}",
        flush=True,
    )
    return run


def summarize(runs: list[Run]) -> list[dict]:
    rows = []
    for case in dict.fromkeys(r.case for r in runs):
        row: dict = {"case": case, "json_mb": next(r.json_mb for r in runs if r.case == case)}
        for tool in TOOLS:
            rs = [r for r in runs if r.case == case and r.tool == tool]
            if rs:
                row[tool] = {
                    k: statistics.median(getattr(r, k) for r in rs)
                    for k in ("load_s", "wall_s", "peak_pss_mb", "peak_rss_mb", "mb_per_s")
                }
        if "hta" in row and "ours-cold" in row:
            row["speedup_load"] = row["hta"]["load_s"] / row["ours-cold"]["load_s"]
            row["speedup_wall"] = row["hta"]["wall_s"] / row["ours-cold"]["wall_s"]
            row["pss_ratio"] = row["ours-cold"]["peak_pss_mb"] / row["hta"]["peak_pss_mb"]
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    nan = float("nan")
    print(f"\n{'case':20s} {'tool':10s} {'load s':>7s} {'wall s':>7s} {'PSS MB':>7s} {'RSS MB':>7s} {'MB/s':>7s}")
    for row in rows:
        for tool in TOOLS:
            if tool in row:
                t = row[tool]
                print(
                    f"{row['case']:20s} {tool:10s} {t['load_s']:7.2f} {t['wall_s']:7.2f} {t['peak_pss_mb']:7.0f} "
                    f"{t['peak_rss_mb']:7.0f} {t['mb_per_s']:7.1f}"
                )
        print(
            f"{'':20s} {'cold vs HTA':10s} load {row.get('speedup_load', nan):.1f}x faster, "
            f"wall {row.get('speedup_wall', nan):.1f}x faster, peak PSS {row.get('pss_ratio', nan):.2f} of HTA's "
            f"({row['json_mb']:.0f} MB JSON)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs per tool and case; medians are reported")
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench" / "out" / "load", help="working folder (git-ignored)"
    )
    parser.add_argument("--cases", nargs="*", help="subset of cases (df_index_resolver, trace_diff-control, 8-ranks)")
    parser.add_argument("--tools", nargs="*", default=list(TOOLS), help=f"subset of tools ({', '.join(TOOLS)})")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cases = prepare_cases(args.out)
    if args.cases:
        cases = {k: v for k, v in cases.items() if k in args.cases}
    sizes = {k: json_mb(v) for k, v in cases.items()}
    print(f"{os.cpu_count()} CPUs; " + ", ".join(f"{k}: {v:.0f} MB JSON" for k, v in sizes.items()))
    caches = Path(tempfile.mkdtemp(prefix="bench-load-cache-", dir=args.out))
    runs: list[Run] = []
    try:
        for repeat in range(args.repeats):
            order = args.tools if repeat % 2 == 0 else list(reversed(args.tools))
            # The warm run needs the cold one's cache: keep cold before warm.
            if "ours-cold" in order and "ours-warm" in order and order.index("ours-warm") < order.index("ours-cold"):
                order = [t for t in order if t != "ours-warm"]
                order.insert(order.index("ours-cold") + 1, "ours-warm")
            for case, folder in cases.items():
                for tool in order:
                    runs.append(measure(case, folder, tool, repeat, sizes[case], caches))
    finally:
        shutil.rmtree(caches, ignore_errors=True)
    rows = summarize(runs)
    print_table(rows)
    out = args.out / "bench_load.json"
    out.write_text(
        json.dumps({"runs": [asdict(r) | {"mb_per_s": r.mb_per_s} for r in runs], "summary": rows}, indent=2)
    )
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
