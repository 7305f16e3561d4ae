"""The runnable examples (examples/*.py) write runs that the analyzer reads, with measured FLOPs.

Each example runs as a user would run it (a subprocess, `--runs-dir`,
`--steps`); its run is read with `analyzer report`: MFU from the manifest
whose model FLOPs were measured by FlopCounterMode, and FLOPs per step equal,
within 2 %, to what the analyzer counts from the same run's trace shapes
(two independent paths: torch's counter over the running step, the
analyzer's FLOP table over the profiler's recorded shapes; both count the
step as run, so the run's hardware FLOPs are compared).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TIMEOUT_S = 600  # a busy 2-core machine shared with other jobs
MEASURED = "measured: torch.utils.flop_counter.FlopCounterMode"
# The three examples train one architecture (2 blocks of width 128 with 4 heads, 4x MLP, vocabulary 512,
# 64 tokens, untied head; 8 sequences = 512 tokens per step and rank), so one hand count holds for all,
# whichever framework and attention kernel (SDPA's CPU flash kernel in two, GPT-2's matmuls in the third):
# per token 6 x the matmul weights (PaLM's 6N) plus 12 L d T for attention (12LHQT, H Q = d).
MODEL_FLOPS_PER_STEP = (6 * (2 * (128 * 384 + 128 * 128 + 2 * 128 * 512) + 128 * 512) + 12 * 2 * 128 * 64) * 512


def run_example(script: str, runs: Path, *args: str, nproc: int = 1) -> Path:
    """Run an example; returns the one run directory it created under `runs`."""
    before = set(runs.iterdir()) if runs.is_dir() else set()
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
        if nproc > 1
        else [sys.executable]
    )
    # One intra-op thread per process, as torchrun sets: on a loaded machine two OpenMP threads on two
    # shared cores wait on each other at every parallel region (a 128^3 matmul was seen taking 0.1 s),
    # which made both the step times and the recorder's measured peak swing by 10x within one run.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [*launcher, str(EXAMPLES / script), "--runs-dir", str(runs), *args],
        cwd=runs.parent,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
    )
    assert proc.returncode == 0, f"{script} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    created = set(runs.iterdir()) - before
    assert len(created) == 1, f"{script} created {sorted(p.name for p in created)} under {runs}"
    return created.pop()


def analyzer(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "analyzer.cli", *args], capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT
    )


def report_mfu(path: Path, *args: str) -> dict:
    out = path.parent / f"report-{path.name}.json"
    proc = analyzer("report", str(path), "--no-cache", "--json", str(out), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())["run"]["mfu"]


def check_measured_flops(run: Path) -> None:
    """MFU's FLOPs are the measured ones, and agree with the trace shapes' count within 2 %."""
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["status"] == "completed"
    measured = manifest["flops"]["measured"]
    assert manifest["flops"]["source"] == "measured" and measured["model"] == MODEL_FLOPS_PER_STEP
    mfu = report_mfu(run)
    assert mfu["source"] == "manifest" and mfu["flops_source"].startswith(MEASURED)
    # Not bounded above: on a shared CPU the peak is a matmul measured under whatever load there was.
    assert mfu["median"] > 0
    # The manifest's per-device FLOPs per step as run (tokens_per_step * per_token_hardware / world_size).
    per_step_hardware = mfu["steps"][0]["hardware_flops"]
    assert per_step_hardware == pytest.approx(measured["hardware"], rel=1e-9)
    windows = sorted((run / "traces").glob("step*"))
    assert windows, f"no profiler window under {run / 'traces'}"
    # A trace folder has no peak the analyzer can look up on a CPU: any peak gives the same FLOP count.
    traced = report_mfu(windows[0], "--peak-flops", "1e12")
    assert traced["source"] == "trace-shapes"
    assert traced["flops_per_step"] == pytest.approx(per_step_hardware, rel=0.02)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("example-runs") / "runs"
    path.mkdir()
    return path


def test_plain_loop(runs: Path) -> None:
    run = run_example("plain_loop.py", runs, "--steps", "12")
    check_measured_flops(run)
    assert json.loads((run / "run.json").read_text())["config"]["steps"] == 12


@pytest.mark.slow
def test_plain_loop_two_ranks(runs: Path) -> None:
    run = run_example("plain_loop.py", runs, "--steps", "12", nproc=2)
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["world_size"] == 2
    assert sorted(manifest["files"]["metrics"]) == ["metrics/rank0.jsonl", "metrics/rank1.jsonl"]
    check_measured_flops(run)


def test_lightning_trainer(runs: Path) -> None:
    pytest.importorskip("lightning", reason="pip install 'trainperf[integrations]'")
    run = run_example("lightning_trainer.py", runs, "--steps", "12")
    check_measured_flops(run)
    metrics = [json.loads(line) for line in (run / "metrics/rank0.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(12))  # one record per optimizer step
    assert all(m["tokens"] == 8 * 64 and m["loss"] > 0 for m in metrics)


@pytest.mark.slow
def test_lightning_trainer_ddp_two_processes(runs: Path) -> None:
    pytest.importorskip("lightning", reason="pip install 'trainperf[integrations]'")
    run = run_example("lightning_trainer.py", runs, "--steps", "12", "--devices", "2")
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["world_size"] == 2 and manifest["tokens_per_step"] == 2 * 8 * 64
    assert sorted(manifest["files"]["metrics"]) == ["metrics/rank0.jsonl", "metrics/rank1.jsonl"]
    check_measured_flops(run)


def test_hf_trainer(runs: Path) -> None:
    pytest.importorskip("transformers", reason="pip install 'trainperf[integrations]'")
    run = run_example("hf_trainer.py", runs, "--steps", "12")
    check_measured_flops(run)
    metrics = [json.loads(line) for line in (run / "metrics/rank0.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(12))
    # tokens from the Trainer's own count; loss from the model outputs, falling as the sequences are learnt
    assert all(m["tokens"] == 8 * 64 for m in metrics)
    assert metrics[-1]["loss"] < metrics[0]["loss"]


@pytest.mark.slow
def test_hf_trainer_under_torchrun_two_processes(runs: Path) -> None:
    pytest.importorskip("transformers", reason="pip install 'trainperf[integrations]'")
    run = run_example("hf_trainer.py", runs, "--steps", "12", nproc=2)
    manifest = json.loads((run / "run.json").read_text())
    # each process's share of the Trainer's token count (summed over processes)
    assert manifest["world_size"] == 2 and manifest["tokens_per_step"] == 2 * 8 * 64
    assert sorted(manifest["files"]["metrics"]) == ["metrics/rank0.jsonl", "metrics/rank1.jsonl"]
    check_measured_flops(run)


@pytest.mark.slow
def test_gate_passes_twins_and_fails_the_slowdown(runs: Path) -> None:
    """`analyzer check`: a second run of the example is no regression against the first; one with
    --slowdown 0.25 is one.

    The slowdown is busy work of 25 % of each step's CPU time: steps per
    CPU-second drop by 20 %, four times the gate's 5 % bound. Wall-clock step
    times of two runs minutes apart on a shared machine can differ by 2x (seen
    here: 101 -> 211 ms for the same run), which the gate rightly calls
    inconclusive; so the twin is gated with `--inconclusive pass` (the test: no
    false alarm) and the slow run with `--inconclusive fail` (the test: it never
    passes). The twin is gated at a 10 % allowance, not the default 5 %: beside
    other jobs, identical runs differ by more than 5 % often enough that the
    default gate's false-alarm rate under load is a measured open problem
    (docs/ci.md, "Measured error rates"; in a clean clone's `make test` beside
    two other jobs a twin dropped 5.8 %, p = 0.00067, CPU time confirming 5.2 %).
    The slow run's 20 % is twice that allowance. Its CPU time per step must show the work it added: a
    drop beyond the gate's 5 % bound with p < 0.05. Not CPU time's own verdict:
    load moves CPU time per step too (beside two busy loops, a twin's rose 26 %
    in one trial and the twins differed by 16.9 % in another, which made the
    slow run's CPU-time verdict inconclusive at a 13.4 % drop, p = 1e-7), so CPU
    time alone could also confirm a twin's drop: every run carries the
    recorder's machine-speed canary (`steps=` given: the first, every 5th and
    the last step), and the gate must have used it: it takes the machine's
    slowdown, as the probe measured it, out of both clocks (docs/ci.md, "Machine
    speed"). The slow run sits between the twins, so that drift of the machine's
    load hits the baselines on both sides. 30 steps leave 24 steady-state steps
    per run, enough for the one-sided test's p < 0.05, and 5 steady probes (the
    one before step 5 falls in the profiler's window).
    """
    gate = runs.parent / "gate"
    gate.mkdir()
    base = run_example("plain_loop.py", gate, "--steps", "30")
    slow = run_example("plain_loop.py", gate, "--steps", "30", "--slowdown", "0.25")
    twin = run_example("plain_loop.py", gate, "--steps", "30")
    twin_verdict = gate / "twin-check.json"
    passed = analyzer(
        "check",
        str(twin),
        "--baseline",
        str(base),
        "--max-mfu-drop",
        "0.10",
        "--inconclusive",
        "pass",
        "--no-cache",
        "--json",
        str(twin_verdict),
    )
    assert passed.returncode == 0, passed.stdout[-3000:] + passed.stderr[-2000:]
    machine = json.loads(twin_verdict.read_text())["machine_speed"]
    assert machine is not None and machine["n_base"] == machine["n_cand"] == 5, machine
    verdict = gate / "slow-check.json"
    failed = analyzer(
        "check",
        str(slow),
        "--baseline",
        str(base),
        "--baseline",
        str(twin),
        "--inconclusive",
        "fail",
        "--no-cache",
        "--json",
        str(verdict),
    )
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-2000:]
    slow_check = json.loads(verdict.read_text())
    cpu = slow_check["cpu_time"]
    assert cpu["drop"] > 0.05 and cpu["p_value"] < 0.05, cpu
    assert slow_check["machine_speed"]["n_base"] == 10, slow_check["machine_speed"]
