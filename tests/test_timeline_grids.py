"""Timelines from rank summaries (analyzer.metrics.timeline: timeline_grid, overview_from_grids),
the slowest ranks (StragglerResult.slowest) and finished analyses kept (analyzer/runcache.py).

The grid path must give exactly what binning the events gives over the same bin edges
(analyzer.metrics.timeline.occupancy, waits at collectives included), for GPU and CPU traces.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from dashboard_support import write_gpu_traces, write_many_rank_traces
from synth import KinetoTrace

from analyzer.api import analyze
from analyzer.ingest.load import load_traces
from analyzer.metrics.stragglers import collective_spans, wait_intervals
from analyzer.metrics.timeline import FINE_BINS, occupancy, overview, states_of, timeline_grid

REPO = Path(__file__).resolve().parent.parent


def _from_events(files: list[Path]):
    ts = load_traces(files)
    events = {r: t.events for r, t in ts.ranks.items()}
    return events, overview(events, {r: t.steps for r, t in ts.ranks.items()}, 200)


def _assert_same_as_events(ra, files: list[Path], n_bins: int = 200) -> None:
    """Every rank's bins from the grids equal occupancy() of its events over the same edges."""
    window = ra.timeline_windows()[0]
    ov, notes = ra.timeline_overview(window, n_bins)
    events, ref = _from_events(files)
    assert notes == [] and ov.source == ref.source and ov.origins == ref.origins
    # The grid's span holds the events' span, at most one fine bin wider on each side.
    assert ov.span_ns[0] <= ref.span_ns[0] and ov.span_ns[1] >= ref.span_ns[1]
    waits = wait_intervals(collective_spans(events))
    for rank, ev in events.items():
        got = ov.occupancy[ov.occupancy["rank"] == rank].reset_index(drop=True)
        want = occupancy(ev, ref.origins[rank], ov.span_ns, len(got), ov.source, waits.get(rank))
        assert got["start_ns"].tolist() == want["start_ns"].tolist()
        for state in states_of(ov.source):
            assert np.array_equal(got[f"{state}_frac"].to_numpy(), want[f"{state}_frac"].to_numpy()), (rank, state)
        shares = got[[f"{s}_frac" for s in states_of(ov.source)]].sum(axis=1).to_numpy()
        assert shares == pytest.approx(np.ones(len(got)))


def test_grid_bins_equal_event_bins_on_gpu_traces(tmp_path):
    write_gpu_traces(tmp_path / "gpu")
    ra = analyze(tmp_path / "gpu")
    _assert_same_as_events(ra, sorted((tmp_path / "gpu").glob("*.json.gz")))
    ov, _ = ra.timeline_overview(None, 200)
    # 1.8 ms of events: fine bins of 2,048 ns (879 of them), bins of 4 fine bins: 220 bins of 8.192 us.
    assert len(ov.occupancy) == 2 * 220 and ov.span_ns == (0, 220 * 8192)
    # Rank 0, first step: communication alone from 600 to 800 us.
    rank0 = ov.occupancy[ov.occupancy["rank"] == 0]
    centers_us = (rank0["start_ns"] + rank0["end_ns"]).to_numpy() / 2e3
    assert (rank0["exposed_comm_frac"].to_numpy()[(centers_us > 610) & (centers_us < 790)] == 1.0).all()


def test_grid_bins_equal_event_bins_on_a_cpu_run_with_waits(tmp_path):
    run = tmp_path / "slow"
    shutil.copytree(
        REPO / "traces" / "example-ddp-w2-slow-rank1", run, ignore=shutil.ignore_patterns(".analyzer-cache")
    )
    ra = analyze(run)
    assert ra.timeline_windows() == [7]  # the profiler window of rank{R}.step7.json.gz
    _assert_same_as_events(ra, sorted((run / "traces").glob("*.json.gz")))
    ov, _ = ra.timeline_overview(7, 200)
    assert ov.source == "host" and ov.occupancy["collective_wait_frac"].max() > 0.5  # rank 0 waits for rank 1


def test_many_ranks_waits_from_grids(tmp_path):
    write_many_rank_traces(tmp_path / "many", world=8, straggler=3)
    ra = analyze(tmp_path / "many")
    _assert_same_as_events(ra, sorted((tmp_path / "many").glob("*.json.gz")))
    assert [r.rank for r in ra.stragglers.slowest(2)][0] == 3


def test_a_rank_whose_first_step_is_not_the_common_one_is_aligned_to_a_fine_bin(tmp_path):
    folder = tmp_path / "shifted"
    folder.mkdir()
    for rank in (0, 1):
        t = KinetoTrace(rank=rank, world_size=2)
        steps = (3, 4, 5) if rank == 0 else (4, 5)  # rank 0 has one step more, before the common one
        for i, step in enumerate(steps):
            base = 100 + 1000 * (step - 3)
            t.step(step, base, 1000)
            t.kernel("sm90_xmma_gemm_bf16", base, 600)
        t.write(folder / f"rank{rank}.json.gz")
    ra = analyze(folder)
    ov, _ = ra.timeline_overview(None, 100)
    grid = ra.timeline.grids[0][0]
    # Rank 0's grid is anchored at its step 3; the common origin is step 4's start, 1 ms later,
    # which is a whole number of its fine bins away only up to half a bin.
    assert abs(ov.origins[0] - 1_100_000) <= grid.bin_ns // 2 and ov.origins[1] == 1_100_000
    assert set(ov.steps.loc[ov.steps["rank"] == 0, "step"]) == {3, 4, 5}


def test_timeline_grid_is_bounded_and_covers_the_events():
    from analyzer.ingest.tables import events_from_records

    events = events_from_records(
        [
            dict(rank=0, cat="user_annotation", name="ProfilerStep#1", start_ns=1_000, end_ns=2_001_000, tid=1),
            dict(rank=0, cat="kernel", name="sm90_gemm", start_ns=500, end_ns=3_000_500, tid=7),
        ]
    )
    steps = pd.DataFrame({"step": [1], "start_ns": [1_000], "end_ns": [2_001_000]})
    g = timeline_grid(events, steps, "device", None, "rank0.json")
    n = len(g.parts_ns["compute_ms"])
    assert n <= FINE_BINS + 1 and g.bin_ns & (g.bin_ns - 1) == 0  # a power of two
    start, end = g.anchor_ns + g.first_bin * g.bin_ns, g.anchor_ns + (g.first_bin + n) * g.bin_ns
    assert start <= 500 and end >= 3_000_500 and g.anchor_ns == 1_000
    assert int(g.parts_ns["compute_ms"].sum()) == 3_000_000  # every ns of the kernel, once
    assert timeline_grid(events.iloc[:1], steps, "device", None, "x") is None  # no device event: no grid


def test_slowest_orders_by_ratio_then_lateness(tmp_path):
    write_many_rank_traces(tmp_path / "many", world=6, straggler=4)
    result = analyze(tmp_path / "many", cache=False).stragglers
    order = [r.rank for r in result.slowest(6)]
    assert order[0] == 4 and sorted(order) == list(range(6))
    assert result.slowest(0) == [] and len(result.slowest(100)) == 6


# --------------------------------------------------------------------------- finished analyses kept


def _runs(folder: Path) -> list[Path]:
    return sorted(folder.rglob("analysis.*.run"))


def _forbid_summaries(monkeypatch) -> None:
    from analyzer import rankcache

    def refuse(*_a, **_k):
        raise AssertionError("rank summaries read: the finished analysis should have answered")

    monkeypatch.setattr(rankcache, "read", refuse)


@pytest.mark.parametrize("kind", ["traces", "reftrain"])
def test_third_analysis_is_the_stored_one_and_identical(kind, tmp_path, monkeypatch):
    if kind == "traces":
        folder = tmp_path / "many"
        write_many_rank_traces(folder, world=4, straggler=2)
    else:
        folder = tmp_path / "run"
        shutil.copytree(
            REPO / "traces" / "example-ddp-w2-slow-rank1", folder, ignore=shutil.ignore_patterns(".analyzer-cache")
        )
    fresh = analyze(folder, cache=False)
    analyze(folder)  # parses, writes the rank summaries: not stored (summaries written meanwhile)
    assert _runs(folder) == []
    second = analyze(folder)  # from the summaries: stored
    assert len(_runs(folder)) == 1
    _forbid_summaries(monkeypatch)
    third = analyze(folder)
    assert third.to_json() == second.to_json() == fresh.to_json()
    pd.testing.assert_frame_equal(third.steps, fresh.steps)
    assert third.ranks == fresh.ranks and third.path == folder
    a, _ = third.timeline_overview(third.timeline_windows()[0], 100)
    b, _ = fresh.timeline_overview(fresh.timeline_windows()[0], 100)
    pd.testing.assert_frame_equal(a.occupancy, b.occupancy)
    assert third.rank_collectives.keys() == fresh.rank_collectives.keys()
    for rank, table in fresh.rank_collectives.items():  # stored as one table (runcache.FrameDict), sliced back
        pd.testing.assert_frame_equal(third.rank_collectives[rank], table)


def test_a_changed_input_or_summary_is_not_answered_from_the_stored_analysis(tmp_path):
    folder = tmp_path / "many"
    write_many_rank_traces(folder, world=4, straggler=2)
    for _ in range(2):
        analyze(folder)
    (entry,) = _runs(folder)
    # A rank summary rewritten (here: corrupted): its warning comes back, as without the store.
    summary = sorted(folder.rglob("*.rank"))[0]
    summary.write_bytes(summary.read_bytes()[:50])
    hurt = analyze(folder)
    assert any("rank summary" in w for w in hurt.warnings)
    # A trace replaced: the new content is analyzed.
    write_many_rank_traces(folder, world=4, straggler=1)
    assert analyze(folder).stragglers.ranks == [1]
    assert analyze(folder).stragglers.ranks == [1] and not entry.exists()  # the older entry removed


def test_an_analysis_with_errors_is_never_stored(tmp_path):
    folder = tmp_path / "many"
    write_many_rank_traces(folder, world=3, straggler=1)
    (folder / "rank2.pt.trace.json.gz").write_bytes(b"\x1f\x8b not really gzip")
    for _ in range(3):
        assert len(analyze(folder).errors) == 1
    assert _runs(folder) == []


def test_a_stored_analysis_naming_a_foreign_class_is_ignored(tmp_path):
    import orjson

    folder = tmp_path / "many"
    write_many_rank_traces(folder, world=3, straggler=1)
    for _ in range(2):
        analyze(folder)
    (entry,) = _runs(folder)
    data = entry.read_bytes()
    magic = b"trainperf run analysis\n"
    start = len(magic) + 8
    n = int.from_bytes(data[len(magic) : start], "little")
    meta = orjson.loads(data[start : start + n])
    meta["classes"].append(["subprocess", "Popen"])
    planted = orjson.dumps(meta)
    hurt = magic + len(planted).to_bytes(8, "little") + planted + data[start + n :]
    entry.write_bytes(hurt)
    again = analyze(folder)  # refused: analyzed from the summaries instead, and the entry rewritten
    assert again.stragglers.ranks == [1] and entry.read_bytes() != hurt


def test_a_value_the_store_cannot_hold_is_one_warning(tmp_path):
    from analyzer import runcache

    folder = tmp_path / "many"
    write_many_rank_traces(folder, world=3, straggler=1)
    ra = analyze(folder)
    key = runcache.key_for([folder], None)
    ra.manifest = {"odd": {1, 2}}  # a set: the format holds no sets
    problem = runcache.write(key, ra)
    assert (
        problem is not None
        and problem.startswith(key.entry.name)
        and "could not store the finished analysis" in problem
    )
    assert not key.entry.exists()
