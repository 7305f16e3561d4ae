"""Communication suggestions on foreign traces: the collectives diagnosis wired into the rules, the
ranking that puts exposed comm over 20 % first and says why, and each suggestion's coverage capping its confidence.
Exact answers: synthetic facts and one synthetic trace whose collectives and windows are laid out by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from analyzer.metrics.collectives import diagnose
from analyzer.verbs.suggest import rules_comm, whatif
from analyzer.verbs.suggest.engine import Change, Suggestion, rank
from analyzer.verbs.suggest.run import coverage, first_note
from tests.synth import KinetoTrace
from tests.test_suggest_rules import comm, trace_facts

NCCL_AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
MiB = 2**20


def _rows(sizes, durations_ns, busbw):
    return pd.DataFrame(
        {
            "kind": "all_reduce",
            "start_ns": np.arange(len(sizes)),
            "duration_ns": durations_ns,
            "size_bytes": np.asarray(sizes, np.float64),
            "group_size": 8,
            "dtype": "Float",
            "algbw_gbps": np.nan,
            "busbw_gbps": np.asarray(busbw, np.float64),
            "protocol": "SIMPLE",
        }
    )


# Large all-reduces at 5-200 GB/s busbw on a 450 GB/s link: median 40 GB/s (9 % of peak), spread (p90-p10)/median >= 1.
WAITING = diagnose(_rows([1e8] * 8, [1000] * 8, [5, 10, 20, 30, 50, 80, 150, 200]), 450.0)
NEAR_PEAK = diagnose(_rows([1e8] * 4, [1000] * 4, [300, 310, 320, 330]), 450.0)


def test_comm_waiting_fires_with_the_diagnosis_evidence():
    f = trace_facts(
        exposed_comm_ms=3.0,
        shares={"exposed_comm": 0.3, "compute": 0.7},
        comm_diagnosis=WAITING,
        link_name="NVLink 4",
        ranks_traced=1,
    )
    s = rules_comm.rule_comm_waiting(f)
    assert WAITING.verdict == "waiting" and s is not None and s.kind == "diagnosis"
    assert s.evidence["large_busbw_median_gbps"] == pytest.approx(40.0)
    assert s.evidence["fraction_of_peak"] == pytest.approx(40.0 / 450.0)
    assert s.evidence["large_size_median_bytes"] == 1e8 and s.evidence["link_gbps"] == 450.0
    assert "profile every rank" in s.change.advice
    # Upper bound: the 3 ms exposed removed from the 10 ms step.
    assert s.predicted.step_time_ms_after == pytest.approx(7.0)
    assert s.gain == pytest.approx(10 / 7 - 1)


def test_comm_waiting_silent_near_peak_or_under_five_percent():
    assert rules_comm.rule_comm_waiting(trace_facts(exposed_comm_ms=3.0, comm_diagnosis=NEAR_PEAK)) is None
    assert NEAR_PEAK.verdict == "bandwidth_bound"
    assert rules_comm.rule_comm_waiting(trace_facts(exposed_comm_ms=0.4, comm_diagnosis=WAITING)) is None
    assert rules_comm.rule_comm_waiting(trace_facts(exposed_comm_ms=3.0)) is None


def test_unsized_collectives_waiting_by_duration_spread():
    """No message sizes: 9 LL kernels of 10 us and 1 of 1000 us; the excess 990 us is 990/1090 of the time."""
    rows = _rows([np.nan] * 10, [10_000] * 9 + [1_000_000], [np.nan] * 10).assign(protocol="LL")
    d = diagnose(rows, 450.0)
    assert d.verdict == "waiting"
    assert d.evidence["waiting_time_share"] == pytest.approx(990 / 1090)
    assert d.evidence["long_count"] == 1 and d.evidence["sizes_known"] is False
    # Equal short LL kernels: latency-bound (NCCL's small-message protocol), not waiting.
    assert (
        diagnose(_rows([np.nan] * 4, [10_000] * 4, [np.nan] * 4).assign(protocol="LL"), 450.0).verdict
        == "latency_bound"
    )


def test_waiting_verdict_silences_the_transfer_advice():
    f = trace_facts(
        exposed_comm_ms=3.0, comm=comm(n=40, nbytes=MiB, service=3.0, alpha=0.04, per_byte=1e-7), comm_diagnosis=WAITING
    )
    assert rules_comm.rule_ddp_bucket_size(f) is None
    assert rules_comm.rule_grad_accumulation(f) is None
    assert rules_comm.rule_comm_one_rank(dataclasses.replace(f, ranks_traced=1)) is None  # comm_waiting says it
    assert rules_comm.rule_ddp_bucket_size(dataclasses.replace(f, comm_diagnosis=None)) is not None


def test_grad_accumulation_per_step_without_tokens():
    """Trace, no tokens: 2 ms exposed of 10 ms; 4 micro-batches of 8 ms per step: 10 + 3 x 8 = 34 ms for 4x the work."""
    s = rules_comm.rule_grad_accumulation(trace_facts(exposed_comm_ms=2.0))
    assert s is not None
    assert s.predicted.step_time_ms_after == pytest.approx(34.0)
    assert s.predicted.work_ratio == 4.0 and s.predicted.tokens_per_step_after is None
    assert s.gain == pytest.approx(4 * 10 / 34 - 1)
    assert "no_sync" in s.change.advice
    assert rules_comm.rule_grad_accumulation(trace_facts(exposed_comm_ms=0.5)) is None  # 5 % < 10 %


def _s(rule, gain_step_after, kind="change", confidence="low"):
    f = trace_facts()
    return Suggestion(
        rule, "t", {}, Change({}, "x"), whatif.prediction(f, gain_step_after, "m"), confidence, kind, rule=rule
    )


def test_comm_first_and_the_note_when_not_the_largest_part():
    f = trace_facts(shares={"idle": 0.42, "compute": 0.37, "exposed_comm": 0.21})
    launch = _s("launch_bound", 5.0)  # +100 %
    waiting = _s("comm_waiting", 7.9, kind="diagnosis")  # +27 %
    assert [s.rule for s in rank([launch, waiting])] == ["launch_bound", "comm_waiting"]
    ranked = rank([launch, waiting], comm_first=True)
    assert [s.rule for s in ranked] == ["comm_waiting", "launch_bound"]
    note = first_note(f, ranked, comm_first=True)
    assert note.startswith("ranked first although idle (42% of the step) is the largest part a rule acts on")
    assert "exposed comm is 21% of the step (> 20%)" in note
    # On the largest part: no note. Smaller part with a larger gain: the note gives both gains.
    assert first_note(f, [launch, waiting], comm_first=False) is None
    compile_ = _s("torch_compile", 5.0)
    note = first_note(f, [compile_, launch], comm_first=False)
    assert "its predicted gain (+100%) is above that of launch_bound on idle (+100%)" in note


def test_coverage_caps_confidence():
    f = trace_facts(world_size=1, comm_group_size=8, ranks_traced=1, windows_used=3, windows_total=4, flop_coverage=0.5)
    cov, conf = coverage(f, _s("ddp_bucket_size", 9.0, confidence="medium"))
    assert conf == "low" and cov["ranks_traced"] == 1 and cov["ranks_in_job"] == 8
    assert any("1 of 8 ranks traced" in x for x in cov["limits"]) and any(
        "1 of 4 step windows" in x for x in cov["limits"]
    )
    cov, conf = coverage(f, _s("torch_compile", 9.0, confidence="high"))
    assert conf == "low" and cov["flop_coverage"] == 0.5
    cov, conf = coverage(dataclasses.replace(f, flop_coverage=0.95), _s("torch_compile", 9.0, confidence="high"))
    assert conf == "medium"  # only the flagged window caps it
    full = dataclasses.replace(f, windows_used=4, comm_group_size=1, flop_coverage=0.95)
    assert coverage(full, _s("ddp_bucket_size", 9.0, confidence="medium")) == (
        {"windows_used": 4, "windows_total": 4, "ranks_traced": 1, "ranks_in_job": 1, "limits": ()},
        "medium",
    )


def test_ddp_bucket_size_on_a_foreign_trace_end_to_end(tmp_path):
    """One rank of 8 on an H100, one 10 ms step: 20 all-reduces of 16 KiB in 50 us and 20 of 32 KiB in 60 us, nothing
    else. Fit: 10 us per 16 KiB, alpha 40 us; 983,040 B is one bucket: 39 x 0.04 = 1.56 ms saved of the 2.2 ms exposed."""
    from analyzer import analyze
    from analyzer.verbs.suggest import suggest
    from analyzer.verbs.suggest.facts import run_facts

    t = KinetoTrace(rank=0, world_size=8)
    t.step(1, 0, 10_000)
    at = 100
    for i in range(40):
        small = i % 2 == 0
        t.kernel(NCCL_AR, at, 50 if small else 60, stream=20, args=t.comm_args("allreduce", 4096 if small else 8192))
        at += 200
    run = analyze(t.write(tmp_path / "rank0.json.gz"))
    f = run_facts(run)
    assert f.comm.n_per_step == 40 and f.comm.bytes_per_step == 983_040
    assert f.comm.alpha_ms == pytest.approx(0.04) and f.comm_diagnosis.verdict == "latency_bound"
    assert f.exposed_comm_ms == pytest.approx(2.2)
    ranked = suggest(run)
    # Idle (78 %) is the largest part, but exposed comm is 22 % > 20 %: the comm changes come first, by gain:
    # accumulation 4x the work in 10 + 3 x 7.8 ms (+19.8 %) before the buckets' 10 -> 8.44 ms (+18.5 %).
    assert [s.rule for s in ranked[:2]] == ["grad_accumulation", "ddp_bucket_size"]
    first, bucket = ranked[0], ranked[1]
    assert first.gain == pytest.approx(4 * 10 / 33.4 - 1)
    assert first.notes[0].startswith("ranked first although idle (78% of the step)")
    assert bucket.predicted.step_time_ms_after == pytest.approx(10.0 - 1.56)
    assert bucket.confidence == "low" and bucket.coverage["ranks_in_job"] == 8  # 1 of 8 ranks traced
    assert "bucket_cap_mb=100" in bucket.change.advice
    # One rank traced, exposed comm over 20 %: the diagnosis follows the changes, with the latency-bound verdict.
    assert ranked[2].rule == "comm_one_rank" and ranked[2].evidence["comm_verdict"] == "latency_bound"
    js = bucket.to_json()
    assert js["coverage"]["limits"] == ["1 of 8 ranks traced: waiting for a peer and transfer look the same"]


def test_fsdp_prefetch_hides_all_but_the_first_gather():
    """3 ms exposed of 10 ms, all-gathers half the service time, 4 per step: 3 x 0.5 x 3/4 = 1.125 ms hidden."""
    fsdp = dataclasses.replace(
        comm(n=8, service=4.0, kinds=("all_gather", "reduce_scatter"), gather=0.5), gathers_per_step=4.0
    )
    s = rules_comm.rule_fsdp_prefetch(trace_facts(exposed_comm_ms=3.0, comm=fsdp))
    assert s is not None and "forward_prefetch=True" in s.change.advice
    assert s.predicted.step_time_ms_after == pytest.approx(10.0 - 1.125)
    assert (
        rules_comm.rule_fsdp_prefetch(
            trace_facts(exposed_comm_ms=3.0, comm=dataclasses.replace(fsdp, gathers_per_step=1.0))
        )
        is None
    )
    assert rules_comm.rule_fsdp_prefetch(trace_facts(exposed_comm_ms=3.0, comm=fsdp, comm_diagnosis=WAITING)) is None
    assert rules_comm.rule_fsdp_prefetch(trace_facts(exposed_comm_ms=0.5, comm=fsdp)) is None  # 5 % < 10 %
    assert rules_comm.rule_fsdp_prefetch(trace_facts(exposed_comm_ms=3.0, comm=comm(n=8, alpha=0.1))) is None  # DDP


def test_last_bucket_overlap_on_a_foreign_ddp_trace(tmp_path):
    """One rank of 2, one 5 ms step, all-reduces of 4, 4, 8 and last 24 MiB in 100, 100, 180, 500 us: the fit is exact
    (alpha 20 us, 20 us per MiB). Cap 25 -> 6.25 MiB: the 0.5 ms tail becomes 0.02 + 6.25 x 0.02 = 0.145 ms."""
    from analyzer import analyze
    from analyzer.verbs.suggest import suggest
    from analyzer.verbs.suggest.facts import run_facts

    t = KinetoTrace(rank=0, world_size=2)
    t.step(1, 0, 5_000)
    at = 100
    for mib, dur in ((4, 100), (4, 100), (8, 180), (24, 500)):
        t.kernel(
            "ncclDevKernel_AllReduce_Sum_f32_RING_SIMPLE",
            at,
            dur,
            stream=20,
            args=t.comm_args("allreduce", mib * MiB // 4),
        )
        at += dur + 200
    run = analyze(t.write(tmp_path / "rank0.json.gz"))
    f = run_facts(run)
    assert f.comm.last_bytes == 24 * MiB and f.comm.last_ms == pytest.approx(0.5)
    assert f.comm.alpha_ms == pytest.approx(0.02) and f.comm.per_byte_ms * MiB == pytest.approx(0.02)
    assert f.comm_diagnosis.verdict == "mixed"  # ~10 % of the H100's 450 GB/s, narrow spread
    s = next(s for s in suggest(run) if s.rule == "last_bucket_overlap")
    assert s.change.overrides == {"parallel.bucket_cap_mb": 6.25}
    assert s.predicted.step_time_ms_after == pytest.approx(5.0 - (0.5 - 0.145))
    # Silent when the last all-reduce is already under the smaller cap, or on a latency-bound verdict.
    small = dataclasses.replace(f, comm=dataclasses.replace(f.comm, last_bytes=6 * MiB))
    assert rules_comm.rule_last_bucket_overlap(small) is None
    latency = diagnose(_rows([4096] * 4, [50_000] * 4, [1] * 4), 450.0)
    assert rules_comm.rule_last_bucket_overlap(dataclasses.replace(f, comm_diagnosis=latency)) is None
    assert rules_comm.rule_last_bucket_overlap(dataclasses.replace(f, comm_diagnosis=WAITING)) is None
