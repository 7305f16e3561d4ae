"""Stragglers from collective arrivals and step times, with exact waits and skews."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyzer.metrics.stragglers import (
    arrivals_from_records,
    arrivals_from_traces,
    collective_kind,
    collective_table,
    find_stragglers,
)
from analyzer.ingest.tables import events_from_records

MS = 1_000_000
STEP_MS = 100.0


def records(
    n_ranks: int, n_steps: int, late: dict[int, float], jitter_ms: float = 0.0, seed: int = 0, per_step: int = 3
) -> pd.DataFrame:
    """reftrain-like collective records: per step ``per_step`` all-reduces of 1 GB.

    Rank r's first collective of each step starts ``late[r]`` ms after the
    others; later collectives of the step start together (the late rank has
    caught up). The last arriver's transfer takes 10 ms.
    """
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(n_steps):
        base = step * STEP_MS * MS
        for k in range(per_step):
            t0 = base + (20 + 20 * k) * MS
            starts = {
                r: t0 + (late.get(r, 0.0) * MS if k == 0 else 0) + int(rng.normal(0, jitter_ms) * MS)
                for r in range(n_ranks)
            }
            end = max(starts.values()) + 10 * MS
            for r in range(n_ranks):
                rows.append(
                    {
                        "rank": r,
                        "step": step,
                        "seq": step * per_step + k,
                        "pg": "0",
                        "kind": "all_reduce",
                        "bytes": 1_000_000_000,
                        "group_size": n_ranks,
                        "start_ns": int(starts[r]),
                        "end_ns": int(end),
                        "clock": "host",
                    }
                )
    return pd.DataFrame(rows)


def step_times(
    n_ranks: int, n_steps: int, slow: dict[int, float] | None = None, jitter_ms: float = 0.0, seed: int = 1
) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    slow = slow or {}
    return pd.DataFrame(
        [
            {"rank": r, "step": s, "step_time_ms": STEP_MS + slow.get(r, 0.0) + rng.normal(0, jitter_ms)}
            for s in range(n_steps)
            for r in range(n_ranks)
        ]
    )


def test_two_ranks_late_rank_is_named_and_others_wait_five_ms() -> None:
    arrivals = arrivals_from_records(records(2, 10, late={1: 5.0}), offsets_ns=[0, 0])
    table = collective_table(arrivals)
    first = table.loc[table["key"] == "0:0"].iloc[0]
    assert first["skew_ms"] == pytest.approx(5.0)
    assert first["last_rank"] == 1
    assert first["wait_ms"] == pytest.approx(5.0)  # rank 0 waited 5 ms; the last arriver waits 0
    assert first["duration_ms"] == pytest.approx(10.0)
    # 1 GB in 10 ms = 100 GB/s; all-reduce bus factor 2(n-1)/n = 1 for two ranks.
    assert first["algbw_gbps"] == pytest.approx(100.0)
    assert first["busbw_gbps"] == pytest.approx(100.0)
    result = find_stragglers(step_times(2, 10), arrivals, step_source="test", arrival_source="test")
    assert result.ranks == [1]
    r0, r1 = result.per_rank
    assert r1.signals == ["lateness"]
    assert r1.lateness_excess_ms == pytest.approx(5.0)
    assert r1.caused_wait_ms == pytest.approx(50.0)  # 10 steps x 5 ms
    assert r0.wait_ms == pytest.approx(50.0)
    assert r1.wait_ms == pytest.approx(0.0)
    # Last at the first collective of each step; the other two start together, so no one is last.
    assert (r1.last_arrivals, r1.n_collectives, r0.last_arrivals) == (10, 30, 0)
    assert "rank 1" in result.verdict and "5.00 ms/step" in result.verdict


def test_clean_noisy_run_names_no_one() -> None:
    for seed in range(5):
        arrivals = arrivals_from_records(records(2, 20, late={}, jitter_ms=0.5, seed=seed), offsets_ns=None)
        result = find_stragglers(
            step_times(2, 20, jitter_ms=1.0, seed=seed), arrivals, step_source="t", arrival_source="t"
        )
        assert result.ranks == [], result.verdict
        assert result.verdict == "no persistent straggler among 2 ranks"


def test_noisy_run_with_a_late_rank_among_eight() -> None:
    arrivals = arrivals_from_records(records(8, 15, late={5: 4.0}, jitter_ms=0.3, seed=3), offsets_ns=None)
    result = find_stragglers(step_times(8, 15, jitter_ms=0.5), arrivals, step_source="t", arrival_source="t")
    assert result.ranks == [5]
    assert result.per_rank[5].lateness_excess_ms == pytest.approx(4.0, abs=0.6)


def test_clock_offsets_are_subtracted_before_comparing_arrivals() -> None:
    raw = records(2, 6, late={})
    shifted = raw.copy()
    one_second = 1_000_000_000
    shifted.loc[shifted["rank"] == 1, ["start_ns", "end_ns"]] += one_second  # rank 1's clock runs 1 s ahead
    aligned = find_stragglers(
        step_times(2, 6), arrivals_from_records(shifted, [0, one_second]), step_source="t", arrival_source="t"
    )
    assert aligned.ranks == []
    assert collective_table(arrivals_from_records(shifted, [0, one_second]))["skew_ms"].max() == pytest.approx(0.0)
    unaligned = find_stragglers(
        step_times(2, 6), arrivals_from_records(shifted, None), step_source="t", arrival_source="t"
    )
    assert unaligned.ranks == [1]


def test_step_time_signal_without_collectives() -> None:
    result = find_stragglers(
        step_times(4, 12, slow={3: 8.0}, jitter_ms=0.5),
        records(0, 0, {}).iloc[0:0],
        step_source="t",
        arrival_source=None,
    )
    assert result.ranks == [3]
    r3 = result.per_rank[3]
    assert r3.signals == ["step_time"]
    assert r3.step_time_ratio == pytest.approx(108 / 100, rel=0.01)
    assert "no collectives matched" in result.notes[0]


def test_late_in_seven_of_nine_steps_is_not_persistent() -> None:
    # Rank 1 is 20 ms late in 7 of 9 steps, 20 ms early in the other two: a sign test
    # gives p = 46/512 = 0.09 for that, so the verdict is "not proven persistent".
    rows = records(2, 9, late={1: 20.0})
    early = rows["step"].isin([2, 6]) & (rows["rank"] == 0) & (rows["seq"] % 3 == 0)
    rows.loc[early, "start_ns"] += 40 * MS
    result = find_stragglers(step_times(2, 9), arrivals_from_records(rows, None), step_source="t", arrival_source="t")
    r1 = result.per_rank[1]
    assert r1.lateness_slow_share == pytest.approx(7 / 9)
    assert r1.lateness_sign_p == pytest.approx(46 / 512)
    assert r1.lateness_z > 3.0
    assert result.ranks == []
    # One more late step (8 of 9, p = 10/512) and it is.
    rows.loc[early & (rows["step"] == 6), "start_ns"] -= 40 * MS
    assert find_stragglers(
        step_times(2, 9), arrivals_from_records(rows, None), step_source="t", arrival_source="t"
    ).ranks == [1]


def test_small_excess_is_not_a_straggler() -> None:
    # Rank 1 is consistently 0.5 ms late: real, but under min_excess_ms (1 ms).
    result = find_stragglers(
        step_times(2, 10),
        arrivals_from_records(records(2, 10, late={1: 0.5}), None),
        step_source="t",
        arrival_source="t",
    )
    assert result.ranks == []
    assert result.per_rank[1].lateness_excess_ms == pytest.approx(0.5)


def test_too_few_steps_or_ranks_gives_no_verdict() -> None:
    few = find_stragglers(
        step_times(2, 4),
        arrivals_from_records(records(2, 4, late={1: 50.0}), None),
        step_source="t",
        arrival_source="t",
    )
    assert few.ranks == [] and few.verdict.startswith("no verdict: fewer than 5 steps")
    # Late in all 4 steps: a fair coin does that 1 time in 16, too often to call it persistent.
    assert few.per_rank[1].lateness_sign_p == pytest.approx(1 / 16)
    alone = find_stragglers(step_times(1, 10), records(0, 0, {}).iloc[0:0], step_source="t", arrival_source=None)
    assert alone.ranks == [] and "two or more ranks" in alone.verdict


def host_trace(rank: int, late_ms: float, n_steps: int = 6):
    """A CPU rank: ProfilerStep windows and two c10d all-reduces per step, the first late by late_ms."""
    rows = []
    for s in range(n_steps):
        base = s * 100 * MS
        rows.append(
            {
                "rank": rank,
                "cat": "user_annotation",
                "name": f"ProfilerStep#{s}",
                "start_ns": base,
                "end_ns": base + 100 * MS,
            }
        )
        rows.append(
            {
                "rank": rank,
                "cat": "cpu_op",
                "name": "c10d::allreduce_",
                "start_ns": base + int((30 + late_ms) * MS),
                "end_ns": base + int((30.1 + late_ms) * MS),
            }
        )
        rows.append(
            {
                "rank": rank,
                "cat": "user_annotation",
                "name": "gloo:all_reduce",
                "tid": 9,
                "start_ns": base + int((30.2 + late_ms) * MS),
                "end_ns": base + 45 * MS,
            }
        )
        rows.append(
            {
                "rank": rank,
                "cat": "cpu_op",
                "name": "c10d::allreduce_",
                "start_ns": base + 60 * MS,
                "end_ns": base + 61 * MS,
            }
        )
    events = events_from_records(rows)
    steps = pd.DataFrame(
        {
            "step": range(n_steps),
            "start_ns": [s * 100 * MS for s in range(n_steps)],
            "end_ns": [(s + 1) * 100 * MS for s in range(n_steps)],
        }
    )
    return events, steps


def test_trace_arrivals_match_host_ops_by_order() -> None:
    arrivals, source, notes = arrivals_from_traces({0: host_trace(0, 0.0), 1: host_trace(1, 5.0)})
    assert source == "host c10d collective ops"
    assert notes == []
    assert len(arrivals) == 24  # gloo ranges are not arrivals
    table = collective_table(arrivals)
    assert table["kind"].unique().tolist() == ["all_reduce"]
    assert table["skew_ms"].tolist() == pytest.approx([5.0, 0.0] * 6)
    assert table["last_rank"].tolist() == [1, -1] * 6
    steps = pd.concat([pd.DataFrame({"rank": r, "step": range(6), "step_time_ms": 100.0}) for r in (0, 1)])
    result = find_stragglers(steps, arrivals, step_source="t", arrival_source=source)
    assert result.ranks == [1]


def device_trace(rank: int, starts_ms: list[float]):
    rows = [
        {
            "rank": rank,
            "cat": "user_annotation",
            "name": f"ProfilerStep#{i}",
            "start_ns": i * 100 * MS,
            "end_ns": (i + 1) * 100 * MS,
        }
        for i in range(len(starts_ms))
    ]
    for t in starts_ms:
        rows.append(
            {
                "rank": rank,
                "cat": "kernel",
                "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
                "tid": 13 + rank,
                "start_ns": int(t * MS),
                "end_ns": int((t + 2) * MS),
            }
        )
    rows.append({"rank": rank, "cat": "kernel", "name": "sm90_gemm", "tid": 7, "start_ns": 0, "end_ns": MS})
    events = events_from_records(rows)
    steps = pd.DataFrame(
        {
            "step": range(len(starts_ms)),
            "start_ns": [i * 100 * MS for i in range(len(starts_ms))],
            "end_ns": [(i + 1) * 100 * MS for i in range(len(starts_ms))],
        }
    )
    return events, steps


def test_trace_arrivals_from_comm_kernels_and_uneven_counts() -> None:
    arrivals, source, notes = arrivals_from_traces(
        {0: device_trace(0, [10, 110, 210]), 1: device_trace(1, [13, 113, 213])}  # streams differ across ranks
    )
    assert source == "device communication kernels"
    table = collective_table(arrivals)
    assert table["skew_ms"].tolist() == pytest.approx([3.0, 3.0, 3.0])
    assert table["last_rank"].tolist() == [1, 1, 1]
    uneven, _, notes = arrivals_from_traces({0: device_trace(0, [10, 110, 210]), 1: device_trace(1, [13, 113])})
    assert uneven.empty
    assert "different counts" in notes[0]


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("c10d::allreduce_", "all_reduce"),
        ("ncclDevKernel_AllGather_RING_LL", "all_gather"),
        ("ncclKernel_ReduceScatter_RING_LL_Sum_float", "reduce_scatter"),
        ("c10d::broadcast_", "broadcast"),
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", "send_recv"),
        ("c10d::_allgather_base_", "all_gather"),
        ("c10d::reduce_", "reduce"),
    ],
)
def test_collective_kind(name: str, kind: str) -> None:
    assert collective_kind(name) == kind


def test_straggler_result_is_json_ready() -> None:
    import json

    result = find_stragglers(
        step_times(2, 10),
        arrivals_from_records(records(2, 10, late={1: 5.0}), None),
        step_source="t",
        arrival_source="t",
    )
    out = json.loads(json.dumps(result.to_json()))
    assert out["ranks"] == [1]
    assert out["per_rank"][1]["flagged"] is True
    assert out["config"]["min_slow_share"] == 0.75


def test_leave_one_out_median_matches_brute_force() -> None:
    from analyzer.metrics.stragglers import _leave_one_out_excess

    rng = np.random.default_rng(0)
    for _ in range(200):
        n_steps, n_ranks = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        x = rng.normal(size=(n_steps, n_ranks)).round(1)
        x[rng.random(x.shape) < 0.2] = np.nan  # ranks missing some steps
        got = _leave_one_out_excess(pd.DataFrame(x)).to_numpy()
        for j in range(n_ranks):
            others = np.delete(x, j, axis=1)
            for s in range(n_steps):
                finite = others[s][np.isfinite(others[s])]
                expected = x[s, j] - np.median(finite) if finite.size else np.nan
                assert np.isclose(got[s, j], expected, equal_nan=True), (x, j, s)


def test_disturbed_steps_follow_profiler_windows_and_checkpoints() -> None:
    from analyzer.metrics.stragglers import disturbed_steps

    assert disturbed_steps([4, 5, 6, 10, 11], ["checkpoints/step3", "checkpoints/step9/"]) == {
        4,
        5,
        6,
        7,
        10,
        11,
        12,
        3,
        9,
    }
    assert disturbed_steps([], []) == set()


# ------------------------------------------------ real-length runs (n >= 1024)
def test_sign_test_p_is_finite_past_a_thousand_steps() -> None:
    """The old ``sum(comb) / 2.0**n`` raised OverflowError at n >= 1024."""
    from scipy.stats import binom

    from analyzer.metrics.stragglers import sign_test_p

    assert sign_test_p(5, 10) == pytest.approx(638 / 1024)  # (C(10,5) + ... + C(10,10)) / 2^10
    assert sign_test_p(1100, 1100) == pytest.approx(0.5**1100, rel=1e-9)  # about 7e-332: a subnormal, not 0
    assert sign_test_p(560, 1100) == pytest.approx(binom.sf(559, 1100, 0.5))
    assert sign_test_p(0, 1100) == 1.0 and sign_test_p(0, 0) == 1.0


def test_straggler_table_of_1100_steps_names_the_late_rank() -> None:
    n_steps = 1100
    arrivals = arrivals_from_records(records(2, n_steps, late={1: 5.0}, jitter_ms=0.2, per_step=1), offsets_ns=[0, 0])
    result = find_stragglers(step_times(2, n_steps, jitter_ms=0.5), arrivals, step_source="test", arrival_source="test")
    assert result.ranks == [1]
    r1 = result.per_rank[1]
    assert r1.n_steps == n_steps
    assert r1.lateness_excess_ms == pytest.approx(5.0, abs=0.1)
    assert r1.lateness_slow_share == 1.0
    assert 0.0 <= r1.lateness_sign_p < 1e-300  # 0.5**1100
    assert result.per_rank[0].lateness_sign_p == 1.0  # never late


def write_long_metrics_run(root: Path, n_steps: int, slow_rank: int = 1, delay_ms: float = 5.0) -> Path:
    """A metrics-only 2-rank run directory of ``n_steps`` steps, as reftrain writes it with the profiler off.

    Rank ``slow_rank`` starts every all-reduce ``delay_ms`` late; step
    times are 100 ms plus a deterministic 0..0.9 ms ripple.
    """
    import orjson

    run = root / "long-run"
    peak, flops_per_token, tokens = 1e12, 1e6, 4096
    for name in ("metrics", "collectives"):
        (run / name).mkdir(parents=True)
    t0 = 1_800_000_000_000_000_000
    for rank in (0, 1):
        metrics, colls = [], []
        for s in range(n_steps):
            step_ms = 100.0 + (s % 10) * 0.1
            start = t0 + s * 100 * MS
            metrics.append(
                {
                    "step": s,
                    "rank": rank,
                    "loss": 5.0,
                    "step_time_ms": step_ms,
                    "data_wait_ms": 1.0,
                    "forward_ms": 30.0,
                    "backward_ms": 50.0,
                    "optimizer_ms": 5.0,
                    "grad_sync_ms": 0.0,
                    "comm_ms": 10.0,
                    "tokens": tokens,
                    "tokens_per_s": tokens / step_ms * 1e3,
                    "mfu": tokens * flops_per_token / (step_ms / 1e3 * peak),
                    "hfu": tokens * flops_per_token / (step_ms / 1e3 * peak),
                    "mem_bytes": 1 << 30,
                    "mem_kind": "cpu_rss",
                    "profiled": False,
                    "lr": 1e-3,
                    "grad_norm": 1.0,
                    "injected_ms": 0.0,
                    "time_ns": start + int(step_ms * MS),
                }
            )
            arrive = start + 60 * MS + (int(delay_ms * MS) if rank == slow_rank else 0)
            colls.append(
                {
                    "step": s,
                    "rank": rank,
                    "seq": s,
                    "kind": "all_reduce",
                    "bytes": 1 << 20,
                    "dtype": "float32",
                    "pg": "0",
                    "group_size": 2,
                    "start_ns": arrive,
                    "end_ns": start + 60 * MS + int(delay_ms * MS) + 2 * MS,
                    "clock": "host",
                }
            )
        (run / f"metrics/rank{rank}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in metrics))
        (run / f"collectives/rank{rank}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in colls))
    (run / "config.yaml").write_text("train:\n  steps: %d\n" % n_steps)
    manifest = {
        "schema": "reftrain.run/1",
        "run_id": run.name,
        "status": "completed",
        "world_size": 2,
        "backend": "gloo",
        "flops": {"per_token": flops_per_token, "per_token_hardware": flops_per_token},
        "peak_flops": {"per_s": peak, "source": "override", "detail": "test", "dtype": "fp32"},
        "tokens_per_step": 2 * tokens,
        "steps": n_steps,
        "start_step": 0,
        "warmup_steps": 3,
        "profiled_steps": [],
        "clock": {"method": "same host", "offsets_ns": [0, 0], "uncertainty_ns": 0},
        "inject": {"slow_rank": None, "delay_ms": None, "slowdown": None},
        "files": {
            "config": "config.yaml",
            "metrics": ["metrics/rank0.jsonl", "metrics/rank1.jsonl"],
            "collectives": ["collectives/rank0.jsonl", "collectives/rank1.jsonl"],
            "telemetry": [],
            "traces": [],
            "checkpoints": [],
        },
        "schemas": {
            "metrics": "reftrain.metrics/1",
            "collectives": "reftrain.collectives/1",
            "telemetry": "reftrain.telemetry/1",
        },
    }
    (run / "run.json").write_bytes(orjson.dumps(manifest))
    return run


def test_report_check_suggest_of_a_1060_step_run_exit_cleanly(tmp_path: Path, capsys) -> None:
    """The issue's case: a 1,060-step metrics-only run made all three commands exit 3 (OverflowError)."""
    from analyzer import cli

    run = write_long_metrics_run(tmp_path, 1060)
    out_json = tmp_path / "report.json"
    assert cli.main(["report", str(run), "--no-cache", "--json", str(out_json)]) == 0, capsys.readouterr().err
    import json

    doc = json.loads(out_json.read_text())
    assert doc["stragglers"]["ranks"] == [1]
    assert doc["stragglers"]["per_rank"][1]["lateness_excess_ms"] == pytest.approx(5.0)
    assert cli.main(["check", str(run), "--baseline", str(run), "--no-cache"]) == 0, capsys.readouterr().err
    assert cli.main(["suggest", str(run), "--no-cache"]) in (0, 1), capsys.readouterr().err
    err = capsys.readouterr().err
    assert "Traceback" not in err and "OverflowError" not in err
