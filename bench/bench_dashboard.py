"""Time to first full render of a dashboard run page, in a real browser.

Three inputs:

  2-rank run        traces/example-ddp-w2, a real reftrain run directory
  8-rank folder     one Kineto trace copied under rank ids 0..7 (its
                    distributedInfo rewritten), default the example's rank 0
                    trace; ``--trace FILE`` picks another (e.g. a GPU trace)
  1,024-rank folder bench/bench_scale.py's generator (``make_folder``): one
                    profiler step of the shared NCCL trace tiled into 6 steps,
                    its device events only (3.9 MB of JSON, 0.35 MB gzipped per
                    rank; 358 MB on disk, 1.1 GB with the analyzer's caches
                    beside it), per-rank jitter, a planted
                    straggler (rank 342). Generated once into
                    ``--runs`` (about a minute on 2 cores) and reused while its
                    generator options match; before any timing its rank
                    summaries and finished analysis are built (the analyzer's
                    cost, docs/scale.md), so no state of this input re-parses
                    traces: it has no ``cold`` state. ``--no-1024`` leaves it out.

Three cache states per input, each measured ``--repeat`` times:

  cold         fresh `dashboard` server, no analyzer parse cache (the
               traces are parsed from JSON) and a fresh browser profile (the
               Streamlit frontend's JavaScript is downloaded and compiled)
  server-cold  fresh server, parse cache present (a restarted dashboard),
               fresh browser profile
  warm         the same server and browser profile, the page opened again
               in a new tab: Streamlit's cache holds the analysis and the
               browser its JavaScript (reloading, opening a link)
  switch       in that tab, to the Stragglers page and back through the
               sidebar, timing the way back: a page switch inside the app
               (no new frontend, no new session)
  from-runs    in a new tab on the Runs page, the run's row selected in the
               runs table: from the click to the complete run page (the
               table switches pages inside the app)

and ``script``: the page's Python script alone with warm caches, under
streamlit.testing.AppTest, without a browser: the server's share of a warm
render; ``pages``: the same for each run page that must work at 1,024
ranks (runs table, overview, stragglers, communication, timeline), first
run (the server's first request for the page, analysis cached) and warm. On a shared machine wall times grow with the load, so the bench
also reports ``warm-cpu``: CPU seconds that this process's descendants
(the dashboard server, Playwright's driver, chromium) spent during the warm
render, read from /proc; on an idle machine with N free cores the wall
time is at least warm-cpu / N.

"First full render" is the time from navigation to ``/overview?run=NAME``
until the run page is complete: the headline metrics are shown, as many
charts as the page script draws (counted under AppTest) have drawn (Plotly
its SVG, Vega-Lite its SVG or canvas), the last section (raw trace
downloads) is present and Streamlit no longer reports the script running.
The browser is Debian's chromium driven by Playwright (headless), like the
e2e test, with a persistent profile in a fresh folder per input and state
(HTTP and V8 code caches on disk, as in a user's browser); ``--incognito``
uses Playwright's incognito contexts instead. Neither the server start
nor the browser start is timed. Goal: under 3 s cold and under 1 s
warm on a 2-core machine.

    .venv/bin/python bench/bench_dashboard.py [--repeat 3] [--incognito] [--trace FILE] [--no-1024] [--json bench/out/dashboard.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from dashboard_support import CHROMIUM, CHROMIUM_ARGS, start_dashboard, stop_dashboard  # noqa: E402

EXAMPLE_RUN = REPO / "traces" / "example-ddp-w2"
BIG = "folder-1024rank"
BIG_WORLD = 1024
PAGES = ("runs", "overview", "stragglers", "communication", "timeline")
TIMEOUT_MS = 300_000
# Complete: the script is not running, the headline metrics and the last
# section are shown and `n` charts (the number the page script draws, counted
# under AppTest) have drawn: Plotly its SVG, Vega-Lite its SVG or a sized
# canvas. The probe runs every 50 ms in the page, so it reads textContent and
# attributes only (innerText and getBoundingClientRect force a layout).
_DONE_JS = """n => {
  const running = document.querySelector('[data-testid="stStatusWidget"]');
  if (running && running.textContent.includes('Running')) return false;
  if (!document.querySelector('[data-testid="stMetric"]')) return false;
  if (!Array.from(document.querySelectorAll('h3')).some(h => h.textContent.includes('Raw traces'))) return false;
  const plotly = Array.from(document.querySelectorAll('[data-testid="stPlotlyChart"]'))
    .filter(c => c.querySelector('.main-svg')).length;
  const vega = Array.from(document.querySelectorAll('[data-testid="stVegaLiteChart"]'))
    .filter(c => c.querySelector('svg.marks[height]:not([height="0"]), canvas[height]:not([height="0"])')).length;
  return plotly + vega >= n;
}"""
_SCRIPT_IDLE_JS = """() => {
  const running = document.querySelector('[data-testid="stStatusWidget"]');
  return !(running && running.textContent.includes('Running'));
}"""
_PLOTLY_DRAWN_JS = """() => {
  const running = document.querySelector('[data-testid="stStatusWidget"]');
  if (running && running.textContent.includes('Running')) return false;
  if (!Array.from(document.querySelectorAll('h3')).some(h => h.textContent.includes('Evidence per rank'))) return false;
  const charts = Array.from(document.querySelectorAll('[data-testid="stPlotlyChart"]'));
  return charts.every(c => c.querySelector('.main-svg'));
}"""
_NO_RAW_TRACES_JS = "() => !Array.from(document.querySelectorAll('h3')).some(h => h.textContent.includes('Raw traces'))"


def make_rank_folder(trace: Path, dst: Path, world: int) -> None:
    """`world` copies of one trace, each claiming its own rank."""
    raw = trace.read_bytes()
    doc = orjson.loads(gzip.decompress(raw) if trace.name.endswith(".gz") else raw)
    dst.mkdir(parents=True)
    for rank in range(world):
        info = dict(doc.get("distributedInfo") or {})
        info.update(rank=rank, world_size=world)
        doc["distributedInfo"] = info
        (dst / f"rank{rank}.json.gz").write_bytes(gzip.compress(orjson.dumps(doc), compresslevel=1))


def drop_analyzer_caches(root: Path, keep: tuple[str, ...] = ()) -> None:
    """Remove the analyzer's caches below `root`, except in the runs named in `keep`."""
    for cache in root.rglob(".analyzer-cache"):
        if not any(cache.is_relative_to(root / name) for name in keep):
            shutil.rmtree(cache)


def make_big_folder(runs: Path) -> dict:
    """The 1,024-rank folder (bench_scale's generator), reused while its options match.

    bench_scale writes its generator record beside the folder; here that would
    be a .json file in the runs folder, which the dashboard would take for a
    trace folder, so the record is kept one level up.
    """
    sys.path.insert(0, str(REPO / "bench"))
    import bench_scale

    options = dict(steps=6, events_kind="device", delay_frac=0.10, jitter_ms=0.5, straggler=None, seed=12)
    record = runs.parent / f"{BIG}.generator.json"
    want = {
        "version": bench_scale.GENERATOR_VERSION,
        "trace": str(bench_scale.DEFAULT_TRACE),
        "world": BIG_WORLD,
        "steps": 6,
        "events": "device",
        "delay_frac": 0.10,
        "jitter_ms": 0.5,
        "straggler": BIG_WORLD // 3 + 1,
        "seed": 12,
    }
    if record.exists() and (runs / BIG).is_dir():
        old = json.loads(record.read_text())
        if old.get("options") == want:
            return old
    info = bench_scale.make_folder(bench_scale.DEFAULT_TRACE, runs / BIG, BIG_WORLD, **options)
    shutil.move(str(runs / f"{BIG}.generator.json"), str(record))
    return info


def build_summaries(folder: Path) -> list[float]:
    """Analyze `folder` until the analysis is stored (parse cache, rank summaries, then the
    finished analysis: analyzer/runcache.py), in a child process; seconds per pass."""
    code = (
        "import sys, time; from analyzer.api import analyze\n"
        "for _ in range(3):\n"
        "    t = time.perf_counter(); a = analyze(sys.argv[1]); print(round(time.perf_counter() - t, 2), a.stragglers.ranks)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(folder)], capture_output=True, text=True, check=True, cwd=REPO
    )
    return [float(line.split()[0]) for line in out.stdout.splitlines() if line.strip()]


def _descendants_cpu_s(root: int) -> float:
    """utime + stime (+ children's, once reaped) of every live descendant of `root`."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "
        ppid = int(fields[1])
        ticks = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        stats[int(entry)] = (ppid, ticks / os.sysconf("SC_CLK_TCK"))
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        total += stats[pid][1]
        todo += children.get(pid, [])
    return total


def switch_back_s(context, url: str, n_charts: int) -> float:
    """Open `url` (the overview), go to Stragglers in the sidebar, time the way back."""
    page = context.new_page()
    try:
        page.goto(url, wait_until="commit")
        page.wait_for_function(_DONE_JS, arg=n_charts, timeout=TIMEOUT_MS, polling=50)
        nav = page.locator('[data-testid="stSidebarNav"]')
        nav.get_by_text("Stragglers").click()
        page.get_by_role("heading", name="Stragglers").wait_for(timeout=TIMEOUT_MS)
        page.wait_for_function(_NO_RAW_TRACES_JS, timeout=TIMEOUT_MS)
        # Let the Stragglers page finish (its Plotly charts load a 4.7 MB
        # bundle): switching back while that still runs timed the bundle,
        # 2.2-3.1 s in one repeat of three.
        page.wait_for_function(_PLOTLY_DRAWN_JS, timeout=TIMEOUT_MS, polling=50)
        t0 = time.perf_counter()
        nav.get_by_text("Overview").click()
        page.wait_for_function(_DONE_JS, arg=n_charts, timeout=TIMEOUT_MS, polling=50)
        return time.perf_counter() - t0
    finally:
        page.close()


def from_runs_s(context, base: str, name: str, n_charts: int) -> float:
    """Open the Runs page, select `name`'s row in the table, time until its
    run page is complete (the switch happens inside the app)."""
    page = context.new_page()
    try:
        page.goto(base + "/", wait_until="commit")
        grid = page.locator('[data-testid="stDataFrame"]').first
        grid.wait_for(state="visible", timeout=TIMEOUT_MS)
        page.wait_for_function(
            "name => document.querySelector('[data-testid=\"stDataFrame\"]').innerHTML.includes(name)",
            arg=name,
            timeout=TIMEOUT_MS,
        )
        page.wait_for_function(_SCRIPT_IDLE_JS, timeout=TIMEOUT_MS, polling=50)
        rows = grid.locator("table tbody tr").evaluate_all(
            "rows => rows.map(r => [...r.querySelectorAll('td')].map(td => td.textContent))"
        )
        row = next(i for i, cells in enumerate(rows) if name in cells)
        box = grid.bounding_box()
        t0 = time.perf_counter()
        # The grid is a canvas: click the row's selection marker (35 px rows, header included).
        page.mouse.click(box["x"] + 14, box["y"] + 35 * (row + 1) + 17)
        page.wait_for_function(_DONE_JS, arg=n_charts, timeout=TIMEOUT_MS, polling=50)
        return time.perf_counter() - t0
    finally:
        page.close()


def render_s(context, url: str, n_charts: int) -> float:
    """Seconds from navigation to a complete run page, in a new page (a new
    Streamlit session) of the browser context."""
    page = context.new_page()
    try:
        t0 = time.perf_counter()
        page.goto(url, wait_until="commit")
        page.wait_for_function(_DONE_JS, arg=n_charts, timeout=TIMEOUT_MS, polling=50)
        return time.perf_counter() - t0
    finally:
        page.close()


def open_browser(p, profile: Path | None):
    """A browser context: a persistent profile in `profile` (as a user's
    browser: HTTP cache and V8 code cache on disk), or, with None, an
    incognito context of a fresh browser (Playwright's default: no code
    cache). Returns (context, closer)."""
    common = dict(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
    viewport = {"width": 1400, "height": 1000}
    if profile is not None:
        context = p.chromium.launch_persistent_context(str(profile), viewport=viewport, **common)
        return context, context.close
    browser = p.chromium.launch(**common)
    context = browser.new_context(viewport=viewport)

    def close() -> None:
        context.close()
        browser.close()

    return context, close


def bench(
    runs: Path, names: list[str], n_charts: dict[str, int], repeat: int, log_dir: Path, incognito: bool
) -> dict[str, dict[str, list[float]]]:
    from playwright.sync_api import sync_playwright

    out: dict[str, dict[str, list[float]]] = {
        n: {"cold": [], "server-cold": [], "warm": [], "warm-cpu": [], "switch": [], "from-runs": []} for n in names
    }
    with sync_playwright() as p:
        for i in range(repeat):
            for state in ("cold", "server-cold"):
                if state == "cold":
                    drop_analyzer_caches(runs, keep=(BIG,))
                proc, base = start_dashboard(runs, log_dir / f"server-{i}-{state}.log")
                try:
                    for name in names:
                        if state == "cold" and name == BIG:
                            continue  # its traces are never parsed again (module docstring)
                        url = f"{base}/overview?run={quote(name)}"
                        # A fresh browser and profile per input: empty HTTP and code caches.
                        # One browser at a time; its start is not timed.
                        with tempfile.TemporaryDirectory(prefix="bench-profile-", dir=log_dir) as profile:
                            context, close = open_browser(p, None if incognito else Path(profile))
                            try:
                                out[name][state].append(render_s(context, url, n_charts[name]))
                                if state == "server-cold":
                                    cpu0 = _descendants_cpu_s(os.getpid())
                                    out[name]["warm"].append(render_s(context, url, n_charts[name]))
                                    out[name]["warm-cpu"].append(_descendants_cpu_s(os.getpid()) - cpu0)
                                    out[name]["switch"].append(switch_back_s(context, url, n_charts[name]))
                                    out[name]["from-runs"].append(from_runs_s(context, base, name, n_charts[name]))
                            finally:
                                close()
                finally:
                    stop_dashboard(proc)
    return out


def _overview_apptest(runs: Path, name: str):
    from streamlit.testing.v1 import AppTest

    from dashboard.cli import APP_PATH, RUNS_DIR_ENV

    os.environ[RUNS_DIR_ENV] = str(runs)
    at = AppTest.from_file(str(APP_PATH), default_timeout=TIMEOUT_MS / 1e3)
    at.query_params["run"] = name
    at.switch_page("views/overview.py")
    return at


def charts_on_page(runs: Path, name: str) -> int:
    """How many charts the overview script draws for `name` (Plotly and Vega-Lite)."""
    at = _overview_apptest(runs, name).run()
    return len(at.get("plotly_chart")) + len(at.get("vega_lite_chart")) + len(at.get("arrow_vega_lite_chart"))


def script_s(runs: Path, name: str, repeat: int) -> list[float]:
    """The overview script's own time with warm caches (AppTest, no browser)."""
    at = _overview_apptest(runs, name)
    at.run()  # fills the caches
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        at.run()
        times.append(time.perf_counter() - t0)
    return times


def pages_s(runs: Path, name: str, repeat: int) -> dict[str, dict[str, float]]:
    """Each page of PAGES for `name` under AppTest (no browser): its first script run in a
    fresh session with the analysis cached (as after any other page), and the median warm rerun."""
    from streamlit.testing.v1 import AppTest

    from dashboard.cli import APP_PATH, RUNS_DIR_ENV

    os.environ[RUNS_DIR_ENV] = str(runs)
    out: dict[str, dict[str, float]] = {}
    for page in PAGES:
        at = AppTest.from_file(str(APP_PATH), default_timeout=TIMEOUT_MS / 1e3)
        at.query_params["run"] = name
        if page != "runs":
            at.switch_page(f"views/{page}.py")
        t0 = time.perf_counter()
        at.run()
        first = time.perf_counter() - t0
        if at.exception:
            raise RuntimeError(f"{page} of {name}: {[e.value for e in at.exception]}")
        warm = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            at.run()
            warm.append(time.perf_counter() - t0)
        out[page] = {"first": first, "warm": statistics.median(warm)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--trace", type=Path, default=EXAMPLE_RUN / "traces" / "rank0.step7.json.gz")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "out" / "dashboard.json")
    parser.add_argument(
        "--runs",
        type=Path,
        default=REPO / "bench" / "out" / "dashboard" / "runs",
        help="the runs folder (git-ignored; the 1,024-rank folder is generated here once)",
    )
    parser.add_argument("--no-1024", dest="big", action="store_false", help="leave the 1,024-rank folder out")
    parser.add_argument(
        "--incognito",
        action="store_true",
        help="Playwright's incognito contexts (no V8 code cache) instead of a persistent browser profile",
    )
    args = parser.parse_args(argv)
    if not CHROMIUM.exists():
        print(f"bench_dashboard: {CHROMIUM} not found (apt-get install chromium)", file=sys.stderr)
        return 2
    runs = args.runs.resolve()
    runs.mkdir(parents=True, exist_ok=True)
    for name in ("run-2rank", "folder-8rank"):  # rebuilt every time: the cold state drops their caches
        shutil.rmtree(runs / name, ignore_errors=True)
    shutil.copytree(EXAMPLE_RUN, runs / "run-2rank", ignore=shutil.ignore_patterns(".analyzer-cache"))
    make_rank_folder(args.trace, runs / "folder-8rank", 8)
    names = ["run-2rank", "folder-8rank"]
    big: dict = {}
    if args.big:
        t0 = time.perf_counter()
        big["generator"] = make_big_folder(runs)
        big["generate_s"] = round(time.perf_counter() - t0, 1)
        big["analyze_passes_s"] = build_summaries(runs / BIG)
        print(
            f"{BIG}: ready in {big['generate_s']} s (generator reused when 0), analyses before timing "
            f"{big['analyze_passes_s']} s (parse + summaries, from summaries, stored)",
            flush=True,
        )
        names.append(BIG)
    elif (runs / BIG).exists():
        shutil.move(str(runs / BIG), str(runs.parent / f".{BIG}.aside"))  # out of the runs table; put back below
    try:
        with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as tmp:
            n_charts = {name: charts_on_page(runs, name) for name in names}
            results = bench(runs, names, n_charts, args.repeat, Path(tmp), args.incognito)
            pages = {}
            for name in names:
                results[name]["script"] = script_s(runs, name, args.repeat)
                if name != "run-2rank":
                    pages[name] = pages_s(runs, name, args.repeat)
    finally:
        if (runs.parent / f".{BIG}.aside").exists():
            shutil.move(str(runs.parent / f".{BIG}.aside"), str(runs / BIG))
    load = os.getloadavg()[0]
    profile = "incognito contexts" if args.incognito else "persistent browser profile"
    print(
        f"time to first full render of /overview (s), median of {args.repeat}; trace for 8 ranks: {args.trace.name}; "
        f"{profile}; charts per page {n_charts}; load average {load:.1f} on {os.cpu_count()} CPUs"
    )
    print(
        f"{'input':<16}{'cold':>8}{'server-cold':>12}{'warm':>8}{'warm-cpu':>10}{'switch':>8}{'from-runs':>10}{'script':>8}"
    )
    summary = {}

    def cell(v: float | None, width: int) -> str:
        return f"{v:>{width}.2f}" if v is not None else f"{'n/a':>{width}}"

    for name, states in results.items():
        med = {s: (statistics.median(v) if v else None) for s, v in states.items()}
        summary[name] = {"median_s": med, "samples_s": states}
        print(
            f"{name:<16}{cell(med['cold'], 8)}{cell(med['server-cold'], 12)}{cell(med['warm'], 8)}{cell(med['warm-cpu'], 10)}"
            f"{cell(med['switch'], 8)}{cell(med['from-runs'], 10)}{cell(med['script'], 8)}"
        )
    if BIG in summary:
        small = summary["folder-8rank"]["median_s"]
        ratio = {
            s: (v / small[s] if v is not None and small.get(s) else None) for s, v in summary[BIG]["median_s"].items()
        }
        summary[BIG]["ratio_to_8rank"] = ratio
        print(
            f"{'1024 / 8 ranks':<16}{cell(ratio['cold'], 8)}{cell(ratio['server-cold'], 12)}{cell(ratio['warm'], 8)}"
            f"{cell(ratio['warm-cpu'], 10)}{cell(ratio['switch'], 8)}{cell(ratio['from-runs'], 10)}{cell(ratio['script'], 8)}"
        )
    print("page scripts under AppTest (s): first run / warm rerun")
    for name, per_page in pages.items():
        print(f"{name:<16}" + "  ".join(f"{page} {t['first']:.2f}/{t['warm']:.2f}" for page, t in per_page.items()))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "trace": str(args.trace),
                "repeat": args.repeat,
                "profile": profile,
                "charts": n_charts,
                "load_average": load,
                "results": summary,
                "pages": pages,
                "big": big,
            },
            indent=2,
        )
    )
    print(f"written {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
