"""Benchmark `analyzer report` against HTA on the same trace folders.

    .venv/bin/python bench/bench_analyzer.py [--repeats 3] [--out bench/out/analyzer] [--folders NAME ...]
    .venv/bin/python bench/bench_analyzer.py --quick    # the repository's example run, one repeat, no HTA

For every folder, interleaved in one run (HTA, analyzer cold, analyzer warm,
analyzer tables, then the next folder, rotated each repeat so neither tool always runs first
after the other's page-cache effects):

* **HTA**: a fresh Python process that builds
  ``TraceAnalysis(trace_dir=..., include_last_profiler_step=True)`` and calls
  ``get_comm_comp_overlap(visualize=False)`` and
  ``get_temporal_breakdown(visualize=False)``.
* **analyzer cold**: ``analyzer report DIR --json FILE`` as a subprocess
  after deleting the analyzer's parse cache (it writes the cache, as a
  user's first run does).
* **analyzer warm**: the same command again, with the caches present: the
  report cache answers (analyzer/verbs/report_cache.py: the previous report is
  replayed when no input, option or code changed; no pandas import).
* **analyzer tables**: the same command with the report cache entry
  deleted but the analyzer's cache kept (parsed traces and rank summaries,
  docs/loading.md): the reduce, the verbs and the rendering without any
  trace read (what a changed option, e.g. ``--top``, costs).

Every measurement is two runs of the command in the same cache state: a
timed run, unobserved, gives the wall time of the whole subprocess
(interpreter start and imports included, for both tools) and its CPU time
(user + system of the process and the descendants it waited for, from
getrusage; steadier than wall time on a busy machine); a second run gives
the peak memory of the whole process tree, sampled every 10 ms from /proc
(the sampler's CPU would slow the timed figure, and more so for a tool
that keeps both cores busy: bench/proctree.py, ``run_timed``), as summed PSS (pages shared between a
parent and its forked workers split between them, so the tree is not
double-counted) and as summed RSS (shared pages counted in every process),
and MB/s of uncompressed trace JSON over the wall time. The summary gives
the median over repeats.

Folders (``bench_load.prepare_cases``): the two largest shared HTA samples
and an 8-rank folder made by copying the largest one under rank ids 0..7
(``distributedInfo.rank`` and ``world_size`` rewritten), built once under
``--out``. The samples are HTA's own test data: where
``../shared/traces/hta-samples`` is absent (a clone of this repository has
no ``../shared``), get them with
``git clone --depth 1 https://github.com/facebookresearch/HolisticTraceAnalysis``
and link its ``tests/data`` there. Without them the benchmark times the
repository's example runs (``traces/``, copied under ``--out``) instead,
without HTA: they are CPU traces, and HTA's temporal breakdown fails on a
trace without GPU kernels. ``--quick`` does that for the first example run
with one repeat and no memory-sampled run, in a few seconds: a check that
the benchmark and the caches work, not a figure to quote. ``--before REF`` adds a fifth tool, **analyzer-before**: the
cold report by the code of git revision REF (exported with ``git archive``
(its ``analyzer`` and ``reftrain``, which the old analyzer imported) into ``--out``, byte-compiled like ``make install`` does, and run with the
same interpreter and libraries with that source first on ``sys.path``), in
the same cache state as analyzer cold, interleaved with it, so a change's
cost is read as a ratio from one run rather than from two sessions. The shared folders are read-only, so the analyzer's cache goes to
``$XDG_CACHE_HOME/trainperf``; the benchmark points ``XDG_CACHE_HOME`` into
``--out`` and empties it (and any ``.analyzer-cache`` beside the traces)
before each cold run. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SAMPLE_PERIOD_S = 0.01

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_load import SHARED, json_mb, prepare_cases  # noqa: E402  (the same trace folders as the loader benchmark)
from proctree import run_timed, run_tree  # noqa: E402

# The repository's own runs (traces/), timed when the shared HTA samples are absent.
REPO_RUNS = ("example-ddp-w2", "example-ddp-w2-slow-rank1")
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
    tool: str  # "hta" | "analyzer-cold" | "analyzer-warm" | "analyzer-tables" | "analyzer-before"
    repeat: int
    wall_s: float
    cpu_s: float
    peak_pss_mb: float
    peak_rss_mb: float
    json_mb: float
    returncode: int
    sampled_wall_s: float  # wall time of the run sampled for memory (slowed by the sampler)

    @property
    def mb_per_s(self) -> float:
        return self.json_mb / self.wall_s


def run_measured(
    cmd: list[str], env: dict[str, str], prepare, sample: bool = True
) -> tuple[float, float, float, float, int, str, float]:
    """Run ``cmd`` twice, ``prepare()`` (the cache state) before each: once
    timed without sampling, once sampled for memory (proctree.run_timed
    says why). (wall s, CPU s, peak tree PSS bytes, peak tree RSS bytes,
    returncode, stderr tail, wall s of the sampled run). Without ``sample``
    the timed run only, and NaN for the memory and the sampled run."""
    prepare()
    t = run_timed(cmd, env, REPO)
    if not sample:
        nan = float("nan")
        return t.wall_s, t.cpu_s, nan, nan, t.returncode, t.stderr.decode(errors="replace")[-2000:], nan
    prepare()
    r = run_tree(cmd, env, REPO, SAMPLE_PERIOD_S)
    rc = t.returncode or r.returncode
    err = (t.stderr if t.returncode else r.stderr).decode(errors="replace")[-2000:]
    return t.wall_s, t.cpu_s, r.peak_pss_bytes, r.peak_rss_bytes, rc, err, r.wall_s


def clear_analyzer_cache(folder: Path, user_cache: Path) -> None:
    """Delete the analyzer's parse cache of ``folder``: beside the traces and in the user cache."""
    from analyzer.ingest.cache import CACHE_DIRNAME

    shutil.rmtree(folder / CACHE_DIRNAME, ignore_errors=True)
    shutil.rmtree(user_cache, ignore_errors=True)


def clear_report_cache(folder: Path, user_cache: Path) -> None:
    """Delete the cached reports of ``folder``, keeping the parsed tables."""
    from analyzer.ingest.locate import CACHE_DIRNAME

    for where in (folder / CACHE_DIRNAME, user_cache / "trainperf"):
        for entry in where.glob("report.*.json"):
            entry.unlink()


def export_revision(ref: str, out: Path) -> Path:
    """The source tree of git revision ``ref`` under ``out`` (exported once), byte-compiled."""
    rev = subprocess.run(
        ["git", "rev-parse", "--short", ref], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()
    src = out / f"before-{rev}"
    if not (src / "reftrain").is_dir():
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "archive", rev, "analyzer", "reftrain"], cwd=REPO, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
        # An editable install gets its bytecode from `make install`'s compileall; give the old tree the same.
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(src)], check=True)
    return src


BEFORE_SCRIPT = "import sys; sys.path.insert(0, sys.argv.pop(1)); sys.argv[0] = 'analyzer'; from analyzer.cli import console_main; sys.exit(console_main())"


# ----------------------------------------------------------------- main
def choose_folders(out: Path, quick: bool, shared: Path = SHARED) -> tuple[dict[str, Path], bool]:
    """The folders to time and whether HTA runs on them: the shared HTA samples when present (and not
    ``quick``); else copies under ``out`` of the repository's example runs, without HTA (module docstring)."""
    if not quick and shared.is_dir():
        return prepare_cases(out), True
    if not quick:
        print(
            f"{shared}: not found; timing the repository's example runs without HTA. For the HTA comparison: "
            "git clone --depth 1 https://github.com/facebookresearch/HolisticTraceAnalysis and link its "
            f"tests/data as {shared}",
            file=sys.stderr,
        )
    folders = {}
    for name in REPO_RUNS[:1] if quick else REPO_RUNS:
        # A copy: the analyzer's caches go beside the traces, which must not land in the working tree.
        folders[name] = out / "repo-runs" / name
        if not folders[name].is_dir():
            shutil.copytree(REPO / "traces" / name, folders[name], ignore=shutil.ignore_patterns(".analyzer-cache"))
    return folders, False


def measure(
    folder_name: str,
    folder: Path,
    tool: str,
    repeat: int,
    json_mb: float,
    out: Path,
    before_src: Path | None = None,
    sample: bool = True,
) -> Measurement:
    user_cache = out / "xdg-cache"
    env = dict(os.environ, PYTHONWARNINGS="ignore", XDG_CACHE_HOME=str(user_cache))
    prepare = lambda: None  # noqa: E731
    if tool == "hta":
        cmd = [sys.executable, "-c", HTA_SCRIPT, str(folder)]
    else:
        if tool in ("analyzer-cold", "analyzer-before"):
            prepare = lambda: clear_analyzer_cache(folder, user_cache)  # noqa: E731
        elif tool == "analyzer-tables":
            prepare = lambda: clear_report_cache(folder, user_cache)  # noqa: E731
        cmd = [str(BIN / "analyzer"), "report", str(folder), "--json", str(out / f"{folder_name}.report.json")]
        if tool == "analyzer-before":
            cmd = [
                sys.executable,
                "-c",
                BEFORE_SCRIPT,
                str(before_src),
                *cmd[1:3],
                "--json",
                str(out / f"{folder_name}.before.json"),
            ]
    wall, cpu, pss, rss, rc, err, sampled_wall = run_measured(cmd, env, prepare, sample)
    if rc != 0:
        print(f"  {tool} on {folder_name} exited {rc}: {err.strip().splitlines()[-1:]}", file=sys.stderr)
    m = Measurement(folder_name, tool, repeat, wall, cpu, pss / 2**20, rss / 2**20, json_mb, rc, sampled_wall)
    print(
        f"  {folder_name:20s} {tool:14s} {wall:7.2f} s  cpu {cpu:7.2f} s  PSS {m.peak_pss_mb:6.0f} MB  RSS {m.peak_rss_mb:6.0f} MB  "
        f"{m.mb_per_s:6.1f} MB/s  (sampled run {sampled_wall:5.2f} s)",
        flush=True,
    )
    return m


def summarize(results: list[Measurement]) -> list[dict]:
    rows = []
    for folder in dict.fromkeys(m.folder for m in results):
        by_tool = {}
        for tool in ("hta", "analyzer-cold", "analyzer-warm", "analyzer-tables", "analyzer-before"):
            ms = [m for m in results if m.folder == folder and m.tool == tool]
            if ms:
                by_tool[tool] = {
                    "wall_s": statistics.median(m.wall_s for m in ms),
                    "sampled_wall_s": statistics.median(m.sampled_wall_s for m in ms),
                    "cpu_s": statistics.median(m.cpu_s for m in ms),
                    "peak_pss_mb": statistics.median(m.peak_pss_mb for m in ms),
                    "peak_rss_mb": statistics.median(m.peak_rss_mb for m in ms),
                    "mb_per_s": statistics.median(m.mb_per_s for m in ms),
                    "failed_runs": sum(m.returncode != 0 for m in ms),
                }
        hta, cold = by_tool.get("hta"), by_tool.get("analyzer-cold")
        json_mb = next(m.json_mb for m in results if m.folder == folder)
        row = {"folder": folder, "json_mb": json_mb, **by_tool}
        if hta and cold:
            row["speedup_cold"] = hta["wall_s"] / cold["wall_s"]
            row["cpu_speedup_cold"] = hta["cpu_s"] / cold["cpu_s"]
            row["pss_ratio_cold"] = cold["peak_pss_mb"] / hta["peak_pss_mb"]
            row["rss_ratio_cold"] = cold["peak_rss_mb"] / hta["peak_rss_mb"]
        before = by_tool.get("analyzer-before")
        if before and cold:
            row["cold_over_before"] = cold["wall_s"] / before["wall_s"]
            row["cold_over_before_cpu"] = cold["cpu_s"] / before["cpu_s"]
            row["cold_over_before_per_repeat"] = [
                c.wall_s / b.wall_s
                for c in results
                if c.folder == folder and c.tool == "analyzer-cold"
                for b in results
                if b.folder == folder and b.tool == "analyzer-before" and b.repeat == c.repeat
            ]
        rows.append(row)
    return rows


def print_summary(rows: list[dict]) -> None:
    nan = float("nan")
    print()
    print(
        f"{'folder':18s} {'JSON MB':>7s} | {'HTA s':>6s} {'cpu s':>6s} {'PSS MB':>6s} {'RSS MB':>6s} | {'cold s':>6s} "
        f"{'cpu s':>6s} {'PSS MB':>6s} {'RSS MB':>6s} {'MB/s':>5s} | {'warm s':>6s} {'cpu s':>6s} | {'tables s':>8s} | "
        f"{'speedup':>7s} {'cpu x':>6s} {'PSS/HTA':>7s} {'RSS/HTA':>7s}"
    )
    for r in rows:
        h, c, w = r.get("hta", {}), r.get("analyzer-cold", {}), r.get("analyzer-warm", {})
        t = r.get("analyzer-tables", {})
        print(
            f"{r['folder']:18s} {r['json_mb']:7.1f} | {h.get('wall_s', nan):6.2f} {h.get('cpu_s', nan):6.2f} "
            f"{h.get('peak_pss_mb', nan):6.0f} {h.get('peak_rss_mb', nan):6.0f} | {c.get('wall_s', nan):6.2f} "
            f"{c.get('cpu_s', nan):6.2f} {c.get('peak_pss_mb', nan):6.0f} {c.get('peak_rss_mb', nan):6.0f} "
            f"{c.get('mb_per_s', nan):5.1f} | {w.get('wall_s', nan):6.2f} {w.get('cpu_s', nan):6.2f} | "
            f"{t.get('wall_s', nan):8.2f} | "
            f"{r.get('speedup_cold', nan):6.1f}x {r.get('cpu_speedup_cold', nan):5.1f}x "
            f"{r.get('pss_ratio_cold', nan):7.2f} {r.get('rss_ratio_cold', nan):7.2f}"
        )
    if any("cold_over_before" in r for r in rows):
        print(
            f"\n{'folder':18s} | {'before s':>8s} {'cpu s':>6s} {'PSS MB':>6s} | {'cold s':>6s} | {'cold/before':>11s} {'cpu':>5s} | per repeat"
        )
        for r in rows:
            b, c = r.get("analyzer-before", {}), r.get("analyzer-cold", {})
            per = ", ".join(f"{x:.2f}" for x in r.get("cold_over_before_per_repeat", []))
            print(
                f"{r['folder']:18s} | {b.get('wall_s', nan):8.2f} {b.get('cpu_s', nan):6.2f} {b.get('peak_pss_mb', nan):6.0f} | "
                f"{c.get('wall_s', nan):6.2f} | {r.get('cold_over_before', nan):11.2f} {r.get('cold_over_before_cpu', nan):5.2f} | {per}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs per tool and folder (median reported)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the repository's first example run, one repeat, without HTA or memory sampling",
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench" / "out" / "analyzer", help="working folder (git-ignored)"
    )
    parser.add_argument("--folders", nargs="*", help="subset of folder names to run")
    parser.add_argument(
        "--before",
        metavar="REF",
        help="also time the cold report of git revision REF, interleaved (a change's cost as a ratio)",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    folders, with_hta = choose_folders(args.out, args.quick)
    repeats = 1 if args.quick else args.repeats
    if args.folders:
        folders = {k: v for k, v in folders.items() if k in args.folders}
    # A run directory keeps its traces in traces/ (docs/rundir.md); a trace folder at its top.
    sizes = {name: json_mb(path / "traces" if (path / "traces").is_dir() else path) for name, path in folders.items()}
    print(f"machine: {os.cpu_count()} CPUs; folders: " + ", ".join(f"{k} ({v:.0f} MB JSON)" for k, v in sizes.items()))
    before_src = export_revision(args.before, args.out) if args.before else None
    hta = ["hta"] if with_hta else []
    analyzer = ["analyzer-cold", "analyzer-warm", "analyzer-tables"]
    before = ["analyzer-before"] if before_src else []
    results: list[Measurement] = []
    for repeat in range(repeats):
        # Alternate which tool goes first; warm and tables always follow cold.
        order = hta + analyzer + before if repeat % 2 == 0 else before + analyzer + hta
        for name, path in folders.items():
            for tool in order:
                results.append(
                    measure(name, path, tool, repeat, sizes[name], args.out, before_src, sample=not args.quick)
                )
    rows = summarize(results)
    print_summary(rows)
    (args.out / "bench_analyzer.json").write_text(
        json.dumps({"runs": [asdict(m) | {"mb_per_s": m.mb_per_s} for m in results], "summary": rows}, indent=2)
    )
    print(f"\nwrote {args.out / 'bench_analyzer.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
