"""The idle-cause rules (analyzer/verbs/suggest/rules_host.py) and the refined launch_bound / cuda_graphs:
each fires on facts built to trigger it with the predicted step worked out by hand, stays silent otherwise,
and predicts no more than removing the part of the step it addresses (docs/suggestions.md)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest

from analyzer.api import analyze
from analyzer.metrics.stragglers import StragglerConfig, StragglerResult
from analyzer.verbs.suggest import rules_compute, rules_host
from analyzer.verbs.suggest.facts import IdleFacts, KernelFacts, MemoryFacts, RunFacts, run_facts
from analyzer.verbs.suggest.run import suggest
from synth import KinetoTrace


def _facts(**fields) -> RunFacts:
    """A foreign GPU trace: 10 ms steps, device breakdown 40 % idle, nothing about idle causes."""
    base = dict(
        kind="traces",
        device="cuda",
        device_name="NVIDIA H100 80GB HBM3",
        config=None,
        config_path=None,
        world_size=1,
        step_time_ms=10.0,
        step_time_source="test",
        n_steps=5,
        tokens_per_step=None,
        mfu=None,
        peak_flops_per_s=None,
        flops_per_token=None,
        dtype="bf16",
        phases={},
        profiled_step_time_ms=None,
        shares={"compute": 0.5, "idle": 0.4, "exposed_memcpy": 0.1},
        shares_source="device",
        exposed_comm_ms=0.0,
        exposed_comm_source=None,
        comm=None,
        kernels=KernelFacts(
            n_per_step=1000, gemm_ms_per_step=2.0, kernel_ms_per_step=5.0, short_share=0.8, mean_us=5.0
        ),
        memory=MemoryFacts(None, None, None, None),
        stragglers=StragglerResult(
            ranks=[],
            per_rank=[],
            verdict="none",
            step_source=None,
            arrival_source=None,
            config=StragglerConfig(),
            per_step=pd.DataFrame(),
        ),
    )
    base.update(fields)
    return RunFacts(**base)


def _idle(host=0.7, kernel=0.1, other=0.2, **fields) -> IdleFacts:
    return IdleFacts(idle_ms=100.0, host_wait_frac=host, kernel_wait_frac=kernel, other_frac=other, **fields)


def test_dependency_idle_fires_when_other_dominates_and_launch_rules_fall_silent() -> None:
    f = _facts(idle=_idle(host=0.2, kernel=0.1, other=0.7))
    s = rules_host.rule_dependency_idle(f)
    assert s is not None and s.kind == "diagnosis"
    # Upper bound: 40 % idle x 70 % other = 2.8 ms of a 10 ms step.
    assert s.predicted.step_time_ms_after == pytest.approx(7.2)
    assert s.evidence["other_frac"] == 0.7
    assert rules_compute.rule_launch_bound(f) is None
    assert rules_compute.rule_cuda_graphs(f) is None


def test_launch_rules_fire_when_host_and_kernel_wait_dominate() -> None:
    f = _facts(idle=_idle(host=0.3, kernel=0.2, other=0.5, short_share=0.6))
    assert rules_host.rule_dependency_idle(f) is None  # other is not over half
    lb = rules_compute.rule_launch_bound(f)
    assert lb is not None and lb.confidence == "medium"  # HTA's short share 0.6 >= 0.5
    assert lb.evidence["host_wait_frac"] == 0.3
    cg = rules_compute.rule_cuda_graphs(f)
    # Launch-caused idle: 40 % x min(short share 0.8, host + kernel 0.5) = 2 ms, never the whole idle.
    assert cg is not None and cg.predicted.step_time_ms_after == pytest.approx(8.0)
    low = rules_compute.rule_launch_bound(_facts(idle=_idle(short_share=0.2)))
    assert low is not None and low.confidence == "low"


def test_launch_rules_unchanged_without_idle_causes() -> None:
    cg = rules_compute.rule_cuda_graphs(_facts())
    assert cg is not None and cg.predicted.step_time_ms_after == pytest.approx(10.0 - 0.4 * 0.8 * 10.0)
    assert rules_host.rule_dependency_idle(_facts()) is None


def test_dependency_idle_silent_under_the_idle_threshold() -> None:
    f = _facts(idle=_idle(host=0.1, kernel=0.1, other=0.8), shares={"compute": 0.85, "idle": 0.15})
    assert rules_host.rule_dependency_idle(f) is None


def test_host_sync_fires_with_the_idle_after_syncs_removed() -> None:
    f = _facts(
        idle=_idle(
            syncs_per_step=3.0,
            sync_names={"aten::item": 2.0, "cudaStreamSynchronize": 1.0},
            sync_host_share=0.05,
            sync_idle_share=0.06,
        )
    )
    s = rules_host.rule_host_sync(f)
    assert s is not None
    assert s.predicted.step_time_ms_after == pytest.approx(9.4)  # 6 % of 10 ms
    assert s.evidence["idle_after_sync_ms_per_step"] == pytest.approx(0.6)
    assert "aten::item x2" in s.evidence["sync_calls_per_step"]
    # Never more than the step's idle part: 6 % of sync idle against a 4 % idle share removes 0.4 ms.
    capped = rules_host.rule_host_sync(dataclasses.replace(f, shares={"compute": 0.96, "idle": 0.04}))
    assert capped is not None and capped.predicted.step_time_ms_after == pytest.approx(9.6)


def test_host_sync_silent_below_threshold_or_without_syncs() -> None:
    assert rules_host.rule_host_sync(_facts(idle=_idle(syncs_per_step=1.0, sync_idle_share=0.01))) is None
    assert rules_host.rule_host_sync(_facts(idle=_idle(syncs_per_step=0.0, sync_idle_share=0.5))) is None
    assert rules_host.rule_host_sync(_facts()) is None


def test_pageable_copies_fire_and_stay_within_exposed_memcpy() -> None:
    f = _facts(idle=_idle(pageable_per_step=2.0, pageable_share=0.08, pageable_exposed_share=0.05))
    s = rules_host.rule_pageable_copies(f)
    assert s is not None and s.predicted.step_time_ms_after == pytest.approx(9.5)
    assert s.evidence["pageable_htod_per_step"] == 2.0
    capped = rules_host.rule_pageable_copies(dataclasses.replace(f, shares={"compute": 0.98, "exposed_memcpy": 0.02}))
    assert capped is not None and capped.predicted.step_time_ms_after == pytest.approx(9.8)


def test_pageable_copies_silent() -> None:
    assert (
        rules_host.rule_pageable_copies(_facts(idle=_idle(pageable_per_step=2.0, pageable_exposed_share=0.005))) is None
    )
    assert (
        rules_host.rule_pageable_copies(_facts(idle=_idle(pageable_per_step=0.0, pageable_exposed_share=0.5))) is None
    )
    # A reftrain run with pin_memory off: rule pin_memory gives the exact override instead.
    reftrain = _facts(
        kind="reftrain",
        config={"data": {"pin_memory": False}},
        idle=_idle(pageable_per_step=2.0, pageable_exposed_share=0.05),
    )
    assert rules_host.rule_pageable_copies(reftrain) is None


@pytest.mark.parametrize(
    "rule", [rules_host.rule_dependency_idle, rules_host.rule_host_sync, rules_host.rule_pageable_copies]
)
def test_silent_without_idle_facts(rule) -> None:
    assert rule(_facts(idle=None)) is None


def _sync_trace(path: Path) -> Path:
    """Two 1 ms steps; in step 1 the device drains at 230 us, a .item() holds the host to 300 us, the next
    kernel starts at 310 us: 80 us of device idle after a sync, 4 % of the 2 ms."""
    t = KinetoTrace()
    t.step(1, 0, 1000)
    t.step(2, 1000, 1000)
    t.kernel("K1", 20, 210, launch_us=10)
    t.cpu_op("aten::item", 235, 67)
    t.cpu_op("aten::_local_scalar_dense", 236, 65)
    t.runtime("cudaStreamSynchronize", 240, 60, t.next_correlation())
    t.kernel("K2", 310, 650, launch_us=303)
    t.kernel("K3", 1010, 950, launch_us=1002)
    return t.write(path / "rank0.json.gz")


def test_host_sync_end_to_end_on_a_synthetic_trace(tmp_path: Path) -> None:
    ra = analyze(_sync_trace(tmp_path), cache=False)
    f = run_facts(ra)
    assert f.idle is not None
    assert f.idle.syncs_per_step == 0.5 and f.idle.sync_idle_share == pytest.approx(80 / 2000)
    fired = {s.rule: s for s in suggest(ra)}
    assert "host_sync" in fired
    # Median ProfilerStep 1 ms; 4 % of it removed.
    assert fired["host_sync"].predicted.step_time_ms_after == pytest.approx(0.96)
    causes = ra.idle_causes(0)
    assert causes["sync_idle_ms"].item() == pytest.approx(0.08)
    assert ra.to_json()["idle"]["schema"] == "analyzer.idle/1"


def test_dependency_idle_end_to_end_on_a_synthetic_trace(tmp_path: Path) -> None:
    """Each 1 ms step: K1 runs 50-350 us; K2, launched at 60 us (long before K1 ends), starts only at 750 us (a
    wait on an event, say): 400 us of 'other' idle per step; between the steps 60 us of host wait (step 2's K1 is
    launched at 1040 us, after K2 ended at 990). dependency_idle fires, the launch rules do not."""
    t = KinetoTrace()
    for i in range(2):
        t0 = 1000 * i
        t.step(i + 1, t0, 1000)
        t.kernel("K1", t0 + 50, 300, launch_us=t0 + 40)
        t.kernel("K2", t0 + 750, 240, launch_us=t0 + 60)
    ra = analyze(t.write(tmp_path / "rank0.json.gz"), cache=False)
    f = run_facts(ra)
    assert f.idle is not None
    assert (f.idle.other_frac, f.idle.host_wait_frac, f.idle.kernel_wait_frac) == pytest.approx(
        (800 / 860, 60 / 860, 0.0)
    )
    assert f.shares["idle"] == pytest.approx(920 / 2000)  # per window: 50 + 400 + 10 us
    fired = {s.rule: s for s in suggest(ra)}
    assert "dependency_idle" in fired and "launch_bound" not in fired and "cuda_graphs" not in fired
    # Upper bound: the idle share x its 'other' fraction of the 1 ms step.
    assert fired["dependency_idle"].predicted.step_time_ms_after == pytest.approx(1.0 - 0.46 * 800 / 860)
