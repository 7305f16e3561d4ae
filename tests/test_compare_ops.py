"""compare() and check's paragraph name what got slower by op and by module.

A synthetic GPU run with exact answers (tests/synth.py): one block with an
attention and an MLP module; the candidate's attention backward GEMM is
longer by 100 us on rank 0 and 200 us on rank 1. And the two example runs
under traces/ (CPU-only: host time).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from analyzer import analyze, compare
from analyzer.verbs.compare import Delta, labelled, most_specific
from synth import KinetoTrace

MAIN, AUTOGRAD = 100, 200
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
EXAMPLES = Path(__file__).resolve().parent.parent / "traces"


def write_run(folder: Path, *, extra_bwd_us: int = 0, n_steps: int = 2, ranks: int = 2) -> Path:
    """Per step (1000 us): blocks.0 > attn: aten::linear launching a 40 us GEMM; blocks.0 > mlp: aten::gelu,
    a 20 us kernel; the linear's backward node on the autograd thread launching a GEMM of 30 us
    (+ ``extra_bwd_us`` x (rank + 1) in the candidate); an optimizer op outside any module, a 10 us kernel."""
    for rank in range(ranks):
        t = KinetoTrace(rank=rank, world_size=ranks, tid=MAIN)
        for i in range(n_steps):
            s, seq = 1000 * i, 10 * i + 1
            bwd_us = 30 + extra_bwd_us * (rank + 1)
            t.step(10 + i, s, 1000)
            t.annotation("nn.Module: blocks.0", s + 1, 300, tid=MAIN)
            t.annotation("nn.Module: attn", s + 2, 100, tid=MAIN)
            t.cpu_op("aten::linear", s + 10, 50, tid=MAIN, args={"Sequence number": seq, "Fwd thread id": 0})
            t.kernel(GEMM, s + 100, 40, launch_us=s + 25)
            t.annotation("nn.Module: mlp", s + 150, 100, tid=MAIN)
            t.cpu_op("aten::gelu", s + 160, 20, tid=MAIN)
            t.kernel("vectorized_elementwise_kernel<gelu>", s + 170, 20, launch_us=s + 165)
            t.cpu_op(
                "autograd::engine::evaluate_function: AddmmBackward0",
                s + 400,
                100,
                tid=AUTOGRAD,
                args={"Sequence number": seq, "Fwd thread id": 1},
            )
            t.cpu_op("aten::mm", s + 410, 30, tid=AUTOGRAD)
            t.kernel(GEMM, s + 450, bwd_us, launch_us=s + 415)
            t.cpu_op("Optimizer.step#AdamW.step", s + 800, 40, tid=MAIN)
            t.kernel("multi_tensor_apply_kernel", s + 850, 10, launch_us=s + 805)
        for ev in t.events:  # the backward launch runs on the autograd thread, as PyTorch's does
            if ev.get("cat") == "cuda_runtime" and (ev["ts"] - 415) % 1000 == 0:
                ev["tid"] = AUTOGRAD
        t.write(folder / f"rank{rank}.json.gz")
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare_ops")
    return (
        analyze(write_run(root / "base"), cache=False),
        analyze(write_run(root / "cand", extra_bwd_us=100), cache=False),
    )


def test_ops_matched_by_name_and_pass_per_step_mean_over_ranks(runs) -> None:
    c = compare(*runs)
    assert c.op_source.startswith("device time")
    first = c.ops[0]
    # Rank 0 +100 us, rank 1 +200 us per step: mean over ranks +150 us on 30 us.
    assert (first.name, first.kind) == ("aten::linear", "backward")
    assert (first.base, first.cand) == (pytest.approx(0.03), pytest.approx(0.18))
    assert first.delta == pytest.approx(0.15) and first.delta_pct == pytest.approx(500.0)
    rows = {(d.name, d.kind): d for d in c.ops}
    assert rows[("aten::linear", "forward")].base == pytest.approx(0.04)  # forward kept apart, unchanged
    assert rows[("aten::linear", "forward")].delta == pytest.approx(0.0, abs=1e-12)
    assert rows[("aten::gelu", "forward")].base == pytest.approx(0.02)
    assert rows[("Optimizer.step#AdamW.step", "forward")].base == pytest.approx(0.01)
    assert [labelled(d) for d in c.growing_ops()] == ["aten::linear backward"]


def test_modules_most_specific_first(runs) -> None:
    c = compare(*runs)
    first = c.modules[0]
    assert (first.name, first.kind) == ("blocks.0/attn", "backward")
    assert first.delta == pytest.approx(0.15) and first.base == pytest.approx(0.03)
    names = {(d.name, d.kind) for d in c.modules}
    # blocks.0 backward grew by exactly its attention's growth: the child names it, the parent is left out.
    assert ("blocks.0", "backward") not in names
    assert {("blocks.0/attn", "forward"), ("blocks.0/mlp", "forward"), ("blocks.0", "forward")} <= names
    assert [labelled(d) for d in c.growing_modules()] == ["blocks.0/attn backward"]


def test_most_specific_rule_exact() -> None:
    ds = [
        Delta("b", 1.0, 5.0, "backward"),
        Delta("b/attn", 1.0, 3.0, "backward"),
        Delta("b/mlp", 1.0, 3.0, "backward"),
        Delta("c", 1.0, 5.0, "forward"),
        Delta("c/attn", 1.0, 2.9, "forward"),
        Delta("c/mlp", 1.0, 2.0, "forward"),
        Delta("b", 1.0, 2.0, "forward"),
    ]
    kept = [(d.name, d.kind) for d in most_specific(ds)]
    # b backward +4.0: attn +2.0 is at least half of it -> left out; c forward +4.0: attn +1.9 < 2.0, mlp +1.0 -> kept.
    assert kept == [
        ("b/attn", "backward"),
        ("b/mlp", "backward"),
        ("c", "forward"),
        ("c/attn", "forward"),
        ("c/mlp", "forward"),
        ("b", "forward"),
    ]
    # A child that shrank does not stand for a parent that grew.
    assert [d.name for d in most_specific([Delta("a", 1.0, 2.0, "forward"), Delta("a/x", 3.0, 1.0, "forward")])] == [
        "a",
        "a/x",
    ]


def test_ops_and_modules_in_json_and_text(runs) -> None:
    from analyzer.render.text import compare_text as render_compare_text

    c = compare(*runs)
    doc = orjson.loads(orjson.dumps(c.to_json()))
    assert doc["op_source"] == c.op_source
    assert (doc["ops"][0]["name"], doc["ops"][0]["kind"]) == ("aten::linear", "backward")
    assert doc["ops"][0]["delta"] == pytest.approx(0.15)
    assert doc["modules"][0]["name"] == "blocks.0/attn"
    text = render_compare_text(c)
    assert "Ops, largest change first" in text and "Modules, largest change first" in text
    op_line = next(
        line for line in text.splitlines() if line.lstrip().startswith("aten::linear") and "backward" in line
    )
    assert "+0.150" in op_line and "+500.0" in op_line
    from analyzer.render.html import compare_html

    page = compare_html(c)
    assert "<h2>Ops</h2>" in page and "<h2>Modules</h2>" in page and "blocks.0/attn" in page


def test_identical_runs_and_no_traces(runs) -> None:
    base, _ = runs
    c = compare(base, base)
    assert c.ops and all(d.delta == 0.0 for d in c.ops + c.modules)
    assert c.growing_ops() == [] and c.growing_modules() == []
    assert len(compare(*runs, top=1).ops) == 1 and len(compare(*runs, top=1).modules) == 1


@pytest.mark.skipif(not (EXAMPLES / "example-ddp-w2-slow-rank1").is_dir(), reason="traces/ examples absent")
def test_example_runs_name_the_op_that_got_slower() -> None:
    """The slow-rank run (rank 1 spins 300 ms per step in its first forward) was profiled while every op of
    both ranks ran about twice as long (the two ranks and the spin shared the machine's cores): its two
    ProfilerSteps took 3.38 s on rank 0 against 1.62 s in the baseline. The largest growth is the matmul
    backward, ~+290 ms per step (host time; CPU-only traces), MmBackward0 and the aten::mm inside it."""
    base, cand = (
        analyze(EXAMPLES / "example-ddp-w2", cache=False),
        analyze(EXAMPLES / "example-ddp-w2-slow-rank1", cache=False),
    )
    c = compare(base, cand)
    assert c.op_source.startswith("host time")
    top = c.growing_ops(2)
    assert {(d.name, d.kind) for d in top} == {("MmBackward0", "backward"), ("aten::mm", "backward")}

    def expected(a, op: str) -> float:  # host ms per ProfilerStep, mean over the two ranks
        o = a.ops()
        rows = o.loc[(o["op"].astype(str) == op) & o["backward"].astype(bool)]
        return (
            sum(float(rows.loc[rows["rank"] == r, "host_ms"].sum()) / int((a.steps["rank"] == r).sum()) for r in (0, 1))
            / 2
        )

    for d in top:
        assert d.base == pytest.approx(expected(base, d.name)) and d.cand == pytest.approx(expected(cand, d.name))
        assert 250.0 < d.delta < 350.0  # +294 / +292 ms measured on these files
    from analyzer.render.text import compare_text as render_compare_text

    text = render_compare_text(c)
    ops_table = text.split("Ops, largest change first")[1].split("\n\n")[0].splitlines()
    assert ops_table[3].split()[:2] in (["MmBackward0", "backward"], ["aten::mm", "backward"])  # the first row


def test_check_paragraph_names_the_op_and_module_that_grew(runs) -> None:
    """check's paragraph (analyzer.verbs.check.explain) on a regression: the largest growth by op and by module."""
    import numpy as np

    from analyzer.verbs.check import GateOutcome, StepSamples, check_samples, explain

    def samples(v: float) -> StepSamples:
        return StepSamples(
            metric="mfu",
            values=np.full(20, v) * (1 + 0.001 * np.arange(20)),
            steps=np.arange(20),
            source="synthetic",
            n_ranks=1,
        )

    result = check_samples(samples(0.4), samples(0.3))
    assert result.regression
    text = explain(GateOutcome(result=result, comparison=compare(*runs)))
    assert "By op: aten::linear backward +0." in text and "+500%" in text.split("By op: ")[1]
    assert "By module: blocks.0/attn backward +0." in text
    assert text.index("By op:") < text.index("By module:")


@pytest.mark.skipif(not (EXAMPLES / "example-ddp-w2-slow-rank1").is_dir(), reason="traces/ examples absent")
def test_check_of_the_example_runs_names_the_matmul_backward(capsys) -> None:
    from analyzer.cli import main

    code = main(
        [
            "check",
            str(EXAMPLES / "example-ddp-w2-slow-rank1"),
            "--baseline",
            str(EXAMPLES / "example-ddp-w2"),
            "--no-cache",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1 and out.startswith("analyzer check: REGRESSION")
    by_op = out.split("By op: ")[1].split(".")[0]
    assert by_op.split(";")[0].split(" +")[0] in ("MmBackward0 backward", "aten::mm backward")
