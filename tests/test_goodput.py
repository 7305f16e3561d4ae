"""Goodput (analyzer/metrics/goodput.py) on a hand-built run with known lost time.

The run: 2 ranks, 4 steps, checkpoint after step 2, crash during step 3 of
attempt 0, restart resumes from step 2. All figures below are by hand.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pandas as pd
import pytest

from analyzer.metrics.goodput import PARTS, goodput

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()  # attempt 0 starts here


def iso(s: float) -> str:
    return datetime.fromtimestamp(T0 + s, tz=timezone.utc).isoformat(timespec="milliseconds")


def rec(attempt: int, step: int, rank: int, end_s: float, step_ms: float, data_ms: float) -> dict:
    return {
        "attempt": attempt,
        "step": step,
        "rank": rank,
        "time_ns": int(round((T0 + end_s) * 1e9)),
        "step_time_ms": step_ms,
        "data_wait_ms": data_ms,
    }


def run() -> tuple[dict, pd.DataFrame]:
    rows = []
    # Attempt 0 starts at 0 s; start-up 2 s; steps 0, 1, 2 of 1 s each (rank 1 slower: 1.0 vs 0.8;
    # data wait 0.1 on rank 0, 0.2 on rank 1: the max, 0.2, counts). Save after step 1 stalls 0.5 s.
    for rank, ms in ((0, 800.0), (1, 1000.0)):
        rows += [
            rec(0, 0, rank, 3.0, ms, 100.0 + 100 * rank),
            rec(0, 1, rank, 4.0, ms, 100.0 + 100 * rank),
            rec(0, 2, rank, 5.5, ms, 100.0 + 100 * rank),
        ]
    # Rank 1 dies; attempt 1 starts at 8.5 s (3 s after the last record), start-up 1.5 s, then
    # steps 2 and 3 (step 2 run again: attempt 0's step 2 is recomputed), 1 s each, no data wait.
    for rank in (0, 1):
        rows += [rec(1, 2, rank, 11.0, 1000.0, 0.0), rec(1, 3, rank, 12.0, 1000.0, 0.0)]
    manifest = {
        "start_time": iso(0.0),
        "end_time": iso(12.25),
        "attempts": [
            {"attempt": 0, "start_time": iso(0.0), "end_time": iso(8.5), "status": "failed", "resumed_from_step": 0},
            {
                "attempt": 1,
                "start_time": iso(8.5),
                "end_time": iso(12.25),
                "status": "completed",
                "resumed_from_step": 2,
            },
        ],
        "checkpoint_saves": [{"step": 2, "stall_s": 0.5, "attempt": 0}],
    }
    return manifest, pd.DataFrame(rows)


def test_goodput_of_a_restarted_run_by_hand() -> None:
    g = goodput(*run())
    assert g.wall_s == pytest.approx(12.25, abs=1e-3)
    # kept: attempt 0 steps 0, 1 (1.0 - 0.2 each), attempt 1 steps 2, 3 (1.0 each)
    assert g.productive_s == pytest.approx(3.6, abs=1e-6)
    lost = g.lost_s
    assert lost["data_wait"] == pytest.approx(0.4, abs=1e-6)
    assert lost["recomputed"] == pytest.approx(1.0, abs=1e-6)  # attempt 0's step 2
    # attempt 0: first step starts at 3.0 - 1.0 = 2.0; attempt 1: 11.0 - 1.0 - 8.5 = 1.5
    assert lost["startup"] == pytest.approx(3.5, abs=1e-3)
    assert lost["restarts"] == pytest.approx(3.0, abs=1e-3)  # 8.5 - 5.5
    assert lost["checkpoint"] == 0.5
    # the rest: the 0.25 s tail after the last step (12.0 -> 12.25)
    assert lost["other"] == pytest.approx(0.25, abs=1e-3)
    assert g.goodput == pytest.approx(3.6 / 12.25, abs=1e-4)
    assert g.attempts == 2 and g.recomputed_steps == 1
    assert set(lost) == set(PARTS)
    assert g.productive_s + sum(lost.values()) == pytest.approx(g.wall_s, abs=1e-9)


def test_a_run_without_restarts_or_attempts() -> None:
    """Older runs have no `attempts`: one attempt from the manifest's start and end."""
    manifest, m = run()
    m = m[m["attempt"] == 1].drop(columns="attempt")
    g = goodput({"start_time": iso(8.5), "end_time": iso(12.25)}, m)
    assert g.attempts == 1 and g.recomputed_steps == 0
    assert g.productive_s == pytest.approx(2.0, abs=1e-6) and g.lost_s["startup"] == pytest.approx(1.5, abs=1e-3)
    assert g.lost_s["restarts"] == 0.0 and g.lost_s["recomputed"] == 0.0


def test_withheld_without_records_or_start_time() -> None:
    manifest, m = run()
    assert goodput(manifest, m.iloc[0:0]) is None
    assert goodput({}, m) is None


def test_withheld_for_a_restarted_run_whose_records_lack_the_attempt() -> None:
    manifest, m = run()
    assert goodput(manifest, m.drop(columns="attempt")) is None


def test_an_attempt_missing_from_the_record_counts_as_restart_time() -> None:
    """Attempt 1 died in its rendezvous before writing anything; attempt 2 resumed."""
    manifest, m = run()
    m.loc[m["attempt"] == 1, "attempt"] = 2
    manifest["attempts"][1]["attempt"] = 2
    g = goodput(manifest, m)
    assert g.lost_s["restarts"] == pytest.approx(3.0, abs=1e-3) and g.recomputed_steps == 1


def test_a_hung_attempt_counts_its_stall_as_hang_not_restart() -> None:
    """Attempt 0 hangs after its last record at 5.5 s; the watchdog ends it at 7.5 s
    (its end_time); attempt 1 starts at 8.5 s: hang 2.0 s, restarts 1.0 s."""
    manifest, m = run()
    manifest["attempts"][0].update(status="hung", end_time=iso(7.5))
    g = goodput(manifest, m)
    assert g.lost_s["hang"] == pytest.approx(2.0, abs=1e-3)
    assert g.lost_s["restarts"] == pytest.approx(1.0, abs=1e-3)  # 8.5 - 5.5 - 2.0
    assert g.lost_s["other"] == pytest.approx(0.25, abs=1e-3)  # unchanged: the hang moved out of restarts
    assert g.hung_attempts == 1 and not g.preempted
    assert g.productive_s + sum(g.lost_s.values()) == pytest.approx(g.wall_s, abs=1e-9)


def test_a_hung_last_attempt_ends_the_wall_at_the_detection() -> None:
    """No restart: attempt 0 hangs after its record at 5.5 s and the watchdog ends it at 9.0 s."""
    manifest, m = run()
    m = m[m["attempt"] == 0]
    manifest["attempts"] = [manifest["attempts"][0] | {"status": "hung", "end_time": iso(9.0)}]
    g = goodput(manifest, m)
    assert g.wall_s == pytest.approx(9.0, abs=1e-3)
    assert g.lost_s["hang"] == pytest.approx(3.5, abs=1e-3)
    assert g.lost_s["recomputed"] == 0.0 and g.lost_s["restarts"] == 0.0
    # productive: steps 0..2, 0.8 s each; start-up 2.0; data wait 0.6; checkpoint 0.5; other: the rest
    assert g.productive_s == pytest.approx(2.4, abs=1e-6)
    assert g.lost_s["other"] == pytest.approx(9.0 - 2.4 - 0.6 - 2.0 - 3.5 - 0.5, abs=1e-3)


def test_a_preempted_run_recomputes_nothing() -> None:
    """Preempted after step 2 (its save at 5.5 s -> 6.0 s holds step 2): attempt ends at 6.0 s."""
    manifest, m = run()
    m = m[m["attempt"] == 0]
    manifest["attempts"] = [manifest["attempts"][0] | {"status": "preempted", "end_time": iso(6.0)}]
    manifest["checkpoint_saves"].append({"step": 3, "stall_s": 0.5, "attempt": 0, "mode": "sync"})
    g = goodput(manifest, m)
    assert g.preempted and g.hung_attempts == 0 and g.recomputed_steps == 0
    assert g.wall_s == pytest.approx(6.0, abs=1e-3)
    assert g.lost_s["checkpoint"] == 1.0 and g.lost_s["hang"] == 0.0
    assert g.lost_s["other"] == pytest.approx(6.0 - 2.4 - 0.6 - 2.0 - 1.0, abs=1e-3)
