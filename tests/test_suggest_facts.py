"""Facts the rules read, from synthetic run directories and synthetic GPU traces with exact answers,
and suggest() end to end on them (analyzer/verbs/suggest/facts.py, docs/suggestions.md)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analyzer.api import analyze
from analyzer.verbs.suggest import suggest
from analyzer.verbs.suggest.facts import gpu_memory_bytes, run_facts
from reftrain.config import Config, resolve, set_value
from tests.synth import KinetoTrace

T0 = 1_700_000_000_000_000_000  # epoch ns
MS = 1_000_000


def write_run(
    root: Path,
    *,
    settings: dict | None = None,
    steps: int = 12,
    step_ms=lambda rank, step: 100.0,
    phases=lambda rank, step: {},
    collectives=None,
    device: str = "cpu",
    mem_bytes: float = 4e8,
    device_name: str = "AMD EPYC",
    world: int = 2,
    late_ms=lambda rank, step: 0.0,
) -> Path:
    """A reftrain run directory (docs/rundir.md) with chosen per-step numbers; warmup 2, no profiled steps.

    ``collectives(step)`` returns ``[(start_ms, end_ms, bytes), ...]`` relative to the step's start, the
    same on every rank but for its arrival: rank ``r`` starts each of step ``s``'s collectives
    ``late_ms(r, s)`` ms later (it ends with the others).
    """
    cfg = Config()
    for key, value in (settings or {}).items():
        set_value(cfg, key, value, "test")
    resolve(cfg, world)
    run = root / "run"
    (run / "metrics").mkdir(parents=True)
    (run / "collectives").mkdir()
    tokens = cfg.train.micro_batch_size * cfg.model.seq_len * cfg.train.grad_accum
    for rank in range(world):
        recs, colls, seq, t = [], [], 0, T0
        for s in range(steps):
            st = step_ms(rank, s)
            rec = {
                "step": s,
                "rank": rank,
                "loss": 5.0,
                "step_time_ms": st,
                "data_wait_ms": 1.0,
                "forward_ms": 0.3 * st,
                "backward_ms": 0.6 * st,
                "optimizer_ms": 0.05 * st,
                "grad_sync_ms": 0.0,
                "comm_ms": 0.0,
                "tokens": tokens,
                "tokens_per_s": tokens / st * 1e3,
                "mfu": 0.1,
                "hfu": 0.1,
                "mem_bytes": mem_bytes,
                "mem_kind": "cuda_peak_allocated" if device == "cuda" else "cpu_rss",
                "profiled": False,
                "time_ns": t + int(st * MS),
                "injected_ms": 0.0,
            }
            rec.update(phases(rank, s))
            recs.append(rec)
            for start, end, nbytes in collectives(s) if collectives else []:
                colls.append(
                    {
                        "step": s,
                        "rank": rank,
                        "seq": seq,
                        "kind": "all_reduce",
                        "bytes": nbytes,
                        "dtype": "float32",
                        "pg": "0",
                        "group_size": world,
                        "start_ns": t + int(round((start + late_ms(rank, s)) * MS)),
                        "end_ns": t + int(end * MS),
                        "clock": "host",
                    }
                )
                seq += 1
            t += int(st * MS)
        (run / "metrics" / f"rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        (run / "collectives" / f"rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in colls))
    manifest = {
        "schema": "reftrain.run/1",
        "run_id": "run",
        "status": "completed",
        "config": cfg.to_dict(),
        "world_size": world,
        "backend": "gloo" if device == "cpu" else "nccl",
        "hardware": {
            "device_type": device,
            "device_names": [device_name] * world,
            "cpu_model": "AMD EPYC",
            "cpu_cores": 8,
            "cpu_cores_usable": 8,
            "hostnames": ["h"] * world,
        },
        "params": {"total": 1000, "non_embedding": 800, "embedding": 200},
        "flops": {"per_token": 1e6, "per_token_hardware": 1e6},
        "peak_flops": {"per_s": 1e10, "source": "override", "detail": "test", "dtype": "fp32"},
        "tokens_per_step": tokens * world,
        "steps": steps,
        "warmup_steps": 2,
        "profiled_steps": [],
        "clock": {"method": "test", "offsets_ns": [0] * world, "uncertainty_ns": 0},
        "inject": {"slow_rank": None, "delay_ms": None, "slowdown": None},
        "files": {
            "config": "config.yaml",
            "metrics": [f"metrics/rank{r}.jsonl" for r in range(world)],
            "collectives": [f"collectives/rank{r}.jsonl" for r in range(world)],
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
    (run / "run.json").write_text(json.dumps(manifest))
    return run


# ----------------------------------------------------------------------------- pure helpers


def test_gpu_memory_from_name_or_datasheet():
    assert gpu_memory_bytes("NVIDIA A100-SXM4-80GB")[0] == 80e9
    assert gpu_memory_bytes("NVIDIA H200")[0] == 141e9
    assert gpu_memory_bytes("Some GPU") == (None, None)


# ----------------------------------------------------------------------------- run directories


def test_facts_from_a_run_directory(tmp_path):
    def colls(step):  # three buckets per step: service 15, 15, 20 ms; tail 30 ms
        return [(10, 25, 1e6), (20, 40, 2e6), (30, 60, 3e6)]

    run = write_run(
        tmp_path,
        steps=12,
        step_ms=lambda r, s: 100.0 + s,
        collectives=colls,
        phases=lambda r, s: {"data_wait_ms": 2.0 + r},
    )
    f = run_facts(analyze(run))
    # steady steps 2..11: step time 102..111, median 106.5
    assert f.step_time_ms == pytest.approx(106.5)
    assert f.phases["data_wait"] == pytest.approx(2.5)  # mean over ranks 2 and 3
    assert f.rank_phases[1]["data_wait"] == pytest.approx(3.0)
    assert f.exposed_comm_ms == pytest.approx(30.0)
    assert f.comm.n_per_step == 3 and f.comm.service_ms_per_step == pytest.approx(50.0, abs=1e-4)
    slope, intercept = np.polyfit([1e6, 2e6, 3e6], [15, 15, 20], 1)
    assert f.comm.alpha_ms == pytest.approx(intercept) and f.comm.per_byte_ms == pytest.approx(slope)
    assert f.tokens_per_step == 2 * 4 * 128 and f.cores_per_rank == 4
    assert f.config_path == str(run / "config.yaml")


def test_exposed_tail_fires_grad_accumulation_end_to_end(tmp_path):
    run = write_run(tmp_path, collectives=lambda s: [(10, 25, 1e6), (20, 40, 2e6), (30, 60, 3e6)])
    rules = [s.rule for s in suggest(analyze(run))]
    assert "grad_accumulation" in rules  # 30 ms of 100 exposed
    assert "ddp_bucket_size" not in rules  # 3 collectives per step: not latency-bound bucketing

    quiet = write_run(tmp_path / "q", collectives=lambda s: [(50, 55, 1e6)])  # 5 ms tail
    assert "grad_accumulation" not in [s.rule for s in suggest(analyze(quiet))]


def test_explicit_sync_after_backward_counts_its_collectives_once(tmp_path):
    # overlap_grad_sync=false: the one 6 ms all-reduce runs inside the grad_sync phase (forward 30,
    # backward 60, optimizer 5, data 1 of a 107 ms step). The exposed comm is the phase, not phase +
    # the collective's 6 ms tail: that double count made grad_accumulation fire on bench_suggest's
    # sync-after-backward runs (16.9 ms "exposed" where the phase took 11) and over-predict.
    def run(root, sync_ms):
        return analyze(
            write_run(
                root,
                settings={"parallel.overlap_grad_sync": False},
                step_ms=lambda r, s: 107.0,
                phases=lambda r, s: {
                    "forward_ms": 30.0,
                    "backward_ms": 60.0,
                    "optimizer_ms": 5.0,
                    "grad_sync_ms": sync_ms,
                },
                collectives=lambda s: [(92, 98, 5e6)],
            )
        )

    quiet = run(tmp_path / "q", 9.0)  # 8.4 % of the step; 15 ms, 14 %, if the tail were added
    f = run_facts(quiet)
    assert f.exposed_comm_ms == pytest.approx(9.0) and "grad_sync_ms" in f.exposed_comm_source
    assert "grad_accumulation" not in [s.rule for s in suggest(quiet)]

    loud = {s.rule: s for s in suggest(run(tmp_path / "l", 11.0))}  # 10.3 % > 10 %
    ga = loud["grad_accumulation"]
    # per micro-batch forward + backward + data wait, nothing subtracted from backward: 91 ms;
    # 4 micro-batches: 107 + 3 x 91 = 380 ms for 4x the tokens, gain 4 x 107 / 380 - 1
    assert ga.evidence["per_micro_batch_ms"] == pytest.approx(91.0)
    assert ga.predicted.gain == pytest.approx(4 * 107 / 380 - 1)


def test_data_wait_run_top_suggestion_and_its_command(tmp_path):
    run = write_run(tmp_path, settings={"data.num_workers": 0}, phases=lambda r, s: {"data_wait_ms": 60.0})
    top = suggest(analyze(run))[0]
    # load 60 ms per batch, consume 40: ceil(60 / (0.7 * 40)) = 3 workers, wait max(8, 20 - 40) = 8 ms.
    assert top.rule == "data_wait" and top.change.overrides == {"data.num_workers": 3}
    assert top.predicted.step_time_ms_after == pytest.approx(100.0 - 52.0)
    assert top.change.command(str(run / "config.yaml"), 2) == (
        f"reftrain --nproc 2 --config {run / 'config.yaml'} --set data.num_workers=3"
    )


def test_memory_pressure_on_a_cuda_run(tmp_path):
    run = write_run(
        tmp_path,
        device="cuda",
        device_name="NVIDIA A100-SXM4-80GB",
        mem_bytes=76e9,
        settings={"train.micro_batch_size": 8},
    )
    found = {s.rule: s for s in suggest(analyze(run))}
    assert found["activation_checkpointing"].evidence["memory_fraction"] == pytest.approx(0.95)
    assert found["smaller_micro_batch"].change.overrides == {"train.micro_batch_size": 4, "train.grad_accum": 2}
    roomy = write_run(tmp_path / "r", device="cuda", device_name="NVIDIA A100-SXM4-80GB", mem_bytes=20e9)
    assert not {"activation_checkpointing", "smaller_micro_batch"} & {s.rule for s in suggest(analyze(roomy))}


def test_straggler_from_run_records(tmp_path):
    run = write_run(
        tmp_path,
        steps=16,
        step_ms=lambda r, s: 100.0 + (30.0 if r == 1 else 0.0) + (s % 3) * 0.2,
        phases=lambda r, s: {"forward_ms": 60.0 if r == 1 else 30.0},
    )
    ra = analyze(run)
    assert ra.stragglers.ranks == [1]
    s = next(s for s in suggest(ra) if s.rule == "straggler")
    assert s.evidence["rank"] == 1 and s.evidence["slowest_phase"] == "forward"
    assert s.predicted.step_time_ms_after == pytest.approx(s.predicted.step_time_ms_before - s.evidence["excess_ms"])
    fair = write_run(tmp_path / "f", steps=16, step_ms=lambda r, s: 100.0 + (s % 3) * 0.2)
    assert "straggler" not in [s.rule for s in suggest(analyze(fair))]


def test_straggler_from_collective_records_needs_a_steady_lateness(tmp_path):
    # One all-reduce per 1000 ms step (issued at 50 ms, done at 500 ms); rank 1 arrives 400 ms late plus a
    # jitter; steps 2..13 are steady: jitter median 0.5 ms, so the sync delay is 400.5 ms.
    jitter = [0, 12, -8, 25, -15, 5, -3, 18, -10, 7, 2, -6, 9, -1]
    run = write_run(
        tmp_path,
        steps=14,
        step_ms=lambda r, s: 1000.0,
        collectives=lambda s: [(50, 500, 4e6)],
        late_ms=lambda r, s: 400.0 + jitter[s] if r == 1 else 0.0,
    )
    found = {s.rule: s for s in suggest(analyze(run))}
    s = found["straggler"]
    assert s.evidence["rank"] == 1 and s.evidence["excess_ms"] == pytest.approx(400.5, abs=1e-6)
    # d: the 12 steady lateness values; MAD of their deviations from the median is 7.5 ms: 400.5 / (7.5 / 0.67449).
    assert s.evidence["effect_size"] == pytest.approx(400.5 / (7.5 / 0.6744897501960817), abs=1e-3)
    assert s.predicted.step_time_ms_after == pytest.approx(599.5) and s.predicted.gain == pytest.approx(
        1000 / 599.5 - 1
    )
    # Rank 1 late instead by what a contended machine's scheduler took from it (the 9 values measured per step,
    # tests/test_suggest_rules.py, twice over 18 steady steps): late in every step, robust z 4.1, flagged; but
    # its lateness spreads about as much as it is large (effect 1.22), so the rule stays silent.
    contended = [517.5, 492.2, 1266.9, 150.9, 826.1, 337.1, 140.7, 186.6, 91.4]
    noisy = write_run(
        tmp_path / "n",
        steps=20,
        step_ms=lambda r, s: 1000.0,
        collectives=lambda s: [(50, 1500, 4e6)],
        late_ms=lambda r, s: contended[(s - 2) % 9] if r == 1 else 0.0,
    )
    ra = analyze(noisy)
    assert ra.stragglers.ranks == [1] and ra.stragglers.per_rank[1].lateness_z == pytest.approx(4.13, abs=0.01)
    assert "straggler" not in [s.rule for s in suggest(ra)]


def test_straggler_fires_on_the_checked_in_injected_run():
    # traces/example-ddp-w2-slow-rank1: reftrain with inject.slow_rank=1, delay_ms=300 on the loaded 2-core
    # machine; 5 quiet steady steps, rank 1 late at each one's all-reduce by 161.0, 297.2, 344.2, 218.4, 274.2 ms.
    ra = analyze(Path(__file__).resolve().parent.parent / "traces" / "example-ddp-w2-slow-rank1")
    s = next(s for s in suggest(ra) if s.rule == "straggler")
    # median 274.157 ms; |deviations| 113.1, 23.0, 70.0, 55.75, 0: MAD 55.751 ms, spread 82.66 ms: 3.32 >= 2.
    assert s.evidence["effect_signal"] == "lateness"
    assert s.evidence["excess_spread_ms"] == pytest.approx(55.750669 / 0.6744897501960817, abs=1e-4)
    assert s.evidence["effect_size"] == pytest.approx(274.157461 / (55.750669 / 0.6744897501960817), abs=1e-4)
    assert s.change.overrides == {"inject.slow_rank": None, "inject.delay_ms": None} and s.confidence == "high"
    assert s.predicted.step_time_ms_after == pytest.approx(s.predicted.step_time_ms_before - 274.157461)


# ----------------------------------------------------------------------------- GPU traces


def write_gpu_traces(
    root: Path,
    *,
    short_kernels: int,
    gemm_name: str = "ampere_sgemm_128x64_nn",
    gemm_us: float = 3000.0,
    step_us: float = 10000.0,
    device_name: str = "NVIDIA A100-SXM4-80GB",
) -> Path:
    """Two ranks, 3 ProfilerSteps: one GEMM, ``short_kernels`` 4-us kernels 20 us apart, a 1 ms exposed all-reduce."""
    root.mkdir(parents=True, exist_ok=True)
    for rank in range(2):
        t = KinetoTrace(rank=rank, world_size=2, device_name=device_name)
        for n in range(3):
            s0 = 1000.0 + n * step_us
            t.step(n + 1, s0, step_us)
            t.cpu_op("aten::mm", s0 + 10, 20, input_dims=[[1024, 1024], [1024, 1024]], input_types=["float", "float"])
            t.kernel(gemm_name, s0 + 50, gemm_us, launch_us=s0 + 10)
            k0 = s0 + 100 + gemm_us
            for i in range(short_kernels):
                t.kernel(
                    "void at::native::vectorized_elementwise_kernel<4, add>", k0 + 20 * i, 4, launch_us=k0 + 20 * i - 5
                )
            c0 = s0 + step_us - 1500
            t.kernel(
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL", c0, 1000, stream=20, args=t.comm_args("allreduce", 1 << 20)
            )
        t.write(root / f"rank{rank}.json.gz")
    return root


def test_kernel_facts_and_launch_bound_rules_on_gpu_traces(tmp_path):
    folder = write_gpu_traces(tmp_path / "t", short_kernels=200)
    f = run_facts(analyze(folder, cache=False))
    # per step: 1 GEMM of 3 ms + 200 kernels of 4 us; 10 ms steps.
    assert f.kernels.n_per_step == pytest.approx(201.0)
    assert f.kernels.gemm_ms_per_step == pytest.approx(3.0)
    assert f.kernels.short_share == pytest.approx(200 / 201)
    assert f.shares["idle"] == pytest.approx(1 - (3.0 + 0.8 + 1.0) / 10.0)
    assert f.dtype == "fp32"
    found = {s.rule: s for s in suggest(analyze(folder))}
    assert {"launch_bound", "cuda_graphs", "tf32", "bf16_autocast"} <= set(found)
    # A100: fp32 19.5 -> tf32 156 TFLOP/s on 3 ms of GEMMs per 10 ms step.
    assert found["tf32"].predicted.step_time_ms_after == pytest.approx(10.0 - 3.0 * (1 - 19.5 / 156))
    assert found["launch_bound"].predicted.work_ratio == 2.0  # 3.8 ms device work: 2x fits, 4x does not


def test_device_bound_gpu_traces_get_compile_not_launch_rules(tmp_path):
    # 40 kernels of 4 us and an 8 ms TF32 GEMM in a 10 ms step: device-bound, GEMM-heavy.
    folder = write_gpu_traces(
        tmp_path / "t",
        short_kernels=40,
        gemm_us=8000.0,
        gemm_name="sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16",
    )
    rules = {s.rule for s in suggest(analyze(folder))}
    assert not {"launch_bound", "cuda_graphs", "torch_compile", "tf32"} & rules
    assert "bf16_autocast" in rules  # TF32 -> bf16 on 80 % GEMM time


def test_hta_samples_get_the_rules_their_timelines_call_for(hta_samples):
    # nccl_parser_config: one A100 rank idle 76 % of its steps.
    found = {s.rule: s for s in suggest(analyze(hta_samples / "nccl_parser_config"))}
    assert "launch_bound" in found and found["launch_bound"].evidence["idle_share"] > 0.7
    # trace_diff/test: 13 % of the step in copies nothing overlaps.
    found = {s.rule: s for s in suggest(analyze(hta_samples / "trace_diff" / "test"))}
    assert found["exposed_memcpy"].evidence["exposed_memcpy_share"] > 0.1
    assert all(not s.change.overrides for s in found.values())  # foreign traces: advice only


def _compiled_trace(root: Path, compiled: bool) -> Path:
    """One GPU rank, 4 steps of 10 ms: a 4096^3 bf16 mm with shapes (its GEMM 100 us) and, when
    ``compiled``, a compiled region whose 500 us GEMM is launched by no op with shapes."""
    t = KinetoTrace(rank=0, world_size=1, distributed=False)
    for s in range(4):
        base = s * 10_000
        t.step(s, base, 10_000)
        t.cpu_op("aten::mm", base + 10, 50, input_dims=[[4096, 4096], [4096, 4096]], input_types=["c10::BFloat16"] * 2)
        t.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", base + 100, 100, launch_us=base + 20)
        if compiled:
            t.cpu_op("CompiledFunction", base + 100, 50)
            t.kernel("triton_tem_fused_mm_0", base + 2000, 500, launch_us=base + 110)
    return t.write(root / "traces" / "rank0.json.gz").parent


def test_lower_bound_mfu_is_reported_with_its_coverage_and_never_fed_to_a_rule(tmp_path):
    mfu = 2 * 4096**3 / 10e-3 / 989.4e12  # 0.14 %: far under any reference
    ra = analyze(_compiled_trace(tmp_path / "compiled", compiled=True))
    assert ra.mfu.source == "trace-shapes"
    assert ra.mfu.flop_coverage == pytest.approx(100 / 600)
    assert ra.mfu.lower_bound and ra.mfu.median == pytest.approx(mfu)
    facts = run_facts(ra)
    assert facts.mfu is None
    assert any("lower bound" in n for n in facts.notes)
    assert "mfu_gap" not in {s.rule for s in suggest(ra)}
    # Full coverage: the same MFU is a measurement, and mfu_gap diagnoses it.
    full = analyze(_compiled_trace(tmp_path / "eager", compiled=False))
    assert full.mfu.flop_coverage == 1.0 and not full.mfu.lower_bound
    assert run_facts(full).mfu == pytest.approx(mfu)
    assert "mfu_gap" in {s.rule for s in suggest(full)}


def test_a_step_window_past_the_trace_is_clipped_flagged_and_never_fed_to_a_rule(tmp_path):
    """A ProfilerStep ending 13 s after the last event is clipped to the trace, never taken as a 13.3 s step."""
    t = KinetoTrace(rank=0, world_size=1, distributed=False)
    for s, dur in ((1, 10_000), (2, 13_336_000)):  # us: the second marker runs 13.3 s past its 10 ms of work
        base = (s - 1) * 10_000
        t.step(s, base, dur)
        for k in range(200):  # short kernels with gaps: launch-bound, as in the report that fired cuda_graphs
            t.kernel(
                "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>",
                base + 10 + 40 * k,
                4,
                launch_us=base + 5 + 40 * k,
            )
    ra = analyze(t.write(tmp_path / "traces" / "rank0.json.gz").parent)
    assert any("ProfilerStep#2 clipped" in w and "13.3" in w for w in ra.warnings)
    assert ra.steps["window_flagged"].tolist() == [False, True]
    assert ra.steps["step_time_ms"].max() < 20  # clipped to the events, not 13,336 ms
    facts = run_facts(ra)
    assert facts.step_time_ms == pytest.approx(10.0)  # the unflagged window only
    for s in suggest(ra):
        assert s.evidence.get("step_time_ms", 0) <= 10.0 + 1e-9, s.rule


def test_the_sub_facts_partition_run_facts():
    """RunFacts is assembled from its typed parts: each field comes from exactly one part (notes from run_facts),
    so a field added to RunFacts but to no part would be left at its default, and this fails."""
    import dataclasses

    from analyzer.verbs.suggest.facts import (
        CommunicationFacts,
        ComputeFacts,
        RunFacts,
        SetupFacts,
        StepFacts,
        WorkloadFacts,
    )

    parts = [
        [f.name for f in dataclasses.fields(p)]
        for p in (SetupFacts, StepFacts, CommunicationFacts, ComputeFacts, WorkloadFacts)
    ]
    names = [n for p in parts for n in p]
    assert len(names) == len(set(names))
    assert set(names) | {"notes"} == {f.name for f in dataclasses.fields(RunFacts)}
