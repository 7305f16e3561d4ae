"""The recorder in a 2-rank DDP job under torchrun on gloo: every rank's files, DDP's bucket
all-reduces timed through the comm hook, and the multi-rank bad uses (one rank recording, one failing)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.api import analyze
from analyzer.ingest.formats import RunManifest
from tests.recorder_ddp_loop import AFTER_WINDOW_S, WINDOW_END

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
LOOP = REPO / "tests" / "recorder_ddp_loop.py"


def _torchrun(runs: Path, mode: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--standalone",
            str(LOOP),
            str(runs),
            mode,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _manifest(run_dir: Path) -> RunManifest:
    return RunManifest.from_json(json.loads((run_dir / "run.json").read_text()))


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_ranks_record_one_run_with_timed_collectives(tmp_path):
    done = _torchrun(tmp_path, "all")
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "ddp-all"
    man = _manifest(run_dir)
    assert man.status == "completed" and man.world_size == 2 and man.backend == "gloo"
    assert man.collective_timing.startswith("DDP comm hook")
    assert man.files.metrics == ["metrics/rank0.jsonl", "metrics/rank1.jsonl"]
    assert man.files.traces == ["traces/step2/rank0.pt.trace.json.gz", "traces/step2/rank1.pt.trace.json.gz"]
    assert len(man.clock.offsets_ns) == 2 and man.tokens_per_step == 2 * 32
    assert len(man.hardware.hostnames) == 2
    for rank in (0, 1):
        metrics = _lines(run_dir / f"metrics/rank{rank}.jsonl")
        assert [m["step"] for m in metrics] == list(range(5))
        colls = _lines(run_dir / f"collectives/rank{rank}.jsonl")
        # TinyLM's gradients fit one DDP bucket: one averaging all-reduce per step, timed by the hook.
        assert [(c["step"], c["kind"]) for c in colls] == [(s, "all_reduce") for s in range(5)]
        assert all(c["end_ns"] >= c["start_ns"] for c in colls)
        for m in metrics:
            mine = [c for c in colls if c["step"] == m["step"]]
            assert m["comm_ms"] == pytest.approx(sum(c["end_ns"] - c["start_ns"] for c in mine) / 1e6)
    # Rank 1 spent AFTER_WINDOW_S after the window's last step; the ranks meet there, so neither
    # rank's next step holds it (without the meeting rank 0's step 3 would wait for rank 1 inside
    # its all-reduce: at least AFTER_WINDOW_S, a sleep's lower bound; the step is tens of ms).
    for rank in (0, 1):
        after = _lines(run_dir / f"metrics/rank{rank}.jsonl")[WINDOW_END + 1]
        assert after["step_time_ms"] < AFTER_WINDOW_S * 1e3, (rank, after)
    run = analyze(run_dir, cache=False)
    assert run.errors == [] and len(run.ranks) == 2


def test_a_recorder_opened_on_rank_0_only_records_rank_0_and_says_so(tmp_path):
    done = _torchrun(tmp_path, "rank0-only")
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("recorder:")]
    assert said == [
        "recorder: rank(s) 1 of 2 did not open the recorder within 5 s: recording the ranks that did "
        "(call recorder.open on every rank)"
    ]
    man = _manifest(tmp_path / "ddp-rank0-only")
    assert man.status == "completed" and man.files.metrics == ["metrics/rank0.jsonl"]
    assert man.collective_timing == "none: not every rank opened the recorder"
    assert analyze(tmp_path / "ddp-rank0-only", cache=False).errors == []


def test_a_recorder_opened_on_rank_1_only_is_one_line_and_training_goes_on(tmp_path):
    done = _torchrun(tmp_path, "rank1-only")
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("recorder:")]
    assert said == [
        "recorder: rank 1: rank 0 did not open the recorder within 5 s: not recording "
        "(call recorder.open on every rank)"
    ]
    assert list(tmp_path.iterdir()) == []


def test_the_first_failing_ranks_error_is_the_runs(tmp_path):
    done = _torchrun(tmp_path, "rank1-fails")
    assert done.returncode != 0
    man = _manifest(tmp_path / "ddp-rank1-fails")
    assert man.status == "failed"
    assert re.fullmatch(r"rank 1: ValueError: rank 1 read a corrupt shard \(recorder_ddp_loop\.py:\d+\)", man.error)
    steps = [m["step"] for m in _lines(tmp_path / "ddp-rank1-fails/metrics/rank1.jsonl")]
    assert steps == [0, 1]
    assert analyze(tmp_path / "ddp-rank1-fails", cache=False).run_manifest.status == "failed"
