"""Analyzer time and memory vs world size: N-rank folders made from one real trace.

The folders: one profiler step of a real NCCL rank trace (default
../shared/traces/hta-samples/nccl_parser_config/nccl_data.json.gz, an A100
rank of a 2-rank NCCL job), tiled into ``--steps`` consecutive steps and
written once per rank, gzipped (level 1), with ``distributedInfo.rank`` and
``world_size`` set (and the default process group's ``ranks``/``pg_size``).

* Per-rank trace size: ``--events device`` (default) keeps the step's
  device events (kernels, memcpy, memset), its ``ProfilerStep#`` range and
  the trace's metadata, and drops the host-side ops, runtime calls and flow
  events (about 92 % of the events; the analyzer's device metrics, the
  comm-kernel arrivals and the straggler verdict need only the kept ones);
  ``--events all`` keeps every event of the step. What each choice means for
  disk and time at N = 1,024 is printed and written to the JSON.
* Steps are ``period = step duration + 20 %`` apart on every rank (one
  common clock, as the analyzer assumes for traces). Per-rank jitter: each
  rank's step s starts ``U(0, --jitter-ms)`` late (seeded by rank and step),
  its events shifted with it.
* The planted straggler (rank ``N // 3 + 1``, or ``--straggler``): every
  event of each of its steps after the step's start is shifted by
  ``--delay-frac`` (default 10 %) of the step duration and its
  ``ProfilerStep`` is that much longer, so it starts every collective late
  and its step time is longer: both straggler signals see it.

Measured per (N, engine): ``analyzer report --no-cache --json`` (no parse or
report cache: every trace parsed) as a child process, its process tree
sampled from /proc every ``--period-s``: wall time, the driver's (the
``analyzer`` process's) peak RSS, the largest peak RSS of any other process
of the tree (a parse worker; for Ray, Ray's workers and daemons), and the
tree's peak summed RSS. The straggler the JSON report names must be the
planted one at every N. Engines: ``local`` always; ``ray`` when ``analyzer
report --help`` offers ``--engine`` and Ray imports.

    .venv/bin/python bench/bench_scale.py                       # N = 8, 64, 256, 1024
    .venv/bin/python bench/bench_scale.py --ranks 8 64 --engines local
    .venv/bin/python bench/bench_scale.py --generate-only --ranks 1024 --out bench/out/scale

Folders live under ``--out`` (default bench/out/scale; git-ignored) as
``w{N}/`` and are reused when ``w{N}.generator.json`` beside them matches the options;
results go to ``--out/results.json``. Tables: docs/scale.md.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from proctree import _children, _pss_rss  # noqa: E402

DEFAULT_TRACE = REPO.parent / "shared" / "traces" / "hta-samples" / "nccl_parser_config" / "nccl_data.json.gz"
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
GENERATOR_VERSION = 1


# ---------------------------------------------------------------------------
# Folder generation
# ---------------------------------------------------------------------------


def _step_ranges(events: list[dict]) -> list[dict]:
    return sorted(
        (e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")),
        key=lambda e: e["ts"],
    )


def base_step(trace: Path, events_kind: str) -> tuple[dict, dict, list[dict]]:
    """(trace document without events, the ProfilerStep range, the step's events)
    of the trace's middle profiler step. Events are those whose start lies in
    the step (device events: in the step's span, which they may outlast)."""
    raw = trace.read_bytes()
    doc = orjson.loads(gzip.decompress(raw) if trace.name.endswith(".gz") else raw)
    events = doc.pop("traceEvents")
    steps = _step_ranges(events)
    if not steps:
        raise SystemExit(f"bench_scale: {trace}: no ProfilerStep# ranges to tile")
    step = steps[len(steps) // 2]
    lo, hi = step["ts"], step["ts"] + step["dur"]
    meta = [e for e in events if e.get("ph") == "M"]
    body = []
    for e in events:
        if e is step or e.get("ph") == "M" or "ts" not in e:
            continue
        if not lo <= float(e["ts"]) < hi:
            continue
        if str(e.get("name", "")).startswith("ProfilerStep#"):
            continue
        if events_kind == "device" and e.get("cat") not in DEVICE_CATS:
            continue
        body.append(e)
    doc["traceEvents"] = meta
    return doc, step, body


def _shift(e: dict, dt: float, step_no: int, ids: int) -> dict:
    out = dict(e)
    out["ts"] = e["ts"] + dt
    args = e.get("args")
    if args and ("correlation" in args or "External id" in args):
        args = dict(args)
        for k in ("correlation", "External id", "Ev Idx"):
            if isinstance(args.get(k), int):
                args[k] = args[k] + ids * step_no
        out["args"] = args
    if "id" in e and isinstance(e["id"], int):
        out["id"] = e["id"] + ids * step_no
    return out


def rank_trace(
    doc: dict,
    step: dict,
    body: list[dict],
    *,
    rank: int,
    world: int,
    steps: int,
    straggler: int,
    delay_frac: float,
    jitter_ms: float,
    seed: int,
) -> bytes:
    """One rank's trace (JSON bytes) of ``steps`` tiled copies of ``body``."""
    dur = float(step["dur"])
    period = 1.2 * dur
    ids = 1 + max(
        [
            int(v)
            for e in body
            for k, v in (e.get("args") or {}).items()
            if k in ("correlation", "External id") and isinstance(v, int)
        ]
        + [int(e["id"]) for e in body if isinstance(e.get("id"), int)]
        + [0]
    )
    out = copy.deepcopy({k: v for k, v in doc.items() if k != "traceEvents"})
    info = dict(out.get("distributedInfo") or {})
    info.update(rank=rank, world_size=world)
    pgs = []
    for pg in info.get("pg_config") or []:
        pg = dict(pg)
        if pg.get("pg_name") == "0" or pg.get("pg_desc") == "default_pg":
            pg.update(pg_size=world, ranks=list(range(world)))
        pgs.append(pg)
    if pgs:
        info["pg_config"] = pgs
    out["distributedInfo"] = info
    events = list(doc["traceEvents"])
    number = int(str(step["name"]).split("#", 1)[1])
    delay = delay_frac * dur if rank == straggler else 0.0
    for s in range(steps):
        rng = random.Random((seed, rank, s).__hash__())
        jitter = rng.uniform(0.0, jitter_ms * 1e3)  # trace times are in us
        start = s * period + jitter
        events.append(dict(step, name=f"ProfilerStep#{number + s}", ts=step["ts"] + start, dur=dur + delay))
        dt = start + delay
        for e in body:
            events.append(_shift(e, dt, s, ids))
    out["traceEvents"] = events
    return orjson.dumps(out)


def _write_rank(args: tuple) -> int:
    dst, doc, step, body, kw = args
    data = gzip.compress(rank_trace(doc, step, body, **kw), compresslevel=1)
    dst.write_bytes(data)
    return len(data)


def make_folder(
    trace: Path,
    dst: Path,
    world: int,
    *,
    steps: int,
    events_kind: str,
    delay_frac: float,
    jitter_ms: float,
    straggler: int | None,
    seed: int,
    workers: int = 2,
) -> dict:
    """Write ``dst/rank{R}.json.gz`` for R < world (reused when ``dst``'s
    ``.generator.json`` beside it matches); returns the generator record
    (options, sizes, straggler)."""
    planted = world // 3 + 1 if straggler is None else straggler
    options = {
        "version": GENERATOR_VERSION,
        "trace": str(trace),
        "world": world,
        "steps": steps,
        "events": events_kind,
        "delay_frac": delay_frac,
        "jitter_ms": jitter_ms,
        "straggler": planted,
        "seed": seed,
    }
    # Beside the folder, not in it: the analyzer would report it as a skipped file.
    record = dst.parent / f"{dst.name}.generator.json"
    if record.exists() and dst.is_dir():
        old = json.loads(record.read_text())
        if old.get("options") == options:
            return old
        shutil.rmtree(dst)
    elif dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    doc, step, body = base_step(trace, events_kind)
    t0 = time.perf_counter()
    kw = dict(world=world, steps=steps, straggler=planted, delay_frac=delay_frac, jitter_ms=jitter_ms, seed=seed)
    one = rank_trace(doc, step, body, rank=0, **kw)
    tasks = [(dst / f"rank{r}.json.gz", doc, step, body, dict(kw, rank=r)) for r in range(world)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        gz = sum(pool.map(_write_rank, tasks, chunksize=16))
    info = {
        "options": options,
        "json_bytes_per_rank": len(one),
        "events_per_rank": len(orjson.loads(one)["traceEvents"]),
        "gz_bytes_total": gz,
        "json_bytes_total": len(one) * world,
        "generate_s": round(time.perf_counter() - t0, 2),
    }
    record.write_text(json.dumps(info, indent=2))
    return info


# ---------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------


def run_sampled(cmd: list[str], env: dict[str, str], period_s: float) -> dict:
    """Run ``cmd``; peak RSS of the root (driver), of the largest other
    process of its tree, and of the tree summed, sampled every ``period_s``."""
    peak = {"driver": 0, "worker": 0, "tree": 0, "processes": 0}
    done = threading.Event()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO)

    def sample() -> None:
        seen: set[int] = set()
        while not done.is_set():
            children = _children()
            stack, total = [proc.pid], 0
            while stack:
                pid = stack.pop()
                rss = _pss_rss(pid)[1]
                total += rss
                if pid == proc.pid:
                    peak["driver"] = max(peak["driver"], rss)
                else:
                    peak["worker"] = max(peak["worker"], rss)
                    seen.add(pid)
                stack.extend(children.get(pid, ()))
            peak["tree"] = max(peak["tree"], total)
            peak["processes"] = len(seen)
            done.wait(period_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    return {
        "wall_s": wall,
        "returncode": proc.returncode,
        "stdout": out.decode(errors="replace"),
        "stderr": err.decode(errors="replace"),
        **{f"peak_{k}_rss_bytes" if k != "processes" else "processes": v for k, v in peak.items()},
    }


def engines_available() -> dict[str, str | None]:
    """engine -> None when usable, else why not."""
    helptext = subprocess.run(
        [str(REPO / ".venv" / "bin" / "analyzer"), "report", "--help"], capture_output=True, text=True
    ).stdout
    out: dict[str, str | None] = {"local": None}
    if "--engine" not in helptext:
        out["ray"] = "analyzer report has no --engine option in this checkout"
    else:
        try:
            import ray  # noqa: F401

            out["ray"] = None
        except ImportError:
            out["ray"] = "ray is not installed (pip install 'trainperf[ray]')"
    return out


def measure(folder: Path, engine: str, period_s: float, report: Path) -> dict:
    cmd = [str(REPO / ".venv" / "bin" / "analyzer"), "report", "--no-cache", "--json", str(report)]
    if engine != "local" or "--engine" in _HELP:
        cmd += ["--engine", engine]
    cmd.append(str(folder))
    env = dict(os.environ)
    res = run_sampled(cmd, env, period_s)
    res["command"] = " ".join(cmd)
    if res["returncode"] != 0:
        res["straggler_ranks"] = None
        return res
    doc = json.loads(report.read_text())
    res["straggler_ranks"] = _straggler_ranks(doc)
    res["ranks_in_report"] = len(doc.get("ranks") or [])
    return res


def _straggler_ranks(doc: dict) -> list[int] | None:
    s = doc.get("stragglers")
    if isinstance(s, dict):
        return [int(r) for r in s.get("ranks", [])]
    return None


_HELP = ""


def main(argv: list[str] | None = None) -> int:
    global _HELP
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    p.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 256, 1024])
    p.add_argument("--engines", nargs="+", default=["local", "ray"])
    p.add_argument("--steps", type=int, default=6, help="profiler steps per rank (the straggler verdict needs 5)")
    p.add_argument("--events", choices=["device", "all"], default="device")
    p.add_argument("--delay-frac", type=float, default=0.10)
    p.add_argument("--jitter-ms", type=float, default=0.5)
    p.add_argument("--straggler", type=int, default=None)
    p.add_argument("--seed", type=int, default=12)
    p.add_argument("--period-s", type=float, default=0.05)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "scale")
    p.add_argument("--generate-only", action="store_true")
    p.add_argument("--clean", action="store_true", help="remove each generated folder after measuring it")
    args = p.parse_args(argv)
    if not args.trace.exists():
        print(
            f"bench_scale: {args.trace}: no such trace (the shared traces are read from ../shared/traces)",
            file=sys.stderr,
        )
        return 2
    _HELP = subprocess.run(
        [str(REPO / ".venv" / "bin" / "analyzer"), "report", "--help"], capture_output=True, text=True
    ).stdout
    avail = engines_available()
    engines = []
    for e in args.engines:
        why = avail.get(e, f"unknown engine {e!r}")
        if why:
            print(f"bench_scale: engine {e} skipped: {why}")
        else:
            engines.append(e)
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    results.setdefault("runs", {})
    for world in args.ranks:
        folder = args.out / f"w{world}"
        gen = make_folder(
            args.trace,
            folder,
            world,
            steps=args.steps,
            events_kind=args.events,
            delay_frac=args.delay_frac,
            jitter_ms=args.jitter_ms,
            straggler=args.straggler,
            seed=args.seed,
        )
        planted = gen["options"]["straggler"]
        print(
            f"w{world}: {world} ranks x {gen['json_bytes_per_rank'] / 1e6:.2f} MB JSON ({gen['events_per_rank']} events), "
            f"{gen['gz_bytes_total'] / 1e6:.1f} MB gzipped on disk, straggler rank {planted}",
            flush=True,
        )
        if args.generate_only:
            continue
        for engine in engines:
            res = measure(folder, engine, args.period_s, args.out / f"report-w{world}-{engine}.json")
            res.update(
                world=world,
                engine=engine,
                planted=planted,
                found=res["straggler_ranks"] == [planted],
                json_bytes_total=gen["json_bytes_total"],
                gz_bytes_total=gen["gz_bytes_total"],
                load_average=os.getloadavg()[0],
                measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            )
            if res["returncode"] != 0:
                print(f"  {engine}: exit {res['returncode']}: {res['stderr'].strip().splitlines()[-1:]}", flush=True)
            else:
                print(
                    f"  {engine}: {res['wall_s']:.1f} s, driver {res['peak_driver_rss_bytes'] / 2**20:.0f} MiB, "
                    f"worker {res['peak_worker_rss_bytes'] / 2**20:.0f} MiB, tree {res['peak_tree_rss_bytes'] / 2**20:.0f} MiB, "
                    f"stragglers {res['straggler_ranks']} (planted {planted})",
                    flush=True,
                )
            res.pop("stdout")
            results["runs"][f"{world}/{engine}"] = res
            results_path.write_text(json.dumps(results, indent=2))
        if args.clean:
            shutil.rmtree(folder)
            (folder.parent / f"{folder.name}.generator.json").unlink(missing_ok=True)
    if not args.generate_only:
        print_table(results["runs"])
        print(f"written {results_path}")
    return 0


def print_table(runs: dict) -> None:
    print(
        f"{'N':>6} {'engine':<7}{'GB JSON':>8}{'wall s':>8}{'s/GB':>7}{'driver MiB':>11}{'MiB/rank':>9}"
        f"{'worker MiB':>11}{'tree MiB':>9}  straggler"
    )
    for key in sorted(runs, key=lambda k: (int(k.split("/")[0]), k.split("/")[1])):
        r = runs[key]
        if r["returncode"] != 0:
            print(f"{r['world']:>6} {r['engine']:<7} failed (exit {r['returncode']})")
            continue
        gb = r["json_bytes_total"] / 1e9
        drv = r["peak_driver_rss_bytes"] / 2**20
        print(
            f"{r['world']:>6} {r['engine']:<7}{gb:>8.2f}{r['wall_s']:>8.1f}{r['wall_s'] / gb:>7.1f}{drv:>11.0f}"
            f"{drv / r['world']:>9.2f}{r['peak_worker_rss_bytes'] / 2**20:>11.0f}{r['peak_tree_rss_bytes'] / 2**20:>9.0f}"
            f"  {'found' if r['found'] else 'NOT found'} {r['straggler_ranks']} (planted {r['planted']})"
        )


if __name__ == "__main__":
    sys.exit(main())
