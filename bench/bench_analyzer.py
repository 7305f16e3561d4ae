"""Benchmark `analyzer report` against HTA on the same trace folders.

    .venv/bin/python bench/bench_analyzer.py [--repeats 3] [--out bench/out]

For every folder, interleaved in one run (HTA, analyzer cold, analyzer warm,
then the next folder, rotated each repeat so neither tool always runs first
after the other's page-cache effects):

* **HTA**: a fresh Python process that builds
  ``TraceAnalysis(trace_dir=..., include_last_profiler_step=True)`` and calls
  ``get_comm_comp_overlap(visualize=False)`` and
  ``get_temporal_breakdown(visualize=False)``.
* **analyzer cold**: ``analyzer report DIR --json FILE`` as a subprocess
  after deleting the analyzer's parse cache (it writes the cache, as a
  user's first run does).
* **analyzer warm**: the same command again, with the cache present.

Figures per run: wall time of the whole subprocess (interpreter start and
imports included, for both tools), peak RSS of the whole process tree
(sum of VmRSS over the process and all its descendants, sampled every
10 ms from /proc; pages shared between a parent and its forked workers are
counted in each, for both tools alike) and MB/s of uncompressed trace JSON.
The report gives the median over repeats.

Folders: the two largest shared HTA samples and an 8-rank folder made by
copying the largest one under rank ids 0..7 (``distributedInfo.rank`` and
``world_size`` rewritten), built once under ``--out``. Linux only (/proc).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "traces" / "hta-samples"
BIN = Path(sys.executable).parent
SAMPLE_PERIOD_S = 0.01

HTA_SCRIPT = """
import sys, logging
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
analysis = TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=True)
overlap = analysis.get_comm_comp_overlap(visualize=False)
breakdown = analysis.get_temporal_breakdown(visualize=False)
print(len(overlap), len(breakdown))
"""


@dataclass
class Measurement:
    folder: str
    tool: str  # "hta" | "analyzer-cold" | "analyzer-warm"
    repeat: int
    wall_s: float
    peak_rss_mb: float
    json_mb: float
    returncode: int

    @property
    def mb_per_s(self) -> float:
        return self.json_mb / self.wall_s


# ----------------------------------------------------------------- process tree
def _children_map() -> dict[int, list[int]]:
    """ppid -> pids, from /proc/*/stat (field 4 after the parenthesized comm)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def tree_rss_bytes(root: int) -> int:
    """Sum of resident memory of ``root`` and all its live descendants."""
    children = _children_map()
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += _rss_bytes(pid)
        stack.extend(children.get(pid, ()))
    return total


def run_measured(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int, int, str]:
    """Run ``cmd``; return (wall seconds, peak tree RSS bytes, returncode, stderr tail)."""
    peak = 0
    done = threading.Event()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_rss_bytes(proc.pid))
            done.wait(SAMPLE_PERIOD_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    return wall, peak, proc.returncode, err.decode(errors="replace")[-2000:]


# ----------------------------------------------------------------- folders
def uncompressed_json_bytes(folder: Path) -> int:
    total = 0
    for path in sorted(folder.iterdir()):
        if path.name.endswith(".json.gz"):
            with gzip.open(path, "rb") as f:
                while chunk := f.read(1 << 24):
                    total += len(chunk)
        elif path.name.endswith(".json"):
            total += path.stat().st_size
    return total


_DIST_INFO_RE = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*\}')


def copy_as_rank(src: Path, dst: Path, rank: int, world_size: int) -> None:
    """Write ``src`` (a .json.gz trace) to ``dst`` as rank ``rank`` of ``world_size``.

    Only the distributedInfo object changes; the rest of the bytes are kept.
    """
    with gzip.open(src, "rb") as f:
        data = f.read()
    match = _DIST_INFO_RE.search(data)
    if match is None:
        raise SystemExit(f"{src}: no distributedInfo object to rewrite")
    info = json.loads(match.group(0).split(b":", 1)[1])
    info.update(rank=rank, world_size=world_size)
    data = data[: match.start()] + b'"distributedInfo": ' + json.dumps(info).encode() + data[match.end() :]
    with gzip.open(dst, "wb", compresslevel=6) as f:
        f.write(data)


def prepare_folders(out: Path) -> dict[str, Path]:
    """Working copies of the trace folders under ``out`` (the analyzer's cache goes beside them)."""
    sources = {
        "df_index_resolver": SHARED / "df_index_resolver",
        "trace_diff-control": SHARED / "trace_diff" / "control",
    }
    folders: dict[str, Path] = {}
    for name, src in sources.items():
        if not src.is_dir():
            raise SystemExit(f"{src}: not found (the shared HTA sample traces are needed)")
        dst = out / "traces" / name
        dst.mkdir(parents=True, exist_ok=True)
        for trace in src.glob("*.json*"):
            if not (dst / trace.name).exists():
                shutil.copy2(trace, dst / trace.name)
        folders[name] = dst
    eight = out / "traces" / "8-ranks"
    eight.mkdir(parents=True, exist_ok=True)
    src_trace = next((SHARED / "df_index_resolver").glob("*.json.gz"))
    for rank in range(8):
        dst = eight / f"rank{rank}.json.gz"
        if not dst.exists():
            copy_as_rank(src_trace, dst, rank, 8)
    folders["8-ranks"] = eight
    return folders


def clear_analyzer_cache(folder: Path) -> None:
    """Delete the analyzer's parse cache of ``folder`` (beside the traces, see analyzer/cache.py)."""
    from analyzer.cache import CACHE_DIRNAME

    shutil.rmtree(folder / CACHE_DIRNAME, ignore_errors=True)


# ----------------------------------------------------------------- main
def measure(folder_name: str, folder: Path, tool: str, repeat: int, json_mb: float, out: Path) -> Measurement:
    if tool == "hta":
        cmd = [sys.executable, "-c", HTA_SCRIPT, str(folder)]
    else:
        if tool == "analyzer-cold":
            clear_analyzer_cache(folder)
        cmd = [str(BIN / "analyzer"), "report", str(folder), "--json", str(out / f"{folder_name}.report.json")]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    wall, peak, rc, err = run_measured(cmd, env)
    if rc != 0:
        print(f"  {tool} on {folder_name} exited {rc}: {err.strip().splitlines()[-1:] }", file=sys.stderr)
    m = Measurement(folder_name, tool, repeat, wall, peak / 2**20, json_mb, rc)
    print(f"  {folder_name:20s} {tool:14s} {wall:7.2f} s  {m.peak_rss_mb:8.0f} MB  {m.mb_per_s:7.1f} MB/s", flush=True)
    return m


def summarize(results: list[Measurement]) -> list[dict]:
    rows = []
    for folder in dict.fromkeys(m.folder for m in results):
        by_tool = {}
        for tool in ("hta", "analyzer-cold", "analyzer-warm"):
            ms = [m for m in results if m.folder == folder and m.tool == tool]
            if ms:
                by_tool[tool] = {
                    "wall_s": statistics.median(m.wall_s for m in ms),
                    "peak_rss_mb": statistics.median(m.peak_rss_mb for m in ms),
                    "mb_per_s": statistics.median(m.mb_per_s for m in ms),
                    "failed_runs": sum(m.returncode != 0 for m in ms),
                }
        hta, cold = by_tool.get("hta"), by_tool.get("analyzer-cold")
        json_mb = next(m.json_mb for m in results if m.folder == folder)
        row = {"folder": folder, "json_mb": json_mb, **by_tool}
        if hta and cold:
            row["speedup_cold"] = hta["wall_s"] / cold["wall_s"]
            row["rss_ratio_cold"] = cold["peak_rss_mb"] / hta["peak_rss_mb"]
        rows.append(row)
    return rows


def print_summary(rows: list[dict]) -> None:
    print()
    print(f"{'folder':20s} {'JSON MB':>8s} | {'HTA s':>7s} {'MB':>6s} | {'cold s':>7s} {'MB':>6s} {'MB/s':>6s} | "
          f"{'warm s':>7s} {'MB':>6s} | {'speedup':>7s} {'RSS ratio':>9s}")
    for r in rows:
        hta, cold, warm = r.get("hta", {}), r.get("analyzer-cold", {}), r.get("analyzer-warm", {})
        print(
            f"{r['folder']:20s} {r['json_mb']:8.1f} | {hta.get('wall_s', float('nan')):7.2f} {hta.get('peak_rss_mb', float('nan')):6.0f} | "
            f"{cold.get('wall_s', float('nan')):7.2f} {cold.get('peak_rss_mb', float('nan')):6.0f} {cold.get('mb_per_s', float('nan')):6.1f} | "
            f"{warm.get('wall_s', float('nan')):7.2f} {warm.get('peak_rss_mb', float('nan')):6.0f} | "
            f"{r.get('speedup_cold', float('nan')):6.1f}x {r.get('rss_ratio_cold', float('nan')):9.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs per tool and folder (median reported)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out", help="working folder (git-ignored)")
    parser.add_argument("--folders", nargs="*", help="subset of folder names to run")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    folders = prepare_folders(args.out)
    if args.folders:
        folders = {k: v for k, v in folders.items() if k in args.folders}
    sizes = {name: uncompressed_json_bytes(path) / 1e6 for name, path in folders.items()}
    print(f"machine: {os.cpu_count()} CPUs; folders: " + ", ".join(f"{k} ({v:.0f} MB JSON)" for k, v in sizes.items()))
    tools = ["hta", "analyzer-cold", "analyzer-warm"]
    results: list[Measurement] = []
    for repeat in range(args.repeats):
        # Alternate which tool goes first; warm always directly follows cold.
        order = tools if repeat % 2 == 0 else ["analyzer-cold", "analyzer-warm", "hta"]
        for name, path in folders.items():
            for tool in order:
                results.append(measure(name, path, tool, repeat, sizes[name], args.out))
    rows = summarize(results)
    print_summary(rows)
    (args.out / "bench_analyzer.json").write_text(
        json.dumps({"runs": [asdict(m) | {"mb_per_s": m.mb_per_s} for m in results], "summary": rows}, indent=2)
    )
    print(f"\nwrote {args.out / 'bench_analyzer.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
