"""compare(): deltas between two synthetic runs with known answers, through the facade."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from synth import KinetoTrace

from analyzer import analyze, compare
from analyzer.api import RunAnalysis
from analyzer.metrics.mfu import MfuResult
from analyzer.metrics.stragglers import StragglerConfig, StragglerResult

PEAK = 1e13  # FLOP/s given as --peak-flops: MFU = 2e9 FLOPs / (step time * 1e13)
MM_FLOPS = 2 * 1000**3  # one aten::mm of [1000, 1000] x [1000, 1000] per step


def write_run(folder: Path, *, extra_kernel_us: int = 0, ranks: int = 2, n_steps: int = 6) -> Path:
    """A GPU trace folder, one file per rank, with exact per-step timings.

    Each step (ProfilerStep#10.., 1000 us + ``extra_kernel_us``) holds: an
    ``aten::mm`` of 2e9 FLOPs; ``sgemm`` 100..300 us; an NCCL all-reduce
    250..350 us on another stream (50 us of it under sgemm); a 10 us HtoD
    memcpy at 400 us; and, when ``extra_kernel_us``, a ``layernorm``
    kernel of that length at 500 us that also lengthens the step.

    Per step: compute 150 us (+ extra), overlapped comm 50, exposed comm 50,
    exposed memcpy 10, idle 740; HTA overlap 50.0%.
    """
    period = 1000 + extra_kernel_us
    for rank in range(ranks):
        t = KinetoTrace(rank=rank, world_size=ranks)
        for i in range(n_steps):
            s = i * period
            t.step(10 + i, s, period)
            t.cpu_op("aten::mm", s + 20, 50, input_dims=[[1000, 1000], [1000, 1000]], input_types=["float", "float"])
            t.kernel("sgemm", s + 100, 200, launch_us=s + 30)
            t.kernel(
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                s + 250,
                100,
                stream=20,
                args=t.comm_args("allreduce", 1024),
                launch_us=s + 40,
            )
            t.memcpy(s + 400, 10, launch_us=s + 50)
            if extra_kernel_us:
                t.kernel("layernorm", s + 500, extra_kernel_us, launch_us=s + 60)
        t.write(folder / f"rank{rank}.json.gz")
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[RunAnalysis, RunAnalysis]:
    root = tmp_path_factory.mktemp("compare")
    base = analyze(write_run(root / "base"), peak_flops=PEAK, cache=False)
    cand = analyze(write_run(root / "cand", extra_kernel_us=200), peak_flops=PEAK, cache=False)
    return base, cand


def test_step_time_and_phase_deltas(runs) -> None:
    base, cand = runs
    c = compare(base, cand)
    assert c.step_time.base == pytest.approx(1.0)
    assert c.step_time.cand == pytest.approx(1.2)
    assert c.step_time.delta == pytest.approx(0.2)
    assert c.step_time.delta_pct == pytest.approx(20.0)
    # The only part that changed is compute (+200 us of layernorm); it comes first.
    assert c.phases[0].name == "compute"
    assert c.phases[0].base == pytest.approx(0.15)
    assert c.phases[0].cand == pytest.approx(0.35)
    assert c.phases[0].delta == pytest.approx(0.2)
    assert {d.name for d in c.phases} == {
        "compute",
        "overlapped_comm",
        "collective_wait",
        "exposed_comm",
        "exposed_memcpy",
        "idle",
    }
    assert all(d.delta == pytest.approx(0.0, abs=1e-9) for d in c.phases[1:])
    # Means are additive: the parts' deltas sum to the step-time delta.
    assert sum(d.delta for d in c.phases) == pytest.approx(c.step_time.delta)
    assert "trace breakdown (device timeline)" in c.phase_source


def test_kernel_deltas_largest_first_and_new_kernels(runs) -> None:
    base, cand = runs
    c = compare(base, cand)
    first = c.kernels[0]
    assert (first.name, first.kind) == ("layernorm", "compute")
    assert first.base == 0.0 and first.cand == pytest.approx(0.2)  # ms per profiled step
    assert first.delta_pct is None  # new in the candidate
    unchanged = {d.name: d for d in c.kernels[1:]}
    assert unchanged["sgemm"].base == pytest.approx(0.2)
    assert unchanged["sgemm"].delta == pytest.approx(0.0, abs=1e-12)
    assert unchanged["ncclDevKernel_AllReduce_Sum_f32_RING_LL"].kind == "comm"
    assert [d.name for d in c.growing_kernels()] == ["layernorm"]


def test_mfu_delta_and_drop(runs) -> None:
    base, cand = runs
    c = compare(base, cand)
    assert c.mfu.base == pytest.approx(MM_FLOPS / (1.0e-3 * PEAK))  # 0.2
    assert c.mfu.cand == pytest.approx(MM_FLOPS / (1.2e-3 * PEAK))
    assert c.mfu.drop == pytest.approx(1 / 6)
    assert c.mfu.delta == pytest.approx(c.mfu.cand - c.mfu.base)
    assert (c.mfu.base_source, c.mfu.cand_source) == ("trace-shapes", "trace-shapes")


def test_per_rank_deltas_and_json_round_trip(runs) -> None:
    base, cand = runs
    c = compare(base, cand)
    assert [(d.name, round(d.delta, 6)) for d in c.ranks] == [("rank 0", 0.2), ("rank 1", 0.2)]
    doc = orjson.loads(orjson.dumps(c.to_json()))
    assert doc["schema"] == "analyzer.compare/1"
    assert doc["phases"][0]["name"] == "compute"
    assert doc["phases"][0]["delta"] == pytest.approx(0.2)
    assert doc["kernels"][0]["name"] == "layernorm" and doc["kernels"][0]["delta_pct"] is None
    assert doc["mfu"]["drop"] == pytest.approx(1 / 6)
    assert c.notes == []


def test_identical_runs_have_zero_deltas(runs) -> None:
    base, _ = runs
    c = compare(base, base)
    assert c.step_time.delta == 0.0
    assert all(d.delta == 0.0 for d in c.phases + c.kernels + c.ranks)
    assert c.mfu.drop == 0.0
    assert c.growing_phases() == [] and c.growing_kernels() == []


def test_top_limits_the_kernel_list(runs) -> None:
    base, cand = runs
    assert [d.name for d in compare(base, cand, top=1).kernels] == ["layernorm"]
    assert len(compare(base, cand, top=None).kernels) == 4


def _reftrain_analysis(step_ms: list[float], forward_ms: list[float], warmup: int, profiled: list[int]) -> RunAnalysis:
    """A RunAnalysis of a run directory with only metrics records (no traces)."""
    rows = [
        {
            "rank": r,
            "step": s,
            "step_time_ms": t,
            "data_wait_ms": 1.0,
            "forward_ms": f,
            "backward_ms": 2.0,
            "optimizer_ms": 0.5,
            "grad_sync_ms": 0.0,
            "profiled": s in profiled,
        }
        for r in (0, 1)
        for s, (t, f) in enumerate(zip(step_ms, forward_ms))
    ]
    manifest = {"warmup_steps": warmup, "profiled_steps": profiled, "run_id": "x"}
    empty_steps = pd.DataFrame({c: pd.Series(dtype="float64") for c in ["rank", "step", "step_time_ms", "source"]})
    return RunAnalysis(
        path=Path("x"),
        kind="reftrain",
        manifest=manifest,
        ranks=[],
        steps=empty_steps,
        mfu=MfuResult("none", reason="test"),
        stragglers=StragglerResult([], [], "n/a", None, None, StragglerConfig(), pd.DataFrame()),
        kernels=pd.DataFrame(
            columns=["rank", "source", "kind", "name", "count", "total_ms", "mean_us", "max_us", "share_pct"]
        ),
        collectives=None,
        metrics=pd.DataFrame(rows),
    )


def test_run_directories_compare_steady_state_metrics_phases() -> None:
    # Step 0 is warmup and step 3 profiled: both excluded (their huge values would dominate).
    base = _reftrain_analysis([100, 10, 10, 100, 10], [90, 5, 5, 90, 5], warmup=1, profiled=[3])
    cand = _reftrain_analysis([100, 13, 13, 100, 13], [90, 8, 8, 90, 8], warmup=1, profiled=[3])
    c = compare(base, cand)
    assert c.phase_source.startswith("metrics JSONL, steady-state steps")
    assert c.step_time.base == pytest.approx(10.0) and c.step_time.cand == pytest.approx(13.0)
    assert c.phases[0].name == "forward" and c.phases[0].delta == pytest.approx(3.0)
    by_name = {d.name: d for d in c.phases}
    # other = step - (data_wait + forward + backward + optimizer + grad_sync) = 10 - 8.5
    assert by_name["other"].base == pytest.approx(1.5) and by_name["other"].delta == pytest.approx(0.0)
    assert set(by_name) == {"data_wait", "forward", "backward", "optimizer", "grad_sync", "other"}
    assert sum(d.delta for d in c.phases) == pytest.approx(3.0)
    assert c.mfu.drop is None


def test_candidate_mfu_is_its_own_figure_with_the_rescaled_one_beside_it() -> None:
    """The issue's case: the runs page said 43.7 % and Compare 23.5 % for the same run.

    Both peaks measured on the same CPU (noise between measurements): the
    candidate's own MFU stays what its report shows; the rescaled one sits
    beside it, and the change uses that comparable figure.
    """
    from dataclasses import replace

    from analyzer.render.text import compare_text as render_compare_text

    base = _reftrain_analysis([10, 10, 10, 10, 10], [5] * 5, warmup=1, profiled=[])
    cand = _reftrain_analysis([10, 10, 10, 10, 10], [5] * 5, warmup=1, profiled=[])
    for a, mfu, peak in ((base, 0.40, 1.0e10), (cand, 0.32, 1.25e10)):  # same speed, a 25 % higher measured peak
        a.mfu = MfuResult("manifest", median=mfu, peak_flops_per_s=peak, peak_source="measured")
        a.manifest = {**a.manifest, "hardware": {"device_type": "cpu", "cpu_model": "AMD EPYC"}}
    c = compare(base, cand)
    assert c.mfu.cand == 0.32  # = cand.mfu.median, the runs page's number
    assert c.mfu.cand_on_base_peak == pytest.approx(0.40)
    assert c.mfu.delta == pytest.approx(0.0) and c.mfu.drop == pytest.approx(0.0)
    doc = c.to_json()["mfu"]
    assert (doc["cand"], doc["cand_on_base_peak"], doc["cand_comparable"]) == (
        0.32,
        pytest.approx(0.40),
        pytest.approx(0.40),
    )
    text = render_compare_text(c)
    # The points are the difference of the two figures shown; the drop is the comparable one (rescaled).
    assert "MFU: 40.00% -> 32.00% (-8.00 points, drop +0.0%; candidate on the baseline's measured peak 40.00%" in text
    # Other hardware: no rescale, one figure.
    other = replace(cand, manifest={**cand.manifest, "hardware": {"device_type": "cpu", "cpu_model": "Intel Xeon"}})
    c2 = compare(base, other)
    assert c2.mfu.cand_on_base_peak is None and c2.mfu.drop == pytest.approx(0.2)


def test_step_time_is_each_runs_headline() -> None:
    base = _reftrain_analysis([100, 10, 12, 100, 11], [5] * 5, warmup=1, profiled=[3])
    cand = _reftrain_analysis([100, 13, 13, 100, 16], [5] * 5, warmup=1, profiled=[3])
    from analyzer.metrics.step_time import StepTime

    base.step_time = StepTime(11.0, "steady_state", 11.0, 3, 50.0, 1)
    cand.step_time = StepTime(13.0, "steady_state", 13.0, 3, 60.0, 1)
    c = compare(base, cand)
    assert (c.step_time_median.base, c.step_time_median.cand) == (11.0, 13.0)
    assert c.step_time.base == pytest.approx(11.0) and c.step_time.cand == pytest.approx(
        14.0
    )  # means of the phase rows
    # One run's headline is steady-state, the other's profiled windows: both use their profiled windows.
    cand.step_time = StepTime(60.0, "profiled_windows", None, 0, 60.0, 1)
    c = compare(base, cand)
    assert (c.step_time_median.base, c.step_time_median.cand) == (50.0, 60.0)
    assert any("compared over both runs' profiled windows" in n for n in c.notes)


def test_compare_shows_each_runs_hfu_beside_the_mfu() -> None:
    """A checkpointed candidate: its HFU (hardware FLOPs, recompute included) is reported apart from its MFU."""
    from analyzer.render.text import compare_text as render_compare_text

    base = _reftrain_analysis([10, 10, 10, 10, 10], [5] * 5, warmup=1, profiled=[])
    cand = _reftrain_analysis([10, 10, 10, 10, 10], [5] * 5, warmup=1, profiled=[])
    base.mfu = MfuResult("trace-shapes", median=0.40, hfu_median=0.40)
    cand.mfu = MfuResult("trace-shapes", median=0.30, hfu_median=0.39)
    c = compare(base, cand)
    assert (c.mfu.base_hfu, c.mfu.cand_hfu) == (0.40, 0.39)
    assert (c.to_json()["mfu"]["base_hfu"], c.to_json()["mfu"]["cand_hfu"]) == (0.40, 0.39)
    assert "HFU (with recompute): 40.00% -> 39.00%" in render_compare_text(c)
