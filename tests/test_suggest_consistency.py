"""Consistency of suggestions on every shared trace.

No suggestion predicts more than removing the part of the step it addresses: for a rule that acts on one
breakdown part with share x of the step, the predicted throughput gain is at most x / (1 - x). The first
suggestion addresses the largest part of the step a rule can act on, or its first note says why not; with exposed
comm over 20 % of the step the first suggestion is a communication one; every suggestion
carries its coverage.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared traces not found at {SHARED}")


def _bench():
    spec = importlib.util.spec_from_file_location(
        "bench_suggest_wild", Path(__file__).resolve().parents[1] / "bench" / "bench_suggest_wild.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(
    "trace", sorted(p.relative_to(SHARED).as_posix() for p in _bench()._files(SHARED)) if SHARED.is_dir() else []
)
def test_no_prediction_above_removing_its_part(trace):
    from analyzer import analyze
    from analyzer.errors import AnalyzerError
    from analyzer.verbs.suggest import suggest
    from analyzer.verbs.suggest.facts import run_facts

    bench = _bench()
    try:
        run = analyze(SHARED / trace)
    except AnalyzerError:
        pytest.skip("not a trace the analyzer reads (its one-line error is the result)")
    f = run_facts(run)
    for s in suggest(run):
        parts = [p for p in bench.parts_of(s.rule) if p in f.shares]
        if s.predicted is None or not parts or not f.step_time_ms:
            continue
        part = "+".join(parts)
        # Removing the whole part (share x of the step) gains at most x / (1 - x) throughput; the what-if's 5 % step
        # floor caps that at 19x. Batch-growth predictions (work_ratio > 1) count too: throughput is what they claim.
        share = min(sum(f.shares[p] for p in parts), 0.95)
        bound = share / (1 - share)
        assert s.gain <= bound + 1e-6, (
            f"{s.rule} predicts +{s.gain:.0%}, more than removing {part} ({share:.0%} of the step: +{bound:.0%})"
        )


@pytest.mark.parametrize(
    "trace", sorted(p.relative_to(SHARED).as_posix() for p in _bench()._files(SHARED)) if SHARED.is_dir() else []
)
def test_first_suggestion_addresses_the_largest_part_or_says_why(trace):
    from analyzer import analyze
    from analyzer.errors import AnalyzerError
    from analyzer.verbs.suggest import suggest
    from analyzer.verbs.suggest.engine import part_of, parts_of
    from analyzer.verbs.suggest.facts import run_facts
    from analyzer.verbs.suggest.run import largest_actionable

    try:
        run = analyze(SHARED / trace)
    except AnalyzerError:
        pytest.skip("not a trace the analyzer reads (its one-line error is the result)")
    f, ranked = run_facts(run), suggest(run)
    for s in ranked:
        assert {"windows_used", "windows_total", "ranks_traced", "ranks_in_job", "limits"} <= set(s.coverage), s.rule
    top = largest_actionable(f)
    if not ranked or top is None:
        return
    first = ranked[0]
    if top[0] not in parts_of(first.rule):
        assert first.notes and first.notes[0].startswith(
            f"ranked first although {top[0]} ({top[1]:.0%} of the step)"
        ), f"{first.rule} is first, the largest actionable part is {top[0]} ({top[1]:.0%}), and no note says why"
    if f.shares.get("exposed_comm", 0.0) > 0.20:
        assert part_of(first.rule) == "exposed_comm", (
            f"exposed comm {f.shares['exposed_comm']:.0%}, first is {first.rule}"
        )
        if first.kind == "diagnosis":
            assert first.rule in {"comm_waiting", "comm_one_rank"} and first.evidence
