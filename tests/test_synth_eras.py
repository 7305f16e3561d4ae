"""One synthetic job written in every format era, with exact answers (tests/synth.py).

Each step of 1000 us holds: a consistent ``aten::linear`` -> ``aten::addmm``
with its GEMM (200 us), the same with the linear's shapes inconsistent
(100 us), a compiled region (an Inductor GEMM template, 100 us, and a
pointwise kernel, 50 us), a CUDA-graph replay of one GEMM (100 us) and a 50
us copy. A fourth ProfilerStep starts after the last event and runs 13 s.
Written today's way and the TensorBoard-plugin era's way, in microseconds
and in nanoseconds, the analysis must give the same exact numbers.
"""

from __future__ import annotations

import pytest

from analyzer.api import analyze
from analyzer.verbs.suggest import suggest
from analyzer.verbs.suggest.facts import run_facts
from tests.synth import KinetoTrace

M, K, N = 256, 512, 1024
PRODUCT = 2 * M * K * N
H100_BF16 = 989.4e12


def job(era: str, unit: str) -> KinetoTrace:
    t = KinetoTrace(rank=0, world_size=1, distributed=False, era=era, time_unit=unit, time_format="int")
    for s in range(3):
        b = s * 1000
        t.step(s, b, 1000)
        t.linear(b + 10, M, K, N, 200)  # GEMM at b+70..270
        t.linear(b + 300, M, K, N, 100, consistent=False)  # GEMM at b+360..460
        t.compiled_region(b + 470, [("triton_tem_fused_mm_0", 100), ("triton_poi_fused_add_0", 50)])  # b+530..680
        t.graph_launch(b + 700, [("nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT", 100)])  # b+720..820
        t.memcpy(b + 850, 50, launch_us=b + 840)
    t.step(3, 3000, 13_000_000)  # the profiler stopped 13 s later: no event in it
    return t


ERAS = [("today", "us"), ("today", "ns"), ("tb_plugin", "us"), ("tb_plugin", "ns")]


@pytest.mark.parametrize(("era", "unit"), ERAS)
def test_every_era_gives_the_same_exact_answers(tmp_path, era: str, unit: str) -> None:
    ra = analyze(job(era, unit).write(tmp_path / "traces" / "rank0.json.gz").parent, cache=False)
    # Step windows: the 13 s step lies after every event and is dropped, with a warning.
    assert ra.steps["step"].tolist() == [0, 1, 2]
    assert any("ProfilerStep#3 dropped" in w for w in ra.warnings)
    # Breakdown per step (ms): compute 200 + 100 + 150 + 100, the copy exposed, the rest idle.
    assert ra.steps["step_time_ms"].tolist() == pytest.approx([1.0] * 3, abs=0)
    assert ra.steps["compute_ms"].tolist() == pytest.approx([0.55] * 3, abs=1e-12)
    assert ra.steps["exposed_memcpy_ms"].tolist() == pytest.approx([0.05] * 3, abs=1e-12)
    assert ra.steps["idle_ms"].tolist() == pytest.approx([0.40] * 3, abs=1e-12)
    # FLOPs: each product once (the inconsistent linear falls back to its addmm), compiled and graph GEMMs unknown.
    m = ra.mfu
    assert m.flops_per_step == 2 * PRODUCT
    assert m.flop_coverage == pytest.approx(300 / 500, abs=1e-12)
    assert m.lower_bound is True
    assert [(i["name"], i["count"]) for i in m.inconsistent_ops] == [("aten::linear", 3)]
    assert m.median == pytest.approx(2 * PRODUCT / 1e-3 / H100_BF16, rel=1e-12)
    # No rule reads the lower-bound MFU.
    assert run_facts(ra).mfu is None
    assert "mfu_gap" not in {s.rule for s in suggest(ra)}
    # Kernel classes: the Inductor template and the cuBLAS graph kernel are GEMMs, the pointwise kernel fusable.
    classes = dict(zip(ra.kernels["name"].astype(str), ra.kernels["cls"]))
    assert classes["triton_tem_fused_mm_0"] == "gemm"
    assert classes["nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT"] == "gemm"
    assert classes["triton_poi_fused_add_0"] == "elementwise"
    assert set(ra.kernels.loc[ra.kernels["kind"].astype(str) == "memcpy", "cls"]) == {"memcpy"}
