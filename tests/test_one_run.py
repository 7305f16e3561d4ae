"""Traces of different runs are never analyzed silently as one (analyzer/ingest/load.py, _check_one_run;
docs/loading.md, "One run"): ranks that disagree on the device type or the job identity their traces record
are an error naming the files; ranks far apart in time are a warning naming them. A normal run, the real
2-rank example runs and every shared trace folder give neither."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from synth import KinetoTrace
from test_cli import run_main
from test_compare import write_run

from analyzer.api import analyze
from analyzer.errors import AnalyzerError
from analyzer.ingest.load import FAR_APART_MIN_NS, load_traces

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "traces"
EXAMPLE, EXAMPLE_SLOW = REPO / "traces" / "example-ddp-w2", REPO / "traces" / "example-ddp-w2-slow-rank1"


def _rank(
    rank: int, *, gpu: bool = True, offset_us: float = 0.0, step_us: float = 1000.0, dist: dict | None = None
) -> KinetoTrace:
    """One rank of a 2-rank job: three steps of `step_us` from `offset_us`, a kernel (GPU) or an op (CPU) each."""
    t = KinetoTrace(rank=rank, world_size=2, gpu=gpu)
    for i in range(3):
        s = offset_us + i * step_us
        t.step(10 + i, s, step_us)
        if gpu:
            t.kernel("sgemm", s + 100, 200, launch_us=s + 30)
        else:
            t.cpu_op("aten::mm", s + 100, 200)
    if dist is not None:
        t.extra_top["distributedInfo"] = dist
    return t


def _mixed_warnings(ra) -> list[str]:
    return [w for w in ra.warnings if "different runs" in w]


def test_a_gpu_rank_and_a_cpu_gloo_rank_are_an_error_naming_both(tmp_path, capsys) -> None:
    _rank(0).write(tmp_path / "rank0.json.gz")
    _rank(1, gpu=False).write(tmp_path / "rank1.json.gz")  # gloo, no device
    with pytest.raises(AnalyzerError) as exc:
        analyze(tmp_path, cache=False)
    message = str(exc.value)
    assert message == (
        "traces of different runs: rank0.json.gz: GPU, backend nccl, default pg backend_config "
        "cpu:gloo,cuda:nccl; rank1.json.gz: CPU-only, backend gloo, default pg backend_config "
        "cpu:gloo,cuda:gloo. Ranks of one run share these; analyze each run's traces on its own"
    )
    # The loader the dashboard's timeline uses says the same.
    with pytest.raises(AnalyzerError, match="traces of different runs"):
        load_traces(sorted(tmp_path.glob("*.json.gz")), cache=False, progress=False)
    code, out, err = run_main(capsys, "report", str(tmp_path), "--no-cache")
    assert code == 2 and out == ""
    assert err.splitlines() == [f"analyzer: error: {message}"]


def test_a_different_master_port_is_a_different_job(tmp_path) -> None:
    for rank, port in ((0, 29500), (1, 29501)):
        dist = {"backend": "nccl", "rank": rank, "world_size": 2, "master_addr": "10.0.0.1", "master_port": port}
        _rank(rank, dist=dist).write(tmp_path / f"rank{rank}.json.gz")
    with pytest.raises(AnalyzerError, match=r"rank0.json.gz: master_port 29500; rank1.json.gz: master_port 29501"):
        analyze(tmp_path, cache=False)


def test_a_normal_two_rank_run_gives_neither(tmp_path) -> None:
    ra = analyze(write_run(tmp_path / "run"), cache=False)
    assert sorted(r.rank for r in ra.ranks) == [0, 1] and _mixed_warnings(ra) == []


@pytest.mark.parametrize("shift_s, warned", [(9.9, False), (10.1, True), (3600.0, True)])
def test_short_windows_far_apart_are_a_warning(tmp_path, shift_s, warned) -> None:
    """3 ms traces: the 10 s floor decides (2 x 3 ms is far below it)."""
    _rank(0).write(tmp_path / "rank0.json.gz")
    _rank(1, offset_us=shift_s * 1e6).write(tmp_path / "rank1.json.gz")
    ra = analyze(tmp_path, cache=False)
    assert sorted(r.rank for r in ra.ranks) == [0, 1]  # still analyzed
    expected = [
        f"rank1.json.gz starts {shift_s:,.1f} s after rank0.json.gz, further apart than "
        f"{FAR_APART_MIN_NS / 1e9:,.1f} s (2x the longest rank's trace, at least 10 s): traces of different "
        "runs? Ranks of one run record the same steps"
    ]
    assert _mixed_warnings(ra) == (expected if warned else [])


@pytest.mark.parametrize("shift_s, warned", [(59.0, False), (61.0, True)])
def test_long_windows_allow_twice_their_span(tmp_path, shift_s, warned) -> None:
    """Three 10 s steps: a 30 s trace (rank 0's events end with its last step), so 60 s apart is allowed."""
    _rank(0, step_us=10e6).write(tmp_path / "rank0.json.gz")
    _rank(1, step_us=10e6, offset_us=shift_s * 1e6).write(tmp_path / "rank1.json.gz")
    ra = analyze(tmp_path, cache=False)
    warnings = _mixed_warnings(ra)
    assert len(warnings) == int(warned)
    if warned:
        assert "further apart than 60.0 s" in warnings[0]


def test_the_real_example_runs_give_none_and_mixing_them_warns() -> None:
    """The committed reftrain runs (2 CPU ranks, torch 2.13, gloo): their ranks start 27 ms apart, no warning.
    Rank 0 of one with rank 1 of the other (same job config, recorded 52 s apart) is warned about."""
    for run in (EXAMPLE, EXAMPLE_SLOW):
        assert _mixed_warnings(analyze(run, cache=False)) == []
    ra = analyze(
        [EXAMPLE / "traces" / "rank0.step7.json.gz", EXAMPLE_SLOW / "traces" / "rank1.step7.json.gz"], cache=False
    )
    warnings = _mixed_warnings(ra)
    assert (
        len(warnings) == 1
        and "rank1.step7.json.gz starts 5" in warnings[0]
        and "after rank0.step7.json.gz" in warnings[0]
    )


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/traces is absent (the shared real traces)")
def test_shared_traces_give_no_false_alarm_and_mixed_real_traces_an_error() -> None:
    folders = sorted(
        {
            p.parent
            for p in SHARED.rglob("*.json*")
            if "csvs" not in p.parent.name and p.name != "execution_details.json"
        }
    )
    assert len(folders) >= 15
    for folder in folders:
        assert _mixed_warnings(analyze(folder)) == [], folder
    diff = SHARED / "hta-samples" / "trace_diff"
    with pytest.raises(AnalyzerError, match=r"test.json.gz: world_size 2; control.json.gz: world_size 8"):
        analyze([diff / "control" / "control.json.gz", diff / "test" / "test.json.gz"])


def test_the_rank_summaries_keep_what_the_check_needs(tmp_path) -> None:
    """A second and third analysis read the stored rank summaries and then the stored analysis
    (analyzer/rankcache.py, analyzer/runcache.py): the same error and the same warning."""
    mixed, apart = tmp_path / "mixed", tmp_path / "apart"
    for folder, second in ((mixed, _rank(1, gpu=False)), (apart, _rank(1, offset_us=3600e6))):
        folder.mkdir()
        _rank(0).write(folder / "rank0.json.gz")
        second.write(folder / "rank1.json.gz")
    for _ in range(3):
        with pytest.raises(AnalyzerError, match="rank1.json.gz: CPU-only, backend gloo"):
            analyze(mixed)
    first = _mixed_warnings(analyze(apart))
    assert len(first) == 1 and "3,600.0 s after" in first[0]
    assert _mixed_warnings(analyze(apart)) == first and _mixed_warnings(analyze(apart)) == first
    assert list((apart / ".analyzer-cache").glob("*.rank"))  # the summaries were stored and read
