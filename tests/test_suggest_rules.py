"""Each suggestion rule fires on facts built to trigger it, with the predicted step worked out by hand,
and stays silent on facts that are not (analyzer/verbs/suggest/rules_*.py, docs/suggestions.md)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from analyzer.metrics.stragglers import ARRIVAL_COLUMNS, StragglerConfig, StragglerResult, find_stragglers
from analyzer.verbs.suggest import rules_comm, rules_compute, rules_data, rules_health, rules_memory, whatif
from analyzer.verbs.suggest.engine import RULES, rank
from analyzer.verbs.suggest.facts import CommFacts, KernelFacts, MemoryFacts, RunFacts
from reftrain.config import Config, resolve, set_value

MiB = 2**20


def no_stragglers() -> StragglerResult:
    return StragglerResult(
        ranks=[],
        per_rank=[],
        verdict="none",
        step_source=None,
        arrival_source=None,
        config=StragglerConfig(),
        per_step=pd.DataFrame(),
    )


def config(**settings) -> dict:
    """A resolved reftrain config (dict) with ``section__key=value`` settings."""
    cfg = Config()
    for key, value in settings.items():
        set_value(cfg, key.replace("__", "."), value, "test")
    return resolve(cfg).to_dict()


def facts(cfg: dict | None = None, **fields) -> RunFacts:
    """A 2-rank CPU reftrain run, 100 ms steps, 1024 tokens per step, MFU 0.1, nothing else measured."""
    base = dict(
        kind="reftrain",
        device="cpu",
        device_name="AMD EPYC",
        config=cfg if cfg is not None else config(),
        config_path="/runs/r/config.yaml",
        world_size=2,
        step_time_ms=100.0,
        step_time_source="test",
        n_steps=20,
        tokens_per_step=1024.0,
        mfu=0.1,
        peak_flops_per_s=1e10,
        flops_per_token=1e6,
        dtype="fp32",
        phases={},
        profiled_step_time_ms=None,
        shares={},
        shares_source=None,
        exposed_comm_ms=None,
        exposed_comm_source=None,
        comm=None,
        kernels=None,
        memory=MemoryFacts(None, None, None, None),
        stragglers=no_stragglers(),
        cpu_cores=8,
        ranks_per_host=2,
    )
    base.update(fields)
    return RunFacts(**base)


def trace_facts(**fields) -> RunFacts:
    """A 2-rank foreign GPU trace set: no config, no tokens, 10 ms steps."""
    base = dict(
        kind="traces",
        device="cuda",
        device_name="NVIDIA H100 80GB HBM3",
        config=None,
        config_path=None,
        step_time_ms=10.0,
        tokens_per_step=None,
        mfu=None,
        peak_flops_per_s=None,
        flops_per_token=None,
        dtype="bf16",
        shares_source="device",
    )
    base.update(fields)
    return facts(**base)


def comm(
    n=1.0, nbytes=20 * MiB, service=50.0, alpha=None, per_byte=None, kinds=("all_reduce",), gather=None
) -> CommFacts:
    return CommFacts(
        n_per_step=n,
        bytes_per_step=float(nbytes),
        mean_bytes=nbytes / n,
        service_ms_per_step=service,
        alpha_ms=alpha,
        per_byte_ms=per_byte,
        kinds=kinds,
        gather_service_share=gather,
    )


def test_cpu_eta_interpolates_the_calibration_points():
    assert whatif.cpu_eta(64) == 0.32 and whatif.cpu_eta(256) == 0.75 and whatif.cpu_eta(32) == 0.32
    assert whatif.cpu_eta(128) == pytest.approx(0.57)
    assert whatif.cpu_eta(181) == pytest.approx(0.57 + 0.18 * 0.5, abs=2e-3)  # log2 midpoint of 128 and 256


def test_at_least_fifteen_documented_rules():
    import analyzer.verbs.suggest.run  # noqa: F401 - it imports every rule module; each registers on import

    names = {r.__name__ for r in RULES}
    assert len(names) >= 15, names
    assert all(r.__doc__ and len(r.__doc__.split()) > 8 for r in RULES)


# ----------------------------------------------------------------------------- data


def test_data_wait_sizes_workers_from_the_inferred_load_time():
    f = facts(
        config(data__num_workers=0), phases={"data_wait": 100.0, "forward": 30.0, "backward": 60.0}, step_time_ms=200.0
    )
    s = rules_data.rule_data_wait(f)
    # Synchronous loading: 100 ms per batch; consume 100 ms; ceil(100 / (0.7 * 100)) = 2 workers;
    # wait after = max(floor 8, 100/2 - 100) = 8 ms: step 200 - (100 - 8) = 108 ms.
    assert s.change.overrides == {"data.num_workers": 2}
    assert s.predicted.step_time_ms_after == pytest.approx(108.0)
    assert s.predicted.gain == pytest.approx(200 / 108 - 1)
    assert s.confidence == "high"


def test_data_wait_silent_under_five_percent():
    f = facts(config(data__num_workers=0), phases={"data_wait": 4.9}, step_time_ms=100.0)
    assert rules_data.rule_data_wait(f) is None


def test_data_wait_silent_when_the_wait_is_the_queue_floor():
    # 2 workers already waiting only 6 ms: the floor caps at the current wait, no gain left.
    f = facts(config(data__num_workers=2), phases={"data_wait": 6.0}, step_time_ms=100.0)
    assert rules_data.rule_data_wait(f) is None


def test_pin_memory_fires_on_cuda_with_pageable_copies():
    f = facts(config(data__pin_memory=False), device="cuda", shares={"exposed_memcpy": 0.1}, shares_source="device")
    s = rules_data.rule_pin_memory(f)
    assert s.change.overrides == {"data.pin_memory": True}
    assert s.predicted.step_time_ms_after == pytest.approx(90.0)
    assert rules_data.rule_pin_memory(dataclasses.replace(f, config=config(data__pin_memory=True))) is None
    assert rules_data.rule_pin_memory(dataclasses.replace(f, device="cpu")) is None


def test_exposed_memcpy_on_device_traces():
    f = trace_facts(shares={"exposed_memcpy": 0.2, "compute": 0.8})
    s = rules_data.rule_exposed_memcpy(f)
    assert s.change.overrides == {} and "non_blocking" in s.change.advice
    assert s.predicted.step_time_ms_after == pytest.approx(8.0)
    assert rules_data.rule_exposed_memcpy(trace_facts(shares={"exposed_memcpy": 0.04})) is None


# ----------------------------------------------------------------------------- communication


def test_ddp_bucket_size_saves_alpha_per_removed_collective():
    f = facts(
        config(parallel__bucket_cap_mb=1.0),
        step_time_ms=200.0,
        exposed_comm_ms=40.0,
        comm=comm(n=20, nbytes=20 * MiB, service=60.0, alpha=2.0, per_byte=1e-6),
    )
    s = rules_comm.rule_ddp_bucket_size(f)
    # cap 1 -> 25 MiB: 1 MiB first bucket + ceil(19/25) = 2 buckets; saved min(40, 18 * 2) = 36 ms.
    assert s.change.overrides == {"parallel.bucket_cap_mb": 25.0}
    assert s.predicted.step_time_ms_after == pytest.approx(164.0)
    quiet = dataclasses.replace(f, exposed_comm_ms=15.0)  # 7.5 % exposed
    assert rules_comm.rule_ddp_bucket_size(quiet) is None
    few = dataclasses.replace(f, comm=comm(n=2, nbytes=20 * MiB, alpha=2.0, per_byte=1e-6))
    assert rules_comm.rule_ddp_bucket_size(few) is None


def test_gradient_as_bucket_view_estimates_the_copy():
    f = facts(step_time_ms=1000.0, comm=comm(nbytes=100e6))
    s = rules_comm.rule_gradient_as_bucket_view(f)
    # 2 x 100 MB at 4 GB/s = 50 ms.
    assert s.predicted.step_time_ms_after == pytest.approx(950.0)
    assert s.change.overrides == {"parallel.gradient_as_bucket_view": True}
    assert rules_comm.rule_gradient_as_bucket_view(dataclasses.replace(f, comm=comm(nbytes=1e6))) is None
    on = dataclasses.replace(f, config=config(parallel__gradient_as_bucket_view=True))
    assert rules_comm.rule_gradient_as_bucket_view(on) is None


def test_overlap_grad_sync_keeps_only_the_last_bucket():
    f = facts(
        config(parallel__overlap_grad_sync=False),
        step_time_ms=400.0,
        phases={"grad_sync": 100.0},
        comm=comm(n=1, nbytes=20 * MiB, service=80.0),
    )
    s = rules_comm.rule_overlap_grad_sync(f)
    # DDP buckets: 1 MiB first, then 19 MiB last; tail 80 * 19/20 = 76 ms replaces the 100 ms sync.
    assert s.predicted.step_time_ms_after == pytest.approx(376.0)
    assert rules_comm.rule_overlap_grad_sync(dataclasses.replace(f, config=config())) is None


def test_grad_accumulation_amortizes_exposed_comm():
    f = facts(step_time_ms=200.0, exposed_comm_ms=40.0, phases={"data_wait": 10.0, "forward": 50.0, "backward": 100.0})
    s = rules_comm.rule_grad_accumulation(f)
    # per micro-batch (10 + 50 + 100 - 40) = 120 ms; 4 micro-batches: 200 + 3 * 120 = 560 ms for 4x the tokens.
    assert s.change.overrides == {"train.grad_accum": 4}
    assert s.predicted.step_time_ms_after == pytest.approx(560.0)
    assert s.predicted.gain == pytest.approx(4 * 200 / 560 - 1)
    assert rules_comm.rule_grad_accumulation(dataclasses.replace(f, exposed_comm_ms=19.0)) is None
    assert rules_comm.rule_grad_accumulation(dataclasses.replace(f, exposed_comm_ms=None)) is None


def test_fsdp_reshard_needs_headroom():
    cfg = config(parallel__strategy="fsdp")
    f = facts(
        cfg,
        step_time_ms=200.0,
        exposed_comm_ms=50.0,
        comm=comm(n=10, service=100.0, kinds=("all_gather", "reduce_scatter"), gather=0.6),
    )
    s = rules_comm.rule_fsdp_reshard(f)
    assert s.change.overrides == {"parallel.reshard_after_forward": False}
    assert s.predicted.step_time_ms_after == pytest.approx(170.0)  # half of 60 ms of gathers
    tight = dataclasses.replace(f, memory=MemoryFacts(75e9, "cuda_peak_allocated", 80e9, "test"))
    assert rules_comm.rule_fsdp_reshard(tight) is None
    assert rules_comm.rule_fsdp_reshard(dataclasses.replace(f, config=config())) is None  # DDP


def test_comm_compression_only_when_bandwidth_bound():
    f = trace_facts(exposed_comm_ms=6.0, comm=comm(n=2, nbytes=80e6, service=10.0, alpha=0.5, per_byte=1e-7))
    s = rules_comm.rule_comm_compression(f)
    # bandwidth part 80e6 * 1e-7 = 8 ms of 10; half saved, capped at the 6 ms exposed: 4 ms.
    assert s.predicted.step_time_ms_after == pytest.approx(6.0)
    latency = dataclasses.replace(f, comm=comm(n=2, nbytes=20e6, service=10.0, alpha=4.0, per_byte=1e-7))
    assert rules_comm.rule_comm_compression(latency) is None


# ----------------------------------------------------------------------------- compute


def test_micro_batch_scales_from_fixed_and_per_sequence_cost(monkeypatch):
    # The model's arithmetic on fixed calibration points (the shipped ones are measured, docs/suggestions.md).
    monkeypatch.setattr(whatif, "CPU_FIXED_SEQUENCES_POINTS", ((64, 2.3), (256, 0.55)))
    cfg = config(model__preset="tiny", train__micro_batch_size=1)  # seq_len 64, d_model 64: kappa 2.3 sequences
    assert whatif.cpu_fixed_sequences(64, 64) == 2.3
    f = facts(cfg, phases={"data_wait": 40.5, "forward": 16.5, "backward": 33.0, "optimizer": 10.0}, step_time_ms=100.0)
    s = rules_compute.rule_micro_batch(f)
    # 49.5 ms = P (2.3 + 1): P = 15 ms per sequence, 34.5 ms fixed; fixed share 85 %.
    # x2: 115 ms (74 % fixed), x4: 145 (59 %), x8: 205 (41 %, the cap).
    assert s.evidence["per_sequence_ms"] == pytest.approx(15.0)
    assert s.evidence["fixed_per_micro_batch_ms"] == pytest.approx(34.5)
    assert s.change.overrides == {"train.micro_batch_size": 8}
    assert s.predicted.step_time_ms_after == pytest.approx(205.0)
    assert s.predicted.tokens_per_step_after == 8 * 1024
    assert s.predicted.gain == pytest.approx(8 * 100 / 205 - 1)
    # The communication tail at the end of backward is not per-token work: 49.5 - 16.5 = 33 = P x 3.3.
    tail = dataclasses.replace(f, exposed_comm_ms=16.5)
    assert rules_compute.rule_micro_batch(tail).evidence["per_sequence_ms"] == pytest.approx(10.0)
    big = facts(
        config(model__preset="tiny", train__micro_batch_size=16),
        phases={"data_wait": 30.0, "forward": 100.0, "backward": 200.0},
        step_time_ms=330.0,
    )
    assert rules_compute.rule_micro_batch(big) is None  # P = 300 / 18.3: 16 x 16.4 = 262 of 330 ms is per-token work


def test_micro_batch_share_is_taken_of_the_phase_sum_not_the_median_step(monkeypatch):
    # The model's arithmetic on fixed calibration points (the shipped ones are measured, docs/suggestions.md).
    monkeypatch.setattr(whatif, "CPU_FIXED_SEQUENCES_POINTS", ((64, 2.3), (256, 0.55)))
    # d_model 128: kappa (2.3 + 0.55) / 2 = 1.425; fb 900 ms = P (1.425 + 16): P = 51.65, 826.4 ms per-token work.
    cfg = config(
        model__preset="tiny", model__d_model=128, model__n_layers=4, model__vocab_size=4096, train__micro_batch_size=16
    )
    phases = {"data_wait": 10.0, "forward": 300.0, "backward": 600.0, "optimizer": 40.0, "comm": 2000.0}
    # Against the 950 ms phase sum the fixed share is 13 %: silent, though a 1250 ms median step (other steps
    # than the phase medians') would have made it 34 %. comm_ms overlaps backward and is not part of the sum.
    assert rules_compute.phase_sum_ms(facts(cfg, phases=phases)) == pytest.approx(950.0)
    assert rules_compute.rule_micro_batch(facts(cfg, phases=phases, step_time_ms=1250.0)) is None
    slow_data = facts(cfg, phases=phases | {"data_wait": 310.0}, step_time_ms=1250.0)
    s = rules_compute.rule_micro_batch(slow_data)
    assert s.evidence["phase_sum_ms"] == pytest.approx(1250.0)
    assert s.evidence["fixed_share"] == pytest.approx(1 - 16 * 900 / 17.425 / 1250)
    assert s.predicted.step_time_ms_after == pytest.approx(
        1250 + 16 * 900 / 17.425 * (s.change.overrides["train.micro_batch_size"] / 16 - 1)
    )


def test_fixed_sequences_scale_with_width_and_sequence_length(monkeypatch):
    # The model's arithmetic on fixed calibration points (the shipped ones are measured, docs/suggestions.md).
    monkeypatch.setattr(whatif, "CPU_FIXED_SEQUENCES_POINTS", ((64, 2.3), (256, 0.55)))
    assert whatif.cpu_fixed_sequences(256, 64) == 0.55
    assert whatif.cpu_fixed_sequences(64, 128) == pytest.approx(1.15)  # the same fixed cost, sequences twice as long
    assert whatif.cpu_fixed_sequences(128, 64) == pytest.approx((2.3 + 0.55) / 2)  # log2 midpoint


def test_a_run_that_syncs_after_backward_has_a_smaller_fixed_forward_backward(monkeypatch):
    # Overlapped gloo all-reduce costs CPU inside backward (a fixed cost per micro-batch); syncing after backward
    # moves it to grad_sync, so kappa is the one measured per base micro-batch at d_model 128, scaled to the
    # width by the overlapped kappa (docs/suggestions.md).
    monkeypatch.setattr(whatif, "CPU_FIXED_SEQUENCES_POINTS", ((64, 2.3), (128, 1.0), (256, 0.55)))
    monkeypatch.setattr(whatif, "CPU_FIXED_SEQUENCES_SYNC_AFTER_BACKWARD_POINTS", ((1, 1.0), (4, 0.25)))
    assert whatif.cpu_fixed_sequences(128, 64, overlap_grad_sync=False, micro_batch=4) == pytest.approx(0.25)
    assert whatif.cpu_fixed_sequences(128, 64, overlap_grad_sync=False, micro_batch=2) == pytest.approx(0.625)
    assert whatif.cpu_fixed_sequences(128, 64, overlap_grad_sync=False, micro_batch=64) == pytest.approx(0.25)
    assert whatif.cpu_fixed_sequences(64, 64, overlap_grad_sync=False, micro_batch=4) == pytest.approx(0.575)
    phases = {"data_wait": 2.0, "forward": 10.0, "backward": 20.0, "optimizer": 8.0, "grad_sync": 12.0}
    overlap = facts(config(model__preset="tiny", train__micro_batch_size=4), phases=phases, step_time_ms=52.0)
    after = facts(
        config(model__preset="tiny", train__micro_batch_size=4, parallel__overlap_grad_sync=False),
        phases=phases,
        step_time_ms=52.0,
    )
    # tiny is d_model 64. fb 30 ms = P (kappa + 4): overlapped P = 30 / 6.3, after backward P = 30 / 4.575.
    assert rules_compute.rule_micro_batch(overlap).evidence["per_sequence_ms"] == pytest.approx(30 / 6.3)
    s = rules_compute.rule_micro_batch(after)
    assert s.evidence["fixed_in_sequences"] == pytest.approx(0.575)
    assert s.evidence["per_sequence_ms"] == pytest.approx(30 / 4.575)
    factor = s.change.overrides["train.micro_batch_size"] // 4
    assert s.predicted.step_time_ms_after == pytest.approx(52.0 + 4 * 30 / 4.575 * (factor - 1))


def test_launch_bound_grows_the_batch_while_the_device_idles():
    f = trace_facts(shares={"idle": 0.5, "compute": 0.4, "exposed_comm": 0.1})
    s = rules_compute.rule_launch_bound(f)
    # device work 4 ms + 1 ms comm in a 10 ms step: 2x fits (9 ms), 4x does not (17 ms).
    assert s.predicted.step_time_ms_after == pytest.approx(10.0)
    assert s.predicted.gain == pytest.approx(1.0)
    assert rules_compute.rule_launch_bound(trace_facts(shares={"idle": 0.1, "compute": 0.9})) is None
    reft = facts(
        config(train__micro_batch_size=4),
        device="cuda",
        shares={"idle": 0.8, "compute": 0.2},
        shares_source="device",
        memory=MemoryFacts(8e9, "cuda_peak_allocated", 80e9, "test"),
    )
    s = rules_compute.rule_launch_bound(reft)
    # 20 ms of device work in a 100 ms step: 4x fits (80 ms), 8x does not (160 ms); memory 10 % x 4 is fine.
    assert s.change.overrides == {"train.micro_batch_size": 16}
    assert s.predicted.step_time_ms_after == pytest.approx(100.0) and s.predicted.gain == pytest.approx(3.0)
    tight = dataclasses.replace(reft, memory=MemoryFacts(40e9, "cuda_peak_allocated", 80e9, "test"))
    assert rules_compute.rule_launch_bound(tight) is None  # 0.5 x 2 > 0.85


def test_launch_bound_scales_all_to_all_with_the_batch():
    """An embedding job's all-to-all grows with the batch; the what-if must not hold it constant."""
    ks = KernelFacts(
        n_per_step=100,
        gemm_ms_per_step=1.0,
        kernel_ms_per_step=4.0,
        short_share=0.1,
        mean_us=40.0,
        comm_ms_per_step=2.0,
        batch_comm_ms_per_step=2.0,
    )  # every collective an all-to-all
    f = trace_facts(shares={"idle": 0.5, "compute": 0.2, "exposed_comm": 0.3}, kernels=ks)
    s = rules_compute.rule_launch_bound(f)
    # 2 ms compute + 3 ms all-to-all, both x2 = 10 ms: the 10 ms step stays 10 ms for 2x the tokens. Holding the
    # all-to-all fixed (the old what-if) let 2x fit with room (2*2+3 = 7 ms) and offered 4x at 4*2+3 = 11 ms.
    assert s.evidence["exposed_comm_ms"] == pytest.approx(0.0)
    assert s.evidence["device_busy_scaled_ms"] == pytest.approx(5.0)
    assert s.predicted.step_time_ms_after == pytest.approx(10.0)
    allreduce = dataclasses.replace(f, kernels=dataclasses.replace(ks, batch_comm_ms_per_step=0.0))
    assert rules_compute.rule_launch_bound(allreduce).evidence["exposed_comm_ms"] == pytest.approx(3.0)


def test_cuda_graphs_on_short_kernels():
    ks = KernelFacts(n_per_step=2000, gemm_ms_per_step=2.0, kernel_ms_per_step=4.0, short_share=0.8, mean_us=2.0)
    f = trace_facts(shares={"idle": 0.5, "compute": 0.5}, kernels=ks)
    s = rules_compute.rule_cuda_graphs(f)
    assert s.predicted.step_time_ms_after == pytest.approx(6.0)  # 10 - 0.5 * 0.8 * 10
    long = dataclasses.replace(f, kernels=dataclasses.replace(ks, short_share=0.2))
    assert rules_compute.rule_cuda_graphs(long) is None


def test_torch_compile_on_fusable_heavy_device_bound_steps():
    ks = KernelFacts(
        n_per_step=500,
        gemm_ms_per_step=3.0,
        kernel_ms_per_step=8.0,
        short_share=0.1,
        mean_us=16.0,
        fusable_ms_per_step=5.0,
    )
    f = trace_facts(shares={"idle": 0.1, "compute": 0.9}, kernels=ks)
    s = rules_compute.rule_torch_compile(f)
    assert s.predicted.step_time_ms_after == pytest.approx(7.5)  # 5 ms fusable x 0.5
    # The same 5 ms non-GEMM time as cuDNN convolutions: not fusable, no suggestion (the old rule fired on it).
    convs = dataclasses.replace(f, kernels=dataclasses.replace(ks, fusable_ms_per_step=0.0))
    assert rules_compute.rule_torch_compile(convs) is None
    compiled = dataclasses.replace(f, kernels=dataclasses.replace(ks, compiled_ms_per_step=5.0))
    assert rules_compute.rule_torch_compile(compiled) is None
    reft = facts(config(train__compile=True), device="cuda", shares={"idle": 0.1}, shares_source="device", kernels=ks)
    assert rules_compute.rule_torch_compile(reft) is None


def test_bf16_autocast_by_datasheet_peak_ratio():
    ks = KernelFacts(n_per_step=500, gemm_ms_per_step=5.0, kernel_ms_per_step=8.0, short_share=0.1, mean_us=16.0)
    f = trace_facts(dtype="tf32", kernels=ks, mfu=0.2, shares={"compute": 1.0})
    s = rules_compute.rule_bf16_autocast(f)
    # H100 SXM tf32 494.7 / bf16 989.4 TFLOP/s: GEMMs take half as long.
    assert s.predicted.step_time_ms_after == pytest.approx(7.5)
    assert s.predicted.mfu_after == pytest.approx(0.2 * (10 / 7.5) * 0.5)  # against the bf16 peak
    assert rules_compute.rule_bf16_autocast(dataclasses.replace(f, dtype="bf16")) is None
    reft = facts(
        config(train__dtype="fp32", train__tf32=True),
        device="cuda",
        device_name="NVIDIA A100-SXM4-80GB",
        kernels=ks,
        step_time_ms=10.0,
    )
    assert rules_compute.rule_bf16_autocast(reft).change.overrides == {"train.dtype": "bf16"}


def test_tf32_for_plain_fp32_matmuls_where_tensor_cores_have_it():
    ks = KernelFacts(n_per_step=500, gemm_ms_per_step=4.0, kernel_ms_per_step=8.0, short_share=0.1, mean_us=16.0)
    f = facts(
        config(train__tf32=False), device="cuda", device_name="NVIDIA A100-SXM4-80GB", kernels=ks, step_time_ms=10.0
    )
    s = rules_compute.rule_tf32(f)
    # A100 fp32 19.5 / tf32 156 TFLOP/s.
    assert s.predicted.step_time_ms_after == pytest.approx(10.0 - 4.0 * (1 - 19.5 / 156))
    assert s.change.overrides == {"train.tf32": True}
    v100 = dataclasses.replace(f, device_name="Tesla V100-SXM2-32GB")
    assert rules_compute.rule_tf32(v100) is None
    assert rules_compute.rule_tf32(dataclasses.replace(f, config=config(train__tf32=True))) is None


def test_fused_adamw():
    f = facts(phases={"optimizer": 30.0})
    s = rules_compute.rule_fused_adamw(f)
    assert s.predicted.step_time_ms_after == pytest.approx(
        100.0 - 30.0 * (1 - rules_compute.FUSED_OPTIMIZER_TIME_FACTOR["cpu"])
    )
    assert s.change.overrides == {"optim.impl": "fused"}
    assert rules_compute.rule_fused_adamw(dataclasses.replace(f, config=config(optim__impl="fused"))) is None
    assert rules_compute.rule_fused_adamw(facts(phases={"optimizer": 9.0})) is None


# ----------------------------------------------------------------------------- memory


def _full(cfg: dict, **fields) -> RunFacts:
    return facts(
        cfg,
        device="cuda",
        device_name="NVIDIA H100 80GB HBM3",
        memory=MemoryFacts(76e9, "cuda_peak_allocated", 80e9, "test"),
        **fields,
    )


def test_activation_checkpointing_over_ninety_percent():
    s = rules_memory.rule_activation_checkpointing(_full(config(), phases={"forward": 30.0}))
    assert s.change.overrides == {"train.activation_checkpointing": True}
    assert s.predicted.step_time_ms_after == pytest.approx(130.0)
    assert s.predicted.gain < 0
    low = facts(
        config(), device="cuda", phases={"forward": 30.0}, memory=MemoryFacts(40e9, "cuda_peak_allocated", 80e9, "t")
    )
    assert rules_memory.rule_activation_checkpointing(low) is None
    on = _full(config(train__activation_checkpointing=True), phases={"forward": 30.0})
    assert rules_memory.rule_activation_checkpointing(on) is None


def test_smaller_micro_batch_keeps_tokens_per_step():
    s = rules_memory.rule_smaller_micro_batch(
        _full(config(train__micro_batch_size=8), shares={"idle": 0.2}, shares_source="device")
    )
    assert s.change.overrides == {"train.micro_batch_size": 4, "train.grad_accum": 2}
    assert s.predicted.step_time_ms_after == pytest.approx(120.0)
    assert s.predicted.tokens_per_step_after == s.predicted.tokens_per_step_before
    assert rules_memory.rule_smaller_micro_batch(_full(config(train__micro_batch_size=1))) is None


# ----------------------------------------------------------------------------- health


def _straggling(rank: int, excess_ms: float) -> StragglerResult:
    """The analyzer's verdict on 20 steps where ``rank`` takes ``excess_ms`` longer (a little noise on both)."""
    rows = [
        {"rank": r, "step": s, "step_time_ms": 100.0 + (excess_ms if r == rank else 0.0) + (s % 3) * 0.1}
        for s in range(20)
        for r in (0, 1)
    ]
    result = find_stragglers(
        pd.DataFrame(rows), pd.DataFrame(columns=list(ARRIVAL_COLUMNS)), step_source="test", arrival_source=None
    )
    assert result.ranks == [rank]
    return result


def test_straggler_names_rank_phase_and_removes_an_injection():
    phases = {
        0: {"data_wait": 2.0, "forward": 20.0, "backward": 40.0},
        1: {"data_wait": 2.0, "forward": 60.0, "backward": 40.0},
    }
    f = facts(stragglers=_straggling(1, 40.0), rank_phases=phases)
    s = rules_health.rule_straggler(f)
    assert s.evidence["rank"] == 1 and s.evidence["slowest_phase"] == "forward"
    assert s.evidence["slowest_phase_excess_ms"] == pytest.approx(40.0)
    assert s.change.overrides == {} and "compute" in s.change.advice
    assert s.predicted.step_time_ms_after == pytest.approx(60.0)
    injected = dataclasses.replace(f, inject={"slow_rank": 1, "delay_ms": 40.0, "slowdown": None})
    s = rules_health.rule_straggler(injected)
    assert s.change.overrides == {"inject.slow_rank": None, "inject.delay_ms": None}
    assert s.change.set_args() == ["--set", "inject.slow_rank=null", "--set", "inject.delay_ms=null"]
    # Its measured injected time per step is what goes; the 10 ms of excess beyond it is its own slower compute.
    phases_inj = {0: phases[0], 1: phases[1] | {"injected": 30.0}}
    s = rules_health.rule_straggler(dataclasses.replace(injected, rank_phases=phases_inj))
    assert s.evidence["injected_ms"] == 30.0 and s.predicted.step_time_ms_after == pytest.approx(70.0)
    assert s.predicted.gain == pytest.approx(100 / 70 - 1)
    assert rules_health.rule_straggler(facts()) is None


# Per-step lateness and step times (ms) measured on this project's 2-core machine, 2 gloo ranks, 9 steady steps
# each (reftrain --nproc 2, bench_suggest's scenarios at 16 steps, 2026-12-04 22:33-22:37 UTC):
# * contention: the "tiny DDP buckets" scenario (17 all-reduces per step, no slow rank) with another process
#   spinning on CPU 1; rank 0 arrived last at every step's collectives by what the scheduler took from it.
CONTENDED_LATENESS_MS = [517.5, 492.2, 1266.9, 150.9, 826.1, 337.1, 140.7, 186.6, 91.4]  # rank 0
CONTENDED_LATENESS_OTHER_MS = [4.1, 69.3, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # rank 1
CONTENDED_STEP_MS = (
    [348.1, 341.8, 318.1, 314.6, 337.0, 286.0, 307.1, 309.4, 310.6],  # rank 0
    [339.7, 320.5, 314.5, 306.0, 330.6, 282.2, 300.2, 298.5, 306.9],
)  # rank 1
# * persistent: the "straggler" scenario (inject.slow_rank=1, delay_ms=400, one all-reduce per step) with
#   another process spinning on CPU 0; rank 1's lateness at the step's all-reduce.
INJECTED_LATENESS_MS = [385.6, 354.3, 392.1, 415.7, 378.3, 413.5, 370.8, 386.0, 459.7]  # rank 1
INJECTED_STEP_MS = (
    [486.2, 518.9, 496.6, 491.1, 459.2, 486.5, 483.9, 500.6, 525.3],
    [485.0, 514.3, 489.9, 489.6, 463.4, 492.5, 493.3, 485.4, 507.0],
)


def _arrival_run(lateness_ms: dict[int, list[float]], step_ms: tuple[list[float], ...] | None = None):
    """The analyzer's straggler verdict and ``RunFacts.sync_delay_ms`` on synthetic records: one collective per
    step, rank ``r`` arriving ``lateness_ms[r][s]`` ms after the step's common start; step times
    ``step_ms[r][s]`` (1000 ms on every rank without them)."""
    from analyzer.metrics.stragglers import collective_table
    from analyzer.metrics.collective_model import sync_delay_ms

    n = len(next(iter(lateness_ms.values())))
    arrivals, steps = [], []
    for s in range(n):
        t0 = s * 10_000_000_000  # 10 s apart
        end = t0 + int((max(late[s] for late in lateness_ms.values()) + 5.0) * 1e6)
        for r, late in lateness_ms.items():
            arrivals.append(
                {
                    "rank": r,
                    "key": f"0:{s}",
                    "step": s,
                    "kind": "all_reduce",
                    "bytes": 4e6,
                    "group_size": 2,
                    "start_ns": t0 + int(round(late[s] * 1e6)),
                    "end_ns": end,
                }
            )
            steps.append({"rank": r, "step": s, "step_time_ms": step_ms[r][s] if step_ms else 1000.0})
    arr = pd.DataFrame(arrivals, columns=list(ARRIVAL_COLUMNS))
    result = find_stragglers(pd.DataFrame(steps), arr, step_source="test", arrival_source="test")
    return result, sync_delay_ms(collective_table(arr))


def test_straggler_silent_when_the_late_rank_changes_at_random():
    # Contention noise: each step one rank, drawn at random, arrives 400 ms late; or both ranks equally noisy.
    rng = np.random.default_rng(18)
    slow = rng.integers(0, 2, size=24)
    result, sync = _arrival_run({r: [400.0 * (slow[s] == r) for s in range(24)] for r in (0, 1)})
    assert (
        result.ranks == []
        and rules_health.rule_straggler(facts(stragglers=result, sync_delay_ms=sync, step_time_ms=1000.0)) is None
    )
    noisy = rng.uniform(0.0, 400.0, size=(2, 24))
    result, sync = _arrival_run({r: list(noisy[r]) for r in (0, 1)})
    assert (
        result.ranks == []
        and rules_health.rule_straggler(facts(stragglers=result, sync_delay_ms=sync, step_time_ms=1000.0)) is None
    )


def test_straggler_silent_on_a_rank_slowed_by_machine_contention():
    # Lateness: the measured contended run's values at one collective per step, twice over (18 steps), 1000 ms
    # steps. The verdict flags rank 0 (late in every step, robust z 4.1), and before the effect-size test the
    # rule fired at +50.9 % (its 337.1 ms sync delay removed from 1000 ms); yet the excess varies from step to
    # step as much as it is large.
    result, sync = _arrival_run({0: CONTENDED_LATENESS_MS * 2, 1: CONTENDED_LATENESS_OTHER_MS * 2})
    assert result.ranks == [0] and result.per_rank[0].signals == ["lateness"] and sync == {0: pytest.approx(337.1)}
    # d = rank 0 - rank 1 per step: median 337.1 ms, MAD 186.2 ms, sigma = MAD / 0.67449 = 276.06 ms: 1.221.
    late = rules_health.excess_effect(result, 0, "lateness")
    assert late.excess_ms == pytest.approx(337.1, abs=0.01) and late.n_steps == 18
    assert late.spread_ms == pytest.approx(186.2 / 0.6744897501960817, abs=0.01)
    assert late.effect == pytest.approx(1.2211, abs=1e-3) and late.effect < rules_health.MIN_EFFECT_SIZE
    assert rules_health.rule_straggler(facts(stragglers=result, sync_delay_ms=sync, step_time_ms=1000.0)) is None
    # Step time: the same run's measured step times (9 steps), every rank arriving together. Flagged on
    # step_time (6.9 ms excess, 2.2 % of the 312.6 ms step; the rule fired at +2.3 % before); d: median 6.9 ms,
    # MAD 3.1 ms: 6.9 / 4.596 = 1.501.
    result, sync = _arrival_run({0: [0.0] * 9, 1: [0.0] * 9}, CONTENDED_STEP_MS)
    assert result.ranks == [0] and result.per_rank[0].signals == ["step_time"] and sync == {}
    assert rules_health.excess_effect(result, 0, "step_time").effect == pytest.approx(1.501, abs=1e-3)
    assert (
        rules_health.rule_straggler(facts(stragglers=result, step_time_ms=float(np.median(CONTENDED_STEP_MS)))) is None
    )


def test_straggler_fires_on_a_rank_persistently_400_ms_late():
    result, sync = _arrival_run({0: [0.0] * 9, 1: INJECTED_LATENESS_MS}, INJECTED_STEP_MS)
    assert result.ranks == [1]
    # d: median 386.0 ms, MAD 15.2 ms (sigma 22.54 ms): 17.1 spreads clear of zero.
    assert rules_health.excess_effect(result, 1, "lateness").effect == pytest.approx(
        386.0 / (15.2 / 0.6744897501960817), abs=0.01
    )
    assert sync == {1: pytest.approx(386.0)}  # the median step's skew at the all-reduce rank 1 arrived last at
    f = facts(stragglers=result, sync_delay_ms=sync, step_time_ms=491.6448645)  # that run's steady step
    s = rules_health.rule_straggler(f)
    assert s.evidence["rank"] == 1 and s.evidence["excess_ms"] == pytest.approx(386.0)
    assert s.evidence["effect_size"] == pytest.approx(17.13, abs=0.01)
    assert s.predicted.step_time_ms_after == pytest.approx(491.6448645 - 386.0)
    assert s.predicted.gain == pytest.approx(3.6538, abs=1e-4)  # 491.64 / 105.64 - 1
    injected = rules_health.rule_straggler(
        dataclasses.replace(
            f, inject={"slow_rank": 1, "delay_ms": 400.0, "slowdown": None}, rank_phases={0: {}, 1: {"injected": 400.0}}
        )
    )
    # min(excess 386.0, injected 400.0): the same step; the exact change that removes the injection.
    assert injected.predicted.gain == pytest.approx(3.6538, abs=1e-4) and injected.confidence == "high"
    assert injected.change.overrides == {"inject.slow_rank": None, "inject.delay_ms": None}


def test_profiler_overhead_is_about_run_wall_time():
    f = facts(profiled_step_time_ms=300.0, profile_steps=(10, 30))
    s = rules_health.rule_profiler_overhead(f)
    assert s.predicted.scope == "run wall time"
    assert s.predicted.step_time_ms_before == pytest.approx((20 * 100 + 10 * 300) / 30)
    assert s.predicted.step_time_ms_after == pytest.approx((27 * 100 + 3 * 300) / 30)
    assert s.gain == 0.0  # ranked by steady-state gain: it does not change MFU
    assert rules_health.rule_profiler_overhead(dataclasses.replace(f, profile_steps=(3, 30))) is None


def test_mfu_gap_lists_top_contributors():
    cfg = config(model__preset="tiny", train__micro_batch_size=1)
    f = facts(
        cfg,
        mfu=0.05,
        phases={"data_wait": 10.0, "forward": 20.0, "backward": 40.0, "optimizer": 15.0},
        exposed_comm_ms=12.0,
    )
    s = rules_health.rule_mfu_gap(f)
    assert s.kind == "diagnosis" and s.evidence["reference_mfu"] == pytest.approx(whatif.cpu_eta(64))
    assert list(k for k in s.evidence if k.endswith("_ms") and k != "step_time_ms")[0] == "fixed_overhead_ms"
    assert "micro_batch" in s.change.advice
    assert rules_health.rule_mfu_gap(dataclasses.replace(f, mfu=0.3)) is None


def test_ranking_puts_changes_first_by_gain():
    f = facts(
        config(model__preset="tiny", train__micro_batch_size=1),
        mfu=0.05,
        phases={"data_wait": 10.0, "forward": 20.0, "backward": 40.0, "optimizer": 15.0},
    )
    found = [
        s
        for s in (rules_compute.rule_fused_adamw(f), rules_health.rule_mfu_gap(f), rules_compute.rule_micro_batch(f))
        if s
    ]
    ranked = rank(found)
    assert [s.rule for s in ranked] == ["micro_batch", "fused_adamw", "mfu_gap"]
    assert ranked[0].gain > ranked[1].gain


def test_comm_one_rank_fires_over_twenty_percent_on_one_traced_rank():
    from analyzer.verbs.suggest import rules_comm

    f = trace_facts(exposed_comm_ms=3.0, ranks_traced=1, world_size=1)  # 30 % of a 10 ms step
    s = rules_comm.rule_comm_one_rank(f)
    assert s is not None and s.kind == "diagnosis" and s.confidence == "low"
    assert s.evidence["exposed_comm_share"] == pytest.approx(0.3)
    assert s.predicted.step_time_ms_after == pytest.approx(7.0)  # never more than removing the 3 ms it addresses
    assert rules_comm.rule_comm_one_rank(dataclasses.replace(f, exposed_comm_ms=2.0)) is None  # 20 %: not over
    assert rules_comm.rule_comm_one_rank(dataclasses.replace(f, ranks_traced=2)) is None  # arrivals tell it
    assert rules_comm.rule_comm_one_rank(dataclasses.replace(f, kind="reftrain")) is None
