"""The check, compare, history and suggestions JSON documents have the keys of their typed definitions
(TypedDicts next to their writers, docs/ci.md and docs/cli.md), at every level: a key written but not
declared, or declared but not written, fails here. Synthetic results with exact values, except the
suggestions document, which needs an analyzed run (the repository's example run directory).
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

import numpy as np

from analyzer.jsontext import dumps_json
from analyzer.verbs.check import CheckConfig, GateOutcome, GoodputGate, MachineSpeed, MemoryGate, StepSamples
from analyzer.verbs.check import check_samples
from analyzer.verbs.check.goodput import GoodputDocument
from analyzer.verbs.check.machine import MachineSpeedDocument
from analyzer.verbs.check.memory import MemoryDocument
from analyzer.verbs.check.outcome import CheckDocument
from analyzer.verbs.check.result import CHECK_SCHEMA, CheckResult, CheckResultDocument, CheckStatisticDocument
from analyzer.verbs.compare import Comparison, ComparisonDocument, Delta, DeltaDocument, MfuDelta, MfuDeltaDocument
from analyzer.verbs.history import HISTORY_SCHEMA, History, HistoryDocument, HistoryPoint, HistoryPointDocument
from analyzer.verbs.suggest.engine import SuggestionsDocument
from tests.conftest import REPO


def keys(typed: Any) -> set[str]:
    return set(typed.__required_keys__) | set(typed.__optional_keys__)


def samples(values: list[float]) -> StepSamples:
    v = np.asarray(values, dtype=float)
    return StepSamples("mfu", v, np.arange(len(v)), "synthetic", 1)


def comparison() -> Comparison:
    return Comparison(
        base_path="base",
        cand_path="cand",
        step_time=Delta("step", 100.0, 125.0),
        step_time_median=Delta("step", 100.0, 125.0),
        phase_source="metrics",
        phases=[Delta("forward_ms", 40.0, 65.0)],
        kernel_source="none",
        kernels=[],
        ranks=[Delta("rank 0", 100.0, 125.0)],
        mfu=MfuDelta(0.5, 0.4, "manifest", "manifest"),
        memory=[Delta("peak allocated", 10.0, 12.0, "cuda")],
    )


def test_the_dataclass_documents_declare_exactly_the_fields_and_the_added_keys():
    assert keys(DeltaDocument) == {f.name for f in fields(Delta)} | {"delta", "delta_pct"}
    assert keys(MfuDeltaDocument) == {f.name for f in fields(MfuDelta)} | {"cand_comparable", "delta", "drop"}
    assert keys(CheckResultDocument) == {f.name for f in fields(CheckResult)} | {"schema", "metric_label"}
    assert keys(CheckStatisticDocument) == keys(CheckResultDocument) - {"schema", "base_source", "cand_source"}
    assert keys(GoodputDocument) == {f.name for f in fields(GoodputGate)} | {"failed"}
    assert keys(MemoryDocument) == {f.name for f in fields(MemoryGate)} | {"failed"}
    assert keys(MachineSpeedDocument) == {f.name for f in fields(MachineSpeed)}
    assert keys(HistoryPointDocument) == {f.name for f in fields(HistoryPoint)}


def test_the_check_document_is_its_type_at_every_level():
    # The candidate 20 % lower on every step: a regression, 0.2 drop (exact in binary up to rounding).
    base = samples([1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 1.01, 0.99, 1.0])
    cand = samples([0.8 * v for v in base.values])
    result = check_samples(base, cand, CheckConfig())
    outcome = GateOutcome(
        result=result,
        comparison=comparison(),
        cpu=result,
        goodput=GoodputGate(0.9, 0.8, 10.0, 8.0, {"restarts": 2.0}, 2),
        memory=MemoryGate(0.05, 0.2, 10.0, 12.0, "cuda", "records"),
        machine=MachineSpeed(1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.2, 0.2, "regression", 10, 10),
    )
    doc = json.loads(dumps_json(outcome.to_json()))
    assert set(doc) == keys(CheckDocument)
    assert (doc["schema"], doc["verdict"], doc["step_verdict"]) == (CHECK_SCHEMA, "regression", "regression")
    assert abs(doc["drop"] - 0.2) < 1e-12
    assert set(doc["cpu_time"]) == keys(CheckStatisticDocument)
    assert set(doc["goodput"]) == keys(GoodputDocument) and doc["goodput"]["failed"] is True
    assert set(doc["memory"]) == keys(MemoryDocument) and doc["memory"]["failed"] is True
    assert set(doc["machine_speed"]) == keys(MachineSpeedDocument)
    compare = doc["compare"]
    assert set(compare) == keys(ComparisonDocument)
    assert set(compare["mfu"]) == keys(MfuDeltaDocument)
    for d in (compare["step_time_ms"], *compare["phases"], *compare["ranks"], *compare["memory"]):
        assert set(d) == keys(DeltaDocument)
    assert compare["phases"][0]["delta"] == 25.0 and compare["phases"][0]["delta_pct"] == 62.5


def test_the_history_document_is_its_type():
    point = HistoryPoint("run-1", "2026-12-07T00:00:00", "abc", False, 0.4, 100.0, 1000.0, verdict="pass")
    doc = History("time", [point], ["other: not a reftrain run directory (no run.json)"]).to_json()
    assert set(doc) == keys(HistoryDocument) and doc["schema"] == HISTORY_SCHEMA
    assert [set(p) for p in doc["points"]] == [keys(HistoryPointDocument)]
    assert doc["points"][0]["verdict"] == "pass" and doc["points"][0]["change_point"] is False


def test_the_suggestions_document_is_its_type():
    from analyzer.api import analyze
    from analyzer.verbs.suggest.run import suggestions_document

    doc = suggestions_document(analyze(REPO / "traces" / "example-ddp-w2"))
    assert set(doc) == keys(SuggestionsDocument)
    assert doc["schema"] == "analyzer.suggestions/1" and doc["kind"] == "reftrain"
