"""`analyzer whatif`: the verb over hand-built graphs (exact answers) and the command on a checked-in 2-rank run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer import cli
from analyzer.metrics.replay import ReplayError
from analyzer.render.whatif import whatif_text
from analyzer.verbs.whatif import SCHEMA, WhatIfRequest, parse_faster, whatif_graphs
from tests.test_replay import gloo_rank, gpu_step

REPO = Path(__file__).resolve().parent.parent
SLOW_RANK_RUN = REPO / "traces" / "example-ddp-w2-slow-rank1"


def test_a_late_ranks_delay_removed_from_the_job():
    (g0, e0), (g1, e1) = gloo_rank(0, 100, 80), gloo_rank(1, 160, 20)
    result = whatif_graphs({1: {0: (g0, e0), 1: (g1, e1)}}, WhatIfRequest(remove_rank_delay=1), mfu_before=0.40)
    # Measured: both ranks' steps are 200 ns; without rank 1's delay rank 0 takes 140 (tests/test_replay.py).
    assert result.measured_step_ms == pytest.approx(200e-6)
    assert result.predicted_step_ms == pytest.approx(140e-6)
    assert result.speedup == pytest.approx(200 / 140)
    assert result.mfu_after == pytest.approx(0.40 * 200 / 140)
    assert result.unchanged_error == 0.0
    doc = result.to_json()
    assert doc["schema"] == SCHEMA and doc["changes"] == ["rank 1's delay removed"]
    assert doc["steps"][0]["predicted_ms"] == {"0": pytest.approx(140e-6)}


def test_a_larger_micro_batch_counts_its_work():
    g, events = gpu_step()
    result = whatif_graphs({3: {0: (g, events)}}, WhatIfRequest(micro_batch_scale=2.0), mfu_before=0.30)
    # 160 -> 285 ns (tests/test_replay.py) for twice the work: 2 * 160 / 285 the throughput.
    assert result.predicted_step_ms == pytest.approx(285e-6)
    assert result.mfu_after == pytest.approx(0.30 * 2 * 160 / 285)
    text = whatif_text(result)
    assert "micro-batch 2x" in text and "30.00% measured -> 33.68% predicted" in text


def test_the_new_critical_path_and_its_ops():
    g, events = gpu_step()
    result = whatif_graphs({3: {0: (g, events)}}, WhatIfRequest(faster=(("gemm", 2.0),)))
    step = result.steps[0]
    # After: launch A 15 + GEMM 40 + gap 10 + B 45 + return 10 = 120 ns, GEMM and B the compute on it.
    assert step.job_predicted_ms == pytest.approx(120e-6)
    assert step.breakdown_after_pct["gpu_compute_bound"] == pytest.approx(100 * 85 / 120)
    assert [o.name for o in step.path_ops][:2] == ["vectorized_elementwise_kernel", "sgemm_128x64_nn"]
    assert step.path_ops[0].ms_on_path == pytest.approx(45e-6)


def test_rank_delay_needs_two_ranks():
    g, events = gpu_step()
    with pytest.raises(ReplayError, match="two or more ranks"):
        whatif_graphs({3: {0: (g, events)}}, WhatIfRequest(remove_rank_delay=0))


def test_faster_items_are_checked():
    assert parse_faster(["gemm=2", "attention=1.5"]) == (("gemm", 2.0), ("attention", 1.5))
    for bad in ("gemm", "gemm=0", "gemm=x", "=2", "matmul=2"):
        with pytest.raises(ReplayError):
            parse_faster([bad])


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "whatif: name a change"),
        (["--faster", "gemmm=2"], "unknown kernel class 'gemmm'"),
    ],
)
def test_usage_errors_are_one_line(argv, message, capsys):
    assert cli.main(["whatif", str(SLOW_RANK_RUN), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_whatif_on_a_two_rank_run(tmp_path, capsys):
    """The checked-in run whose rank 1 sleeps 300 ms a step: removing its delay shortens the job's step by
    rank 0's measured wait for it (its profiled step 6 waited 347 ms on gloo beyond rank 1's 29 ms transfer)."""
    out = tmp_path / "whatif.json"
    code = cli.main(["whatif", str(SLOW_RANK_RUN), "--remove-rank-delay", "1", "--json", str(out), "--quiet"])
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["unchanged_replay_max_error"] < 0.02
    measured, predicted = doc["step_time_ms"]["measured"], doc["step_time_ms"]["predicted"]
    step6 = next(s for s in doc["steps"] if s["step"] == 6)
    assert step6["job_measured_ms"] - step6["job_predicted_ms"] > 300.0
    assert predicted < measured
    assert doc["mfu"]["predicted"] == pytest.approx(doc["mfu"]["measured"] * measured / predicted)
    assert "rank 1's delay removed" in capsys.readouterr().out


def test_suggestions_take_the_replays_prediction_where_it_applies():
    """The straggler rule's prediction on the slow-rank run comes from the replay; without traces, the closed form."""
    from analyzer.api import analyze
    from analyzer.verbs.suggest.run import replay_predictions, suggest, suggestions_document
    from analyzer.verbs.whatif import WhatIfRequest, run_traces, whatif

    ra = analyze(SLOW_RANK_RUN)
    closed = suggest(ra)
    assert [s.rule for s in closed] == ["straggler"] and closed[0].predicted.model == "closed-form"
    assert replay_predictions(ra, [])[0].predicted.model == "closed-form"  # no graph: the closed form stays
    traces, problems = run_traces(SLOW_RANK_RUN)
    assert sorted(t.rank for t in traces) == [0, 1] and not problems  # the files run.json lists
    replayed = replay_predictions(ra, traces)
    p = replayed[0].predicted
    assert p.model == "replay" and "(closed form: " in p.method
    result = whatif(traces, WhatIfRequest(remove_rank_delay=1))
    assert p.step_time_ms_after == pytest.approx(
        closed[0].predicted.step_time_ms_before * result.predicted_step_ms / result.measured_step_ms
    )
    # The analysis' memo holds them: the report's and the JSON's suggestions say the same.
    assert suggest(ra)[0].predicted.model == "replay"
    assert suggestions_document(ra)["suggestions"][0]["predicted"]["model"] == "replay"


def test_suggest_replay_flag(tmp_path, capsys):
    """`analyzer suggest --replay` says which model predicted; without it, the closed form (as the report)."""
    out = tmp_path / "s.json"
    assert cli.main(["suggest", str(SLOW_RANK_RUN), "--replay", "--json", str(out), "--quiet"]) == 0
    assert "how (replay): replay of 2 profiled step(s)" in capsys.readouterr().out
    assert json.loads(out.read_text())["suggestions"][0]["predicted"]["model"] == "replay"
    assert cli.main(["suggest", str(SLOW_RANK_RUN), "--json", str(out), "--quiet"]) == 0
    assert "how (closed-form): rank 1 without" in capsys.readouterr().out
    assert json.loads(out.read_text())["suggestions"][0]["predicted"]["model"] == "closed-form"
