"""Real 2-rank CPU training runs through `reftrain --nproc 2` (torch.distributed.run, gloo).

One DDP run (profiled, with an injected straggler and checkpoints) is shared
by most assertions; an FSDP2 run and a resumed run check their own paths.
Timing assertions are lower bounds set by the injected sleep, never speeds.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import orjson
import pytest
import yaml

from analyzer.ingest.formats import MetricsLine
from analyzer.metrics.stragglers import disturbed_steps

pytestmark = pytest.mark.slow

TINY = ["--preset", "tiny"]
DELAY_MS = 150.0
SLOWDOWN = 1.5
TIMEOUT_S = 600  # a busy 2-core machine starts 3 torch processes per run


def reftrain(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reftrain", *args], cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S
    )


def must_succeed(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"reftrain failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def ddp_launch(runs: Path) -> subprocess.CompletedProcess:
    """6 steps, tiny model, 2 ranks; profiler waits 1, warms up 1, records steps 2-3;
    rank 1 sleeps DELAY_MS in every forward; checkpoints after steps 3 and 6; a progress line
    every 5 steps."""
    proc = reftrain(
        "--nproc",
        "2",
        "--runs-dir",
        str(runs),
        "--run-name",
        "ddp",
        *TINY,
        "--steps",
        "6",
        "--inject-slow-rank",
        "1",
        "--inject-delay-ms",
        str(DELAY_MS),
        "--checkpoint-every",
        "3",
        "--set",
        "profile.wait=1",
        "--set",
        "profile.warmup=1",
        "--set",
        "profile.active=2",
        "--set",
        "train.warmup_steps=1",
        "--set",
        "log.console_interval_steps=5",
        cwd=runs,
    )
    must_succeed(proc)
    return proc


@pytest.fixture(scope="module")
def ddp_run(ddp_launch: subprocess.CompletedProcess, runs: Path) -> Path:
    return runs / "ddp"


def test_progress_lines_rank0_at_the_interval_with_eta(ddp_launch: subprocess.CompletedProcess, ddp_run: Path) -> None:
    """Lines after the first step, at 5 steps done and after the last, once each (rank 0 only), with rank 0's
    own record of that step; the ETA only once a steady-state step exists (step 4: after the warm-up step
    and the profiler's steps 1-3), the median of those steps' time x steps left."""
    from reftrain.train import progress_line

    lines = [line for line in ddp_launch.stdout.splitlines() if line.startswith("step ")]
    rec = {r["step"]: r for r in read_jsonl(ddp_run / "metrics" / "rank0.jsonl")}
    eta_at_4 = rec[4]["step_time_ms"] / 1e3 * 1  # the one steady-state step so far x 1 step left
    assert lines == [
        progress_line(rec[0], 6, 2, None),
        progress_line(rec[4], 6, 2, eta_at_4),
        progress_line(rec[5], 6, 2, None),
    ]
    assert " ETA 0:00:0" in lines[1] and "ETA" not in lines[0] + lines[2]


def test_manifest(ddp_run: Path) -> None:
    m = json.loads((ddp_run / "run.json").read_text())
    assert m["schema"] == "reftrain.run/1" and m["run_id"] == "ddp" and m["status"] == "completed"
    assert m["end_time"] > m["start_time"]
    assert m["world_size"] == 2 and m["backend"] == "gloo"
    assert m["command"][:3] == ["reftrain", "--nproc", "2"]
    assert m["hardware"]["device_type"] == "cpu" and len(m["hardware"]["device_names"]) == 2
    assert m["hardware"]["device_memory_bytes"] is None  # no device limit on CPU
    assert m["hardware"]["cpu_cores"] >= 1 and len(m["hardware"]["hostnames"]) == 2
    # tiny preset, counted by hand in test_reftrain_units.py
    assert m["params"] == {"total": 135488, "non_embedding": 131392, "embedding": 4096}
    # hardware: + 2LHQT, the attention backward's recompute of QK^T (reftrain/flops.py)
    assert (m["flops"]["per_token"], m["flops"]["per_token_hardware"]) == (886656, 886656 + 2 * 2 * 4 * 16 * 64)
    assert m["flops"]["terms"] == {"N": 131392, "N_blocks": 98560, "L": 2, "H": 4, "Q": 16, "T": 64, "D": 64, "F": 256}
    assert m["peak_flops"]["source"] == "measured" and m["peak_flops"]["dtype"] == "fp32"
    assert m["peak_flops"]["per_s"] > 1e8
    assert m["tokens_per_step"] == 2 * 4 * 64  # ranks x micro-batch x seq_len
    assert m["steps"] == 6 and m["warmup_steps"] == 1
    assert m["profiled_steps"] == [1, 2, 3]  # profiler warm-up step 1, active steps 2-3
    assert len(m["clock"]["offsets_ns"]) == 2 and m["clock"]["offsets_ns"][0] == 0
    measured = m["inject"].pop("measured")
    assert m["inject"] == {"slow_rank": 1, "delay_ms": DELAY_MS, "slowdown": None}
    # The median injected time per step as measured on each rank: only rank 1 waits, at least the delay.
    assert measured["injected_ms"][0] == 0 and measured["injected_ms"][1] >= DELAY_MS
    assert m["files"] == {
        "config": "config.yaml",
        "metrics": ["metrics/rank0.jsonl", "metrics/rank1.jsonl"],
        "collectives": ["collectives/rank0.jsonl", "collectives/rank1.jsonl"],
        "telemetry": [],
        "traces": ["traces/step3/rank0.pt.trace.json.gz", "traces/step3/rank1.pt.trace.json.gz"],
        "checkpoints": ["checkpoints/step3", "checkpoints/step6"],
    }
    for rel in [*m["files"]["metrics"], *m["files"]["collectives"], *m["files"]["traces"]]:
        assert (ddp_run / rel).is_file()
    assert "NVML" in m["telemetry_note"] or "GPU" in m["telemetry_note"]
    assert m["config"] == yaml.safe_load((ddp_run / "config.yaml").read_text())
    assert m["config"]["run"]["name"] is None  # a repeat gets a new directory
    assert m["schemas"] == {
        "metrics": "reftrain.metrics/1",
        "collectives": "reftrain.collectives/1",
        "telemetry": "reftrain.telemetry/1",
    }


def test_traces_have_steps_phases_and_distributed_info(ddp_run: Path) -> None:
    for rank in (0, 1):
        trace = json.loads(gzip.open(ddp_run / "traces" / "step3" / f"rank{rank}.pt.trace.json.gz").read())
        info = trace["distributedInfo"]
        assert info["rank"] == rank and info["world_size"] == 2 and info["backend"] == "gloo"
        names = defaultdict(int)
        for e in trace["traceEvents"]:
            if e.get("cat") == "user_annotation":
                names[e["name"]] += 1
        assert names["ProfilerStep#2"] == 1 and names["ProfilerStep#3"] == 1
        assert not any(n.startswith("ProfilerStep#") and n not in ("ProfilerStep#2", "ProfilerStep#3") for n in names)
        for phase in ("data", "forward", "backward", "optimizer"):
            assert names[phase] == 2, (rank, phase, dict(names))
        # record_shapes=True: matmuls carry their input dimensions
        assert any(e.get("name") == "aten::mm" and e.get("args", {}).get("Input Dims") for e in trace["traceEvents"])


def test_metrics(ddp_run: Path) -> None:
    fields = {
        "step",
        "rank",
        "loss",
        "step_time_ms",
        "data_wait_ms",
        "forward_ms",
        "backward_ms",
        "optimizer_ms",
        "grad_sync_ms",
        "comm_ms",
        "tokens",
        "tokens_per_s",
        "mfu",
        "hfu",
        "mem_bytes",
        "mem_kind",
        "profiled",
        "time_ns",
    }
    m = json.loads((ddp_run / "run.json").read_text())
    for rank in (0, 1):
        recs = read_jsonl(ddp_run / "metrics" / f"rank{rank}.jsonl")
        assert [r["step"] for r in recs] == list(range(6))
        for r in recs:
            assert fields <= r.keys()
            assert r["rank"] == rank and r["tokens"] == 4 * 64
            assert 0 < r["mfu"] <= 1
            expected_mfu = r["tokens"] * 886656 / (r["step_time_ms"] / 1e3 * m["peak_flops"]["per_s"])
            assert r["mfu"] == pytest.approx(expected_mfu, rel=1e-9)
            # HFU adds the attention backward's recompute of QK^T, 2LHQT = 16384 per token
            assert r["hfu"] == pytest.approx(r["mfu"] * (886656 + 16384) / 886656, rel=1e-9)
            assert r["tokens_per_s"] == pytest.approx(r["tokens"] / (r["step_time_ms"] / 1e3), rel=1e-9)
            phases = r["data_wait_ms"] + r["forward_ms"] + r["backward_ms"] + r["optimizer_ms"]
            assert phases <= r["step_time_ms"] + 1e-6
            assert r["grad_sync_ms"] == 0.0  # DDP overlaps the all-reduce with backward
            assert r["mem_kind"] == "cpu_rss" and r["mem_bytes"] > 10 * 2**20
            assert r["profiled"] == (r["step"] in (1, 2, 3))
        # The writer writes the typed line (analyzer.ingest.formats.MetricsLine): every documented field,
        # in its order, nothing beside them; reading a line back and writing it gives the same bytes.
        lines = (ddp_run / "metrics" / f"rank{rank}.jsonl").read_bytes().splitlines()
        order = [f.name for f in dataclasses.fields(MetricsLine) if f.name != "extra"]
        for line, r in zip(lines, recs):
            # The canary's fields are written on the steps it probed only (test_canary_probes_between_steps).
            assert list(r) == [k for k in order if k in r] and set(order) - set(r) <= {"canary_ms", "canary_cpu_ms"}
            assert orjson.dumps(MetricsLine.from_json(r).to_json()) == line
        assert recs[-1]["loss"] < recs[0]["loss"]  # it learns the synthetic bigrams
        assert recs[0]["loss"] == pytest.approx(6.24, abs=0.1)  # ~ln(512) at initialization


def test_canary_probes_between_steps(ddp_run: Path) -> None:
    """The machine-speed canary (recorder/canary.py) ran before the first and the last step (0 and 5;
    every 5th step from 0 is 5 too), and never inside the profiler window (steps 1-3)."""
    for rank in (0, 1):
        recs = read_jsonl(ddp_run / "metrics" / f"rank{rank}.jsonl")
        probed = [r for r in recs if "canary_ms" in r]
        assert [r["step"] for r in probed] == [0, 5]
        for r in probed:
            # A fixed probe of about a millisecond; its thread's CPU time cannot exceed its wall time.
            assert 0 < r["canary_cpu_ms"] <= r["canary_ms"] + 0.05 and r["canary_ms"] < 1000
        assert all("canary_cpu_ms" not in r for r in recs if r["step"] not in (0, 5))


def test_collectives_line_up_across_ranks(ddp_run: Path) -> None:
    by_rank = [read_jsonl(ddp_run / "collectives" / f"rank{r}.jsonl") for r in (0, 1)]
    keys = [[(c["pg"], c["seq"]) for c in recs] for recs in by_rank]
    assert keys[0] == keys[1] and len(keys[0]) >= 6
    assert [c["seq"] for c in by_rank[0]] == list(range(len(by_rank[0])))
    for c0, c1 in zip(*by_rank):
        assert (c0["kind"], c0["bytes"], c0["step"], c0["group_size"]) == (c1["kind"], c1["bytes"], c1["step"], 2)
        assert c0["end_ns"] >= c0["start_ns"] and c0["clock"] == "host"
    # DDP all-reduces every gradient once per step: 4 bytes x 135488 parameters, in one 25 MiB bucket.
    per_step = defaultdict(int)
    for c in by_rank[0]:
        assert c["kind"] == "all_reduce"
        per_step[c["step"]] += c["bytes"]
    assert dict(per_step) == {s: 4 * 135488 for s in range(6)}


def test_injected_straggler(ddp_run: Path) -> None:
    """Rank 1 sleeps 150 ms inside its forward: its forward time holds it, and it arrives last."""
    m = json.loads((ddp_run / "run.json").read_text())
    recs = [read_jsonl(ddp_run / "metrics" / f"rank{r}.jsonl") for r in (0, 1)]
    assert all(r["injected_ms"] == 0 for r in recs[0])
    # The injected time is measured (a busy wait to a deadline, which load can only overshoot), so
    # it is at least the delay; all of it is in the forward, which it is part of.
    assert all(
        r["injected_ms"] >= DELAY_MS
        and r["injected_forward_ms"] == r["injected_ms"]
        and r["injected_backward_ms"] == 0
        and r["forward_ms"] >= r["injected_ms"]
        for r in recs[1]
    )
    assert statistics.median(r["forward_ms"] for r in recs[1]) > statistics.median(r["forward_ms"] for r in recs[0])
    # Arrival skew at each step's all-reduce, on rank-0-aligned clocks: rank 1 is last.
    # Steps that begin right after the profiler's start, trace export or a
    # checkpoint save (done between steps, each rank at its own speed) measure
    # that work, not the straggler; the analyzer leaves them out the same way.
    # Left: step 0 (profiler waiting) and step 5.
    disturbed = disturbed_steps(m["profiled_steps"], m["files"]["checkpoints"])
    assert disturbed == {1, 2, 3, 4, 6}
    offsets = m["clock"]["offsets_ns"]
    colls = [read_jsonl(ddp_run / "collectives" / f"rank{r}.jsonl") for r in (0, 1)]
    skew_ms = [
        ((c1["start_ns"] - offsets[1]) - (c0["start_ns"] - offsets[0])) / 1e6
        for c0, c1 in zip(*colls)
        if c0["step"] not in disturbed and c0["step"] >= 0
    ]
    # Rank 1 is last at both; by how much moves with the machine's load (a CI
    # run saw 41 ms at step 0, DDP's first iteration), so the size is checked
    # on the larger one only.
    assert len(skew_ms) == 2 and all(s > 0 for s in skew_ms) and max(skew_ms) > DELAY_MS / 3, skew_ms


def test_resume_reproduces_losses(ddp_run: Path, runs: Path) -> None:
    """Resuming the run's step-3 checkpoint gives steps 3-5 the same losses as the uninterrupted run.

    The resumed run also switches to the explicit, non-overlapped gradient
    all-reduce (parallel.overlap_grad_sync=false), whose numerics are DDP's
    (scale by 1/world, sum), so the losses must still agree; its time shows
    up as the grad_sync phase.
    """
    proc = reftrain(
        "--nproc",
        "2",
        "--resume",
        str(ddp_run / "checkpoints" / "step3"),
        "--run-name",
        "resumed",
        "--set",
        "profile.enabled=false",
        "--set",
        "inject.slow_rank=null",
        "--set",
        "inject.delay_ms=null",
        "--set",
        "parallel.overlap_grad_sync=false",
        "--quiet",
        cwd=runs,
    )
    must_succeed(proc)
    # --quiet reaches the ranks the launcher starts: no opening or progress line, the closing summary stays.
    assert not [
        line for line in proc.stdout.splitlines() if line.startswith(("step ", "telemetry:")) or "  |  " in line
    ]
    assert "reftrain: 3 steps in " in proc.stdout and "\nrun directory: " in proc.stdout
    resumed = runs / "resumed"
    m = json.loads((resumed / "run.json").read_text())
    assert m["resumed_from"]["step"] == 3 and m["start_step"] == 3 and m["steps"] == 6
    assert m["files"]["checkpoints"] == ["checkpoints/step6"]
    for rank in (0, 1):
        full = {r["step"]: r["loss"] for r in read_jsonl(ddp_run / "metrics" / f"rank{rank}.jsonl")}
        again = read_jsonl(resumed / "metrics" / f"rank{rank}.jsonl")
        assert [r["step"] for r in again] == [3, 4, 5]
        for r in again:
            assert r["loss"] == pytest.approx(full[r["step"]], rel=1e-6, abs=1e-7), (rank, r["step"])
            assert r["grad_sync_ms"] > 0
        colls = read_jsonl(resumed / "collectives" / f"rank{rank}.jsonl")
        assert {c["step"] for c in colls} == {3, 4, 5}
        for step in (3, 4, 5):
            assert sum(c["bytes"] for c in colls if c["step"] == step and c["kind"] == "all_reduce") == 4 * 135488


def test_config_repeats_the_run(ddp_run: Path, runs: Path) -> None:
    proc = reftrain("--config", str(ddp_run / "config.yaml"), "--print-config", cwd=runs)
    must_succeed(proc)
    assert yaml.safe_load(proc.stdout) == yaml.safe_load((ddp_run / "config.yaml").read_text())


@pytest.fixture(scope="module")
def fsdp_run(runs: Path) -> Path:
    """FSDP2, 2 micro-batches per step, activation checkpointing, no profiler (fp32: this
    CPU path is what CI has; bf16 matmuls on CPUs without bf16 instructions are ~100x slower);
    every rank's forward and backward SLOWDOWN times slower (--inject-slowdown)."""
    proc = reftrain(
        "--nproc",
        "2",
        "--runs-dir",
        str(runs),
        "--run-name",
        "fsdp",
        *TINY,
        "--steps",
        "6",
        "--strategy",
        "fsdp",
        "--set",
        "train.grad_accum=2",
        "--set",
        "train.activation_checkpointing=true",
        "--set",
        "profile.enabled=false",
        "--inject-slowdown",
        str(SLOWDOWN),
        cwd=runs,
    )
    must_succeed(proc)
    return runs / "fsdp"


def test_fsdp_run(fsdp_run: Path) -> None:
    m = json.loads((fsdp_run / "run.json").read_text())
    assert m["status"] == "completed" and m["config"]["parallel"]["strategy"] == "fsdp"
    # HFU adds the attention backward's QK^T (2LHQT) and the blocks' forward again but for the MLP's
    # output projection: 2 * (98560 - 2 * 256 * 64) + 4LHQT
    assert m["flops"]["per_token_hardware"] == 886656 + 2 * 8192 + 2 * (98560 - 2 * 256 * 64) + 4 * 8192 == 1067392
    assert m["files"]["traces"] == []
    for rank in (0, 1):
        recs = read_jsonl(fsdp_run / "metrics" / f"rank{rank}.jsonl")
        assert [r["step"] for r in recs] == list(range(6))
        for r in recs:
            assert r["tokens"] == 2 * 4 * 64
            assert r["hfu"] / r["mfu"] == pytest.approx(1067392 / 886656, rel=1e-12)
            assert 0 < r["loss"] < 7
    colls = [read_jsonl(fsdp_run / "collectives" / f"rank{r}.jsonl") for r in (0, 1)]
    assert [(c["pg"], c["seq"], c["kind"], c["bytes"]) for c in colls[0]] == [
        (c["pg"], c["seq"], c["kind"], c["bytes"]) for c in colls[1]
    ]
    kinds = defaultdict(int)
    for c in colls[0]:
        kinds[c["kind"]] += 1
    # Each step: forward all-gathers (x2 micro-batches) and backward re-gathers; one reduce-scatter
    # per FSDP unit (2 blocks + root) in the last micro-batch's backward only.
    assert kinds["reduce_scatter"] == 3 * 6
    assert kinds["all_gather"] > kinds["reduce_scatter"]


def test_injected_slowdown_is_the_measured_compute_ratio(fsdp_run: Path) -> None:
    """--inject-slowdown 1.5: each rank's forward and backward do 1.5x their own work, within 10 %.

    Load cannot break this: the ratio compares, within one step of one rank,
    the CPU time of the phases' own work with the CPU time of the injected
    work after it, both measured on the rank's main thread; time spent
    descheduled by neighbours counts in neither. Each injected loop stops
    at most one clock read past its target.
    """
    m = json.loads((fsdp_run / "run.json").read_text())
    ratios = []
    for rank in (0, 1):
        for r in read_jsonl(fsdp_run / "metrics" / f"rank{rank}.jsonl"):
            assert r["compute_cpu_ms"] > 0 and r["injected_cpu_ms"] > 0
            ratios.append((r["compute_cpu_ms"] + r["injected_cpu_ms"]) / r["compute_cpu_ms"])
            # The injected work lengthened both phases on the wall clock, and is part of them.
            for phase in ("forward", "backward"):
                assert 0 < r[f"injected_{phase}_ms"] < r[f"{phase}_ms"]
            assert r["injected_ms"] == pytest.approx(r["injected_forward_ms"] + r["injected_backward_ms"])
    assert statistics.median(ratios) == pytest.approx(SLOWDOWN, rel=0.10), ratios
    # run.json keeps the measured factor per rank (median over steady steps).
    assert m["inject"]["slowdown"] == SLOWDOWN
    assert m["inject"]["measured"]["compute_factor"] == [pytest.approx(SLOWDOWN, rel=0.10)] * 2


def test_error_inside_ranks_is_one_line(tmp_path: Path) -> None:
    """An error only the ranks can see (token ids beyond the vocabulary) surfaces as one line."""
    import numpy as np

    data = tmp_path / "tokens.bin"
    np.arange(0, 5000, dtype=np.uint16).tofile(data)
    proc = reftrain(
        "--nproc",
        "1",
        "--runs-dir",
        str(tmp_path / "runs"),
        "--run-name",
        "bad",
        *TINY,
        "--data",
        str(data),
        "--set",
        "profile.enabled=false",
        cwd=tmp_path,
    )
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert re.fullmatch(
        rf"reftrain: error: data\.path: {re.escape(str(data))}: token id (\d+) >= "
        r"model\.vocab_size=512; set model\.vocab_size to the tokenizer's size",
        lines[0],
    ), lines[0]
    m = json.loads((tmp_path / "runs" / "bad" / "run.json").read_text())
    assert m["status"] == "failed" and lines[0].endswith(m["error"])
