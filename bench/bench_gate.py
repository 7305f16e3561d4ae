"""How often `analyzer check` is right: false alarms and power on this machine, idle and under load.

    .venv/bin/python bench/bench_gate.py --quick                 # 2 cells x 3 trials, ~2 minutes idle
    .venv/bin/python bench/bench_gate.py                         # the docs/ci.md table, <= 30 minutes
    # 20 no-change and 20 slow25 pairs beside two busy loops, runs kept, then gated at 57 and 197 steady
    # steps (what --steps 60 and --steps 200 give):
    .venv/bin/python bench/bench_gate.py --steps 200 --cases none,slow25 --loads 2 --trials 20 --budget-min 55 \
        --out bench/out/gate200 --json bench/out/gate200.json
    .venv/bin/python bench/bench_gate.py --reuse bench/out/gate200.json --lengths 57,197 --baseline-checks

For each load condition (0, 1 or 2 background processes that each keep one
core busy, started and stopped by this script), the bench trains baseline
and candidate runs one after the other (`reftrain --nproc 2 --device cpu
--preset tiny --steps 40`, profiler off: 37 steady-state steps),
interleaved B C C B C C B ..., the candidates round-robin over the cases so
that drift of the machine hits every case alike:

- `none`: the same configuration (no change: every regression is a false alarm);
- `slow5`, `slow10`, `slow25`: `--inject-slowdown F` with F chosen so that
  the step gets 5, 10 or 25 % longer: F = 1 + s / c, with c the median
  share of forward + backward's own CPU work (`compute_cpu_ms`) in the
  step's CPU time (`cpu_ms`), measured by a calibration run
  (`--inject-slowdown 1.0001`, not used as a baseline) at the start of each
  load condition. A share of CPU time, not of wall time: on a busy machine
  a process gets a fraction of a core, so each CPU millisecond added costs
  more than a millisecond of wall time, in proportion to the step's other
  CPU work (sized by the share of wall time, a "25 %" slowdown measured
  +110 to +140 % step time beside two busy loops at a load average of 11). The injection
  multiplies that CPU work by F (reftrain/inject.py); the phases' wall time
  also holds waits for the other rank (the gradient all-reduce ends inside
  backward), which it does not multiply, so sizing from the phases' wall
  share (as this bench once did) undershoots;
- `straggler`: rank 1 waits 25 % of the first baseline's median step time
  in every forward (`--inject-slow-rank 1 --inject-delay-ms D`), so the
  job's step gets about 25 % longer.

Each candidate is gated (`analyzer check`, the gate's defaults plus
`--check-args`) against the baselines trained just before and just after
its block (`--baseline B1 --baseline B2`, as a CI job training the base
branch before and after the candidate would), or only the one before
(`--baselines-per-check 1`). That is how the budget fits: each baseline
serves the `--block` candidates on both sides of it, so a trial costs
1 + 1/block runs. The candidate's own step-time change (median step time
over the baselines') is measured too, so the table shows what each case
really did.

Runs trained by reftrain carry the machine-speed canary (docs/ci.md,
"Machine speed"); each trial records what the gate saw of it (`machine`:
the check JSON's `machine_speed`, with the cost per step's gate in
`machine.cost`), and `--reuse` records the verdict with and without it
(`verdict_without_canary`, and the table's last column), so one set of runs
shows what the canary changed. `--json` is rewritten after every block, so
a campaign still training can be re-gated with `--reuse`.

Printed per cell (case x load): trials, how often the gate said
regression, inconclusive and pass (and unusable: exit 2), the achieved
median step-time change, and the wall time per trial (one reftrain run plus
the check). `--json FILE` saves every trial.

The load processes are bounded twice: killed when their load condition
ends (also on Ctrl-C and SIGTERM, in a `finally`), and each exits by
itself when the time budget plus one minute has passed, should this
process die without cleaning up.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CASES = ("none", "slow5", "slow10", "slow25", "straggler")
SLOWER = {"slow5": 0.05, "slow10": 0.10, "slow25": 0.25}
STRAGGLER_SHARE = 0.25
VERDICTS = {0: "pass", 1: "regression", 2: "unusable", 4: "inconclusive"}
_SPIN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="validation: 3 trials of none and slow25, idle only (unless --trials/--cases/--loads say otherwise)",
    )
    p.add_argument("--trials", type=int, help="candidate runs per cell (default 20)")
    p.add_argument(
        "--budget-min",
        type=float,
        default=30.0,
        help="stop starting trials after this many minutes in all, split evenly over the loads (default 30)",
    )
    p.add_argument("--cases", help=f"comma-separated subset of {','.join(CASES)} (default all)")
    p.add_argument("--loads", help="background busy processes per condition (default 0,1,2)")
    p.add_argument("--block", type=int, default=2, help="candidate runs between two baseline runs (default 2)")
    p.add_argument(
        "--baselines-per-check",
        type=int,
        choices=(1, 2),
        default=2,
        help="2: gate each candidate against the baselines before and after its block; 1: the one before",
    )
    p.add_argument("--steps", type=int, default=40, help="steps per run (default 40; 3 warm-up, profiler off)")
    p.add_argument("--check-args", default="", help="extra arguments for `analyzer check`, e.g. '--max-mfu-drop 0.1'")
    p.add_argument("--out", type=Path, help="keep the run directories here (default: a temporary folder)")
    p.add_argument("--json", type=Path, metavar="FILE", help="write every trial and the table as JSON")
    p.add_argument(
        "--reuse",
        type=Path,
        metavar="FILE",
        help="train nothing: re-gate the trials of an earlier --json FILE (its runs kept with --out) "
        "with the current gate, at each of --lengths",
    )
    p.add_argument(
        "--baseline-checks",
        action="store_true",
        help="with --reuse: also gate each baseline that has one on either side against those two, as "
        "further no-change checks (case `none-base`; three runs apart instead of one or two)",
    )
    p.add_argument(
        "--lengths",
        default="",
        help="with --reuse: comma-separated numbers of steady steps per run, each run cut to its first N "
        "(default: the runs' own length)",
    )
    args = p.parse_args(argv)
    args.lengths = [int(x) for x in args.lengths.split(",") if x]
    if args.out is not None:
        args.out = args.out.resolve()  # reftrain runs with the runs folder as its working directory
    # --quick only fills what was not given.
    quick = {"trials": 3, "cases": "none,slow25", "loads": "0"}
    full = {"trials": 20, "cases": ",".join(CASES), "loads": "0,1,2"}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.cases = [c for c in args.cases.split(",") if c]
    args.loads = [int(x) for x in args.loads.split(",") if x]
    bad = [c for c in args.cases if c not in CASES]
    if bad:
        p.error(f"unknown case(s) {bad}; choose from {CASES}")
    if args.block < 1:
        p.error("--block must be >= 1")
    return args


# ----------------------------------------------------------------- background load
class Load:
    """`n` processes that each keep one core busy; a context manager that always stops them."""

    def __init__(self, n: int, max_s: float) -> None:
        self.n, self.max_s, self.procs = n, max_s, []

    def __enter__(self) -> "Load":
        for _ in range(self.n):
            # The deadline argument bounds each process by itself, should nobody kill it.
            self.procs.append(subprocess.Popen([sys.executable, "-c", _SPIN, str(self.max_s)]))
        if self.n:
            time.sleep(1.0)  # let the scheduler settle with them running
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            with contextlib.suppress(Exception):
                proc.wait(timeout=10)
        self.procs = []


def _sigterm(signum, frame) -> None:  # SIGTERM takes the same way out as Ctrl-C: the `finally` blocks
    raise KeyboardInterrupt


# ----------------------------------------------------------------- runs and checks
def train(runs_dir: Path, name: str, steps: int, extra: list[str]) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "reftrain",
        "--nproc",
        "2",
        "--device",
        "cpu",
        "--preset",
        "tiny",
        "--steps",
        str(steps),
        "--runs-dir",
        str(runs_dir),
        "--run-name",
        name,
        "--set",
        "profile.enabled=false",
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=runs_dir, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"bench_gate: reftrain {name} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return runs_dir / name


def steady_records(run: Path) -> list[dict]:
    manifest = json.loads((run / "run.json").read_text())
    warmup, profiled = manifest["warmup_steps"], set(manifest["profiled_steps"])
    out = []
    for path in sorted((run / "metrics").glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec["step"] >= warmup and rec["step"] not in profiled:
                out.append(rec)
    return out


def median_step_ms(run: Path) -> float:
    """The job's step time: per step the slowest rank, then the median over steps."""
    per_step: dict[int, float] = {}
    for rec in steady_records(run):
        per_step[rec["step"]] = max(per_step.get(rec["step"], 0.0), rec["step_time_ms"])
    return statistics.median(per_step.values())


def compute_share(run: Path) -> float:
    """Median over steady (rank, step) records of forward + backward's own CPU work over the step's CPU time.

    `compute_cpu_ms` is recorded only when a slowdown is injected, hence the calibration run.
    """
    recs = steady_records(run)
    if not all(r.get("compute_cpu_ms") for r in recs):
        raise SystemExit(f"bench_gate: {run} has no compute_cpu_ms (train it with --inject-slowdown)")
    return statistics.median(r["compute_cpu_ms"] / r["cpu_ms"] for r in recs)


def gate(cand: Path, baselines: list[Path], check_args: list[str]) -> dict:
    """`analyzer check` in this process (same code path as the console script, no interpreter start)."""
    from analyzer.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "check.json"
        argv = ["check", str(cand), "--no-cache", "--json", str(out), *check_args]
        for b in baselines:
            argv += ["--baseline", str(b)]
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(argv)
        if code == 130:  # the CLI turns Ctrl-C into exit 130; the bench must stop too
            raise KeyboardInterrupt
        doc = json.loads(out.read_text()) if out.exists() else {}
    return {
        "exit": code,
        "verdict": VERDICTS.get(code, f"exit {code}"),
        "drop": doc.get("drop"),
        "noise": doc.get("noise"),
        "noise_source": doc.get("noise_source"),
        "p_value": doc.get("p_value"),
        "cpu_drop": (doc.get("cpu_time") or {}).get("drop"),
        "cpu_noise": (doc.get("cpu_time") or {}).get("noise"),
        "machine": doc.get("machine_speed"),
        "error": stderr.getvalue().strip().splitlines()[-1] if code == 2 and stderr.getvalue().strip() else None,
    }


@dataclass
class Cell:
    case: str
    load: int
    inject: list[str]
    trials: list[dict] = field(default_factory=list)

    def count(self, verdict: str) -> int:
        return sum(t["verdict"] == verdict for t in self.trials)

    def row(self) -> dict:
        n = len(self.trials)
        return {
            "case": self.case,
            "load": self.load,
            "trials": n,
            "inject": " ".join(self.inject),
            **{v: self.count(v) for v in ("regression", "inconclusive", "pass", "unusable")},
            # --reuse: the same trials gated without the machine-speed canary.
            "regression_without_canary": sum(t.get("verdict_without_canary") == "regression" for t in self.trials),
            "pass_without_canary": sum(t.get("verdict_without_canary") == "pass" for t in self.trials),
            "step_change_median": statistics.median(t["step_change"] for t in self.trials) if n else None,
            "wall_s_per_trial": statistics.fmean(t["wall_s"] for t in self.trials) if n else None,
        }


def print_table(cells: list[Cell]) -> None:
    print(
        f"\n{'case':<10} {'load':>4} {'trials':>6} {'regression':>11} {'inconclusive':>13} {'pass':>6} "
        f"{'unusable':>8} {'step change':>11} {'s/trial':>8}  inject  [without canary: regression, pass]"
    )
    for cell in cells:
        r = cell.row()
        if not r["trials"]:
            print(f"{r['case']:<10} {r['load']:>4} {0:>6}  (no time left)")
            continue
        n = r["trials"]
        pct = lambda k: f"{r[k]:>3} {100 * r[k] / n:3.0f}%"  # noqa: E731
        print(
            f"{r['case']:<10} {r['load']:>4} {n:>6} {pct('regression'):>11} {pct('inconclusive'):>13} "
            f"{r['pass']:>6} {r['unusable']:>8} {100 * r['step_change_median']:+10.1f}% "
            f"{r['wall_s_per_trial']:8.1f}  {r['inject']}"
            + (
                f"  [{r['regression_without_canary']}, {r['pass_without_canary']}]"
                if any("verdict_without_canary" in t for t in cell.trials)
                else ""
            ),
            flush=True,
        )


def run_load(
    args: argparse.Namespace, load: int, root: Path, deadline: float, check_args: list[str], cells: list[Cell]
) -> None:
    """One load condition: baselines and candidates interleaved, B C C B C C B ...

    Each candidate is gated against the baseline trained just before its
    block and the one just after (``--baselines-per-check 2``, the default)
    or only the one before (1): neighbours in time see the same machine,
    and each baseline serves the ``--block`` candidates on either side.
    """
    runs_dir = root / f"load{load}"
    runs_dir.mkdir(parents=True, exist_ok=True)
    print(f"\n== load {load}: {load} busy process(es)", flush=True)
    calib = train(runs_dir, "calibrate", args.steps, ["--inject-slowdown", "1.0001"])
    share = compute_share(calib)
    bases = [train(runs_dir, "base0", args.steps, [])]
    step_ms = median_step_ms(bases[0])
    print(
        f"   first baseline: median step {step_ms:.1f} ms; forward+backward's own CPU work "
        f"{100 * share:.0f}% of a step's CPU time (calibration run)",
        flush=True,
    )
    mine = []
    for case in args.cases:
        if case in SLOWER:
            inject = ["--inject-slowdown", f"{1 + SLOWER[case] / share:.4f}"]
        elif case == "straggler":
            inject = ["--inject-slow-rank", "1", "--inject-delay-ms", f"{STRAGGLER_SHARE * step_ms:.2f}"]
        else:
            inject = []
        mine.append(Cell(case, load, inject))
    cells += mine
    # Trial-major round robin: trial 0 of every case, then trial 1, ...
    queue = [(trial, cell) for trial in range(args.trials) for cell in mine]
    while queue and time.monotonic() < deadline:
        block, queue = queue[: args.block], queue[args.block :]
        t0 = time.monotonic()
        cands = [
            (trial, cell, train(runs_dir, f"{cell.case}-{trial}", args.steps, cell.inject)) for trial, cell in block
        ]
        after = train(runs_dir, f"base{len(bases)}", args.steps, []) if args.baselines_per_check > 1 else None
        # A trial's wall time: its own run, its share of a baseline, its check.
        shared_s = (time.monotonic() - t0) / len(block)
        for trial, cell, cand in cands:
            t1 = time.monotonic()
            neighbours = [bases[-1]] + ([after] if after is not None else [])
            result = gate(cand, neighbours, check_args)
            ref_ms = statistics.median(median_step_ms(b) for b in neighbours)
            result.update(
                trial=trial,
                candidate=str(cand),
                baselines=[str(b) for b in neighbours],
                step_change=median_step_ms(cand) / ref_ms - 1,
                wall_s=shared_s + time.monotonic() - t1,
            )
            cell.trials.append(result)
            print(
                f"   {cell.case:<10} trial {trial:>2}: {result['verdict']:<12} drop {result['drop'] or 0:+.3f} "
                f"noise {result['noise'] or 0:.3f}  step {100 * result['step_change']:+.1f}%  "
                f"({result['wall_s']:.1f} s)",
                flush=True,
            )
        if after is not None:
            bases.append(after)
        save(args, cells)
    if queue:
        print(f"   time budget for this load spent ({len(queue)} trials not run)", flush=True)


def _check_config(check_args: list[str]) -> tuple[object, bool, bool]:
    """The gate's knobs from ``--check-args`` (the subset of ``analyzer check``'s flags that reach the statistic)."""
    from analyzer.verbs.check import CheckConfig

    p = argparse.ArgumentParser(prog="--check-args")
    p.add_argument("--max-mfu-drop", type=float, default=0.05)
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--quantile", type=float, default=0.25)
    p.add_argument("--no-cpu-time", action="store_true")
    p.add_argument("--no-machine-speed", action="store_true")
    a = p.parse_args(check_args)
    return (
        CheckConfig(max_drop=a.max_mfu_drop, alpha=a.alpha, quantile=a.quantile),
        not a.no_cpu_time,
        not a.no_machine_speed,
    )


def baseline_checks(cells: list[dict]) -> list[dict]:
    """No-change checks from the baselines alone: each gated against the baselines trained before and after it.

    Per load, the baselines in training order (as the trials name them);
    every one but the first and last becomes a candidate. They are the same
    configuration trained beside the same load, but three runs apart from
    their neighbours (the block's candidates ran between), not one or two.
    """
    out = []
    for load in sorted({c["load"] for c in cells}):
        order: list[str] = []
        for cell in cells:
            for t in cell["trials"] if cell["load"] == load else []:
                order += [b for b in t["baselines"] if b not in order]
        order.sort(key=lambda path: int(Path(path).name.removeprefix("base")))
        trials = []
        for i in range(1, len(order) - 1):
            neighbours = [order[i - 1], order[i + 1]]
            ref_ms = statistics.median(median_step_ms(Path(b)) for b in neighbours)
            trials.append(
                {
                    "trial": i,
                    "candidate": order[i],
                    "baselines": neighbours,
                    "step_change": median_step_ms(Path(order[i])) / ref_ms - 1,
                    "wall_s": 0.0,
                }
            )
        out.append({"case": "none-base", "load": load, "inject": [], "trials": trials})
    return out


def _probes_of(probes, steps):
    """A run's canary probes up to the last of its (cut) steady steps; None without a canary."""
    return None if probes is None else probes.through(int(steps.steps[-1]))


def _costs(cand, bases, cand_n, bases_n, use: bool) -> tuple[list, object]:
    """The runs' CPU time per step in canary units, each cut after its last kept step (probes included)."""
    from analyzer.verbs.check import cost_samples

    if not use:
        return [], None
    last = lambda s: int(s.steps[-1])  # noqa: E731
    return (
        [cost_samples(b, f"baseline {i + 1}", last(s)) for i, (b, s) in enumerate(zip(bases, bases_n))],
        cost_samples(cand, "candidate", last(cand_n)),
    )


def reuse(args: argparse.Namespace) -> int:
    """Re-gate an earlier bench's trials at several run lengths, from the runs it kept (``--out``).

    A run of N steady steps is taken to be the first N steady steps of the
    kept run: the same code, the same machine minutes, so the lengths
    differ only in how much of each run the gate sees (the runs of one
    trial were trained further apart in time than N-step runs would be,
    which makes the short lengths' drift between runs slightly larger
    than a real N-step bench's, so their rates err towards "noisier").
    """
    from analyzer.api import analyze
    from analyzer.errors import AnalyzerError
    from analyzer.verbs.check import canary_cost_gate, cpu_samples, gate_samples, run_probes, run_samples

    doc = json.loads(args.reuse.read_text())
    config, use_cpu, use_canary = _check_config(args.check_args.split())
    analyzed: dict[str, object] = {}

    def run(path: str):
        if path not in analyzed:
            analyzed[path] = analyze(path, cache=False)
        return analyzed[path]

    lengths = args.lengths or [0]
    tables: dict[int, list[Cell]] = {n: [] for n in lengths}
    if args.baseline_checks:
        doc["trials"] += baseline_checks(doc["trials"])
    for cell_doc in doc["trials"]:
        cells = {
            n: Cell(
                cell_doc["case"],
                cell_doc["load"],
                cell_doc["inject"].split() if isinstance(cell_doc["inject"], str) else cell_doc["inject"],
            )
            for n in lengths
        }
        for n in lengths:
            tables[n].append(cells[n])
        for t in cell_doc["trials"]:
            cand, bases = run(t["candidate"]), [run(b) for b in t["baselines"]]
            base_s, cand_s, _ = run_samples(bases[0], cand, *bases[1:])
            cpu_b = [cpu_samples(b, "baseline") for b in bases] if use_cpu else []
            cpu_c = cpu_samples(cand, "candidate") if use_cpu else None
            probes_b = [run_probes(b, "baseline") for b in bases] if use_canary else []
            probes_c = run_probes(cand, "candidate") if use_canary else None
            for n in lengths:
                cut = (lambda s: s.head(n)) if n else (lambda s: s)
                bases_n, cand_n = [cut(b) for b in base_s], cut(cand_s)
                cpu_b_n = [cut(c) if c is not None else None for c in cpu_b]
                cpu_c_n = cut(cpu_c) if cpu_c is not None else None
                try:
                    before = gate_samples(bases_n, cand_n, config, cpu_b_n, cpu_c_n)[0].verdict
                    # The canary's probes of the same steps: those up to each run's last kept step.
                    result, _, machine = canary_cost_gate(
                        bases_n,
                        cand_n,
                        config,
                        cpu_b_n,
                        cpu_c_n,
                        [_probes_of(p, s) for p, s in zip(probes_b, bases_n)],
                        _probes_of(probes_c, cand_n),
                        *_costs(cand, bases, cand_n, bases_n, use_cpu and use_canary),
                    )
                    verdict, drop, noise = result.verdict, result.drop, result.noise
                except AnalyzerError:
                    verdict, drop, noise, before, machine = "unusable", None, None, "unusable", None
                cells[n].trials.append(
                    {
                        **t,
                        "verdict": verdict,
                        "drop": drop,
                        "noise": noise,
                        "verdict_without_canary": before,
                        "machine": machine.to_json() if machine else None,
                    }
                )
    for n in lengths:
        print(
            f"\n== {'each run cut to its first ' + str(n) + ' steady steps' if n else 'whole runs'} "
            f"(re-gated from {args.reuse})"
        )
        print_table(tables[n])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "reuse": str(args.reuse),
                    "lengths": lengths,
                    "tables": {str(n): [c.row() for c in tables[n]] for n in lengths},
                    "trials": {str(n): [asdict(c) for c in tables[n]] for n in lengths},
                },
                indent=1,
            )
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.reuse:
        return reuse(args)
    check_args = args.check_args.split()
    signal.signal(signal.SIGTERM, _sigterm)
    start = time.monotonic()
    budget_s = args.budget_min * 60
    cells: list[Cell] = []
    with contextlib.ExitStack() as stack:
        root = args.out or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_gate-")))
        try:
            for i, load in enumerate(args.loads):
                # Each load condition gets an equal share of what is left of the budget.
                left = budget_s - (time.monotonic() - start)
                deadline = time.monotonic() + left / (len(args.loads) - i)
                with Load(load, max_s=left + 60):
                    run_load(args, load, root, deadline, check_args, cells)
        except KeyboardInterrupt:
            print("\nbench_gate: interrupted; background load stopped. Partial table:", flush=True)
        print_table(cells)
        print(
            f"\nwall time {(time.monotonic() - start) / 60:.1f} min; trials per cell as shown "
            f"(--trials {args.trials}, --budget-min {args.budget_min:g})"
        )
        save(args, cells)
    return 0


def save(args: argparse.Namespace, cells: list[Cell]) -> None:
    """Write every trial so far to ``--json`` (after each block too, so a running bench can be re-gated)."""
    if not args.json:
        return
    args.json.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "table": [c.row() for c in cells],
        "trials": [asdict(c) for c in cells],
    }
    tmp = args.json.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(args.json)  # atomic: a reader never sees half a file


if __name__ == "__main__":
    sys.exit(main())
