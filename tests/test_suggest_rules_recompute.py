"""Recompute and tokens from a trace (analyzer/metrics/workload.py) and rule selective_checkpointing
(analyzer/verbs/suggest/rules_recompute.py): synthetic traces with hand-worked answers, fire and silent
cases, a prediction never above removing the recompute, and the shared samples' embedding shapes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from analyzer.api import analyze
from analyzer.ingest.load import load_trace
from analyzer.metrics.workload import output_numel, rank_workload
from analyzer.verbs.suggest import rules_memory, rules_recompute
from analyzer.verbs.suggest.facts import run_facts
from analyzer.verbs.suggest.run import suggest
from synth import KinetoTrace

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
GEMM = "sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x32"
ELEMENTWISE = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar>"
)
MB = 2**20
# The linear of the trace: input [4, 128, 64] x weight [256, 64], fp32: 4 x 128 x 256 elements x 4 bytes.
LINEAR_OUT_BYTES = 4 * 128 * 256 * 4
CAPACITY = 80e9  # "NVIDIA H100 80GB HBM3": the name says 80 GB
LIMIT = rules_recompute.MEMORY_LIMIT * CAPACITY


def fwd(seq: int) -> dict:
    """The args PyTorch writes on a forward op that records an autograd node."""
    return {"Sequence number": seq, "Fwd thread id": 0}


def _trace(
    tmp: Path,
    *,
    recompute: bool = True,
    gemm_recompute: bool = True,
    peak: float | None = 60e9,
    micro_batches: int = 1,
    name: str = "rank0.json",
    embedding: bool = True,
    comm: bool = False,
) -> Path:
    """One 1000 us step: forward (embedding, a linear), then backward on the autograd thread, where

    * with ``recompute``: the linear (aten::linear around aten::addmm, launching a 100 us GEMM) and a relu
      (a 20 us elementwise kernel) run again as forward ops (Sequence number, Fwd thread id 0) inside
      ``AddmmBackward0``: recompute ranges 410-460 and 470-480 us (60 us host), 120 us of kernels, 100 us GEMM;
      ``gemm_recompute=False`` leaves only the relu (20 us, no GEMM);
    * the backward's own aten::mm (no sequence number) launches a 150 us GEMM: not recompute.
    ``peak``: a ``[memory]`` event with that many bytes allocated (None: no memory events).
    ``embedding=False``: no embedding, and the forward linear takes a 2-D input (no tokens in the shapes);
    ``comm``: a 150 us all-reduce at 800 us that no kernel overlaps (exposed comm 15 % of the step).
    """
    t = KinetoTrace(rank=0, world_size=1)
    bw = t.tid + 1
    t.step(1, 0, 1000)
    for i in range(micro_batches):
        base = 10 + 100 * i
        if embedding:
            t.cpu_op(
                "aten::embedding",
                base,
                8,
                args=fwd(1 + 10 * i),
                input_dims=[[1000, 64], [4, 128], [], [], []],
                input_types=["float", "long int", "Scalar", "Scalar", "Scalar"],
            )
            # A position embedding of another shape takes the same ids: not counted again.
            t.cpu_op(
                "aten::embedding",
                base + 10,
                5,
                args=fwd(2 + 10 * i),
                input_dims=[[128, 64], [4, 128], [], [], []],
                input_types=["float", "long int", "Scalar", "Scalar", "Scalar"],
            )
        t.cpu_op(
            "aten::linear",
            base + 20,
            50,
            args=fwd(3 + 10 * i),
            input_dims=[[4, 128, 64] if embedding else [512, 64], [256, 64], [256]],
            input_types=["float"] * 3,
        )
        t.kernel(GEMM, base + 200, 100, launch_us=base + 25)
    t.cpu_op("autograd::engine::evaluate_function: AddmmBackward0", 400, 300, tid=bw)
    t.cpu_op("AddmmBackward0", 402, 290, tid=bw, args={"Sequence number": 3, "Fwd thread id": 1})
    if recompute:
        if gemm_recompute:
            t.cpu_op(
                "aten::linear",
                410,
                50,
                tid=bw,
                args=fwd(20),
                input_dims=[[4, 128, 64], [256, 64], [256]],
                input_types=["float"] * 3,
            )
            t.cpu_op(
                "aten::addmm",
                415,
                30,
                tid=bw,
                args=fwd(21),
                input_dims=[[256], [512, 64], [64, 256], [], []],
                input_types=["float"] * 3 + ["Scalar"] * 2,
            )
            t.kernel(GEMM, 500, 100, launch_us=420)
        t.cpu_op("aten::relu", 470, 10, tid=bw, args=fwd(22), input_dims=[[4, 128, 256]], input_types=["float"])
        t.kernel(ELEMENTWISE, 610, 20, launch_us=472)
    t.cpu_op("aten::mm", 490, 30, tid=bw, input_dims=[[512, 256], [256, 64]], input_types=["float", "float"])
    t.kernel(GEMM, 640, 150, launch_us=495)
    if comm:
        t.kernel(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            800,
            150,
            stream=20,
            launch_us=780,
            args=t.comm_args("allreduce", 1 << 20),
        )
    if peak is not None:
        t.memory(5, int(peak), int(peak) + 2**30, 4096)
    # Launch calls of the backward's kernels come from the autograd thread.
    for ev in t.events:
        if ev.get("cat") == "cuda_runtime" and ev["ts"] >= 400:
            ev["tid"] = bw
    path = tmp / name
    t.write(path)
    return path


def test_output_numel_of_matmul_like_ops() -> None:
    assert output_numel("aten::linear", [[4, 128, 64], [256, 64], [256]]) == 4 * 128 * 256
    assert output_numel("aten::addmm", [[256], [512, 64], [64, 256], [], []]) == 512 * 256
    assert output_numel("aten::bmm", [[8, 16, 32], [8, 32, 4]]) == 8 * 16 * 4
    assert output_numel("aten::matmul", [[2, 1, 16, 32], [3, 32, 4]]) == 2 * 3 * 16 * 4  # broadcast batch
    assert (
        output_numel("aten::scaled_dot_product_attention", [[2, 8, 128, 64], [2, 8, 128, 64], [2, 8, 128, 32]])
        == 2 * 8 * 128 * 32
    )
    assert output_numel("aten::matmul", [[2, 16, 32], [3, 32, 4]]) is None  # batch dims do not broadcast
    assert output_numel("aten::linear", [[4, 64]]) is None


def test_rank_workload_exact(tmp_path: Path) -> None:
    rt = load_trace(_trace(tmp_path))
    w = rank_workload(rt.events, rt.steps).iloc[0]
    assert w["step"] == 1
    assert w["tokens"] == 4 * 128  # the token embedding's ids; the position embedding's are the same tokens
    assert "aten::embedding input ids [4, 128] (weight [1000, 64])" in w["tokens_source"]
    assert w["recompute_ranges"] == 2  # the linear (with its addmm inside) and the relu
    assert w["recompute_host_ms"] == pytest.approx(0.060)
    assert w["recompute_device_ms"] == pytest.approx(0.120)  # the GEMM and the elementwise kernel
    assert w["recompute_flop_ms"] == pytest.approx(0.100)  # the GEMM only; the backward's own mm is not recompute
    assert w["recompute_flop_ops"] == 1 and w["recompute_shaped"] == 1  # the addmm is inside the linear
    assert w["recompute_out_bytes"] == LINEAR_OUT_BYTES
    assert not w["reentrant"]


def test_the_workload_survives_the_stored_rank_summary(tmp_path: Path) -> None:
    import pandas as pd

    from analyzer import rankcache
    from analyzer.rankmap import summarize_rank

    part = summarize_rank(load_trace(_trace(tmp_path)))
    arrays: list = []
    back = rankcache.decode(rankcache.encode(part, arrays), arrays)
    pd.testing.assert_frame_equal(part.workload, back.workload)
    assert back.workload.iloc[0]["recompute_out_bytes"] == LINEAR_OUT_BYTES


def test_tokens_sum_the_micro_batches_of_a_step(tmp_path: Path) -> None:
    rt = load_trace(_trace(tmp_path, micro_batches=3))
    assert rank_workload(rt.events, rt.steps).iloc[0]["tokens"] == 3 * 4 * 128


def test_no_recompute_without_forward_ops_in_backward(tmp_path: Path) -> None:
    rt = load_trace(_trace(tmp_path, recompute=False))
    w = rank_workload(rt.events, rt.steps).iloc[0]
    assert w["recompute_ranges"] == 0 and w["recompute_device_ms"] == 0.0
    assert run_facts(analyze(tmp_path)).recompute is None


def test_facts_tokens_and_recompute_of_a_foreign_trace(tmp_path: Path) -> None:
    f = run_facts(analyze(_trace(tmp_path).parent))
    assert f.tokens_per_step == 512 and f.tokens_source.startswith("trace input shapes: aten::embedding")
    r = f.recompute
    assert r is not None and f.step_time_ms == pytest.approx(1.0)
    assert r.share == pytest.approx(0.12) and r.flop_share == pytest.approx(0.10)
    assert r.out_bytes == LINEAR_OUT_BYTES
    assert r.peak_bytes == 60e9 and r.capacity_bytes == CAPACITY


def test_selective_checkpointing_fires_with_headroom(tmp_path: Path) -> None:
    f = run_facts(analyze(_trace(tmp_path).parent))
    s = rules_recompute.rule_selective_checkpointing(f)
    assert s is not None and s.change.overrides == {}
    assert "create_selective_checkpoint_contexts" in s.change.advice
    # 1.0 ms step, 0.12 ms recompute of which 0.10 ms GEMM: the GEMM's part saved, the relu's rerun stays.
    assert s.predicted.step_time_ms_after == pytest.approx(0.90)
    assert s.evidence["kept_fraction"] == 1.0 and s.evidence["recompute_ms"] == pytest.approx(0.12)
    assert s.confidence == "medium"
    # Never more than removing the recompute.
    assert f.step_time_ms - s.predicted.step_time_ms_after <= s.evidence["recompute_ms"] + 1e-12
    assert "selective_checkpointing" in {x.rule for x in suggest(analyze(tmp_path))}


def test_selective_checkpointing_keeps_only_what_fits(tmp_path: Path) -> None:
    # Half the matmul outputs fit under the limit: half the GEMM recompute saved.
    f = run_facts(analyze(_trace(tmp_path, peak=LIMIT - LINEAR_OUT_BYTES / 2).parent))
    s = rules_recompute.rule_selective_checkpointing(f)
    assert s is not None and s.evidence["kept_fraction"] == pytest.approx(0.5, abs=1e-6)
    assert s.predicted.step_time_ms_after == pytest.approx(0.95)


def test_selective_checkpointing_silent_when_memory_is_full(tmp_path: Path) -> None:
    f = run_facts(analyze(_trace(tmp_path, peak=LIMIT - 0.05 * LINEAR_OUT_BYTES).parent))
    assert rules_recompute.rule_selective_checkpointing(f) is None  # 5 % < MIN_KEPT_FRACTION would fit


def test_selective_checkpointing_memory_unknown_is_low(tmp_path: Path) -> None:
    f = run_facts(analyze(_trace(tmp_path, peak=None).parent))
    s = rules_recompute.rule_selective_checkpointing(f)
    assert s is not None and s.confidence == "low"
    assert any("memory headroom unknown" in n for n in s.notes)
    assert s.predicted.step_time_ms_after == pytest.approx(0.90)


def test_selective_checkpointing_silent_without_expensive_recompute(tmp_path: Path) -> None:
    # Only the relu is recomputed (2 % of the step, no GEMM): under the threshold, and nothing to save anyway.
    f = run_facts(analyze(_trace(tmp_path, gemm_recompute=False).parent))
    assert f.recompute is not None and f.recompute.share == pytest.approx(0.02)
    assert rules_recompute.rule_selective_checkpointing(f) is None
    big = dataclasses.replace(f, recompute=dataclasses.replace(f.recompute, share=0.2))
    assert rules_recompute.rule_selective_checkpointing(big) is None  # over the threshold, but no GEMM to keep


def test_activation_checkpointing_rule_is_silent_when_the_trace_recomputes(tmp_path: Path) -> None:
    f = run_facts(analyze(_trace(tmp_path, peak=0.95 * CAPACITY).parent))
    high = dataclasses.replace(
        f,
        memory=dataclasses.replace(
            f.memory, peak_bytes=0.95 * CAPACITY, capacity_bytes=CAPACITY, kind="cuda_peak_allocated"
        ),
    )
    assert high.memory.fraction == pytest.approx(0.95)
    assert rules_memory.rule_activation_checkpointing(high) is None


def test_reftrain_turns_checkpointing_off_when_all_activations_fit(tmp_path: Path) -> None:
    f = run_facts(analyze(_trace(tmp_path).parent))
    cfg = {
        "model": {"n_layers": 2, "d_model": 64, "n_heads": 4, "seq_len": 128},
        "train": {"micro_batch_size": 4, "dtype": "fp32", "activation_checkpointing": True},
    }
    ref = dataclasses.replace(f, kind="reftrain", config=cfg)
    s = rules_recompute.rule_selective_checkpointing(ref)
    assert s is not None and s.change.overrides == {"train.activation_checkpointing": False}
    # Korthikanti eq. 1 at fp32: L s b h (34 + 5 a s / h - 2) x 4 / 2 bytes.
    assert s.evidence["activation_bytes_estimate"] == 2 * 128 * 4 * 64 * (34 + 5 * 4 * 128 / 64 - 2) * 2
    assert s.predicted.step_time_ms_after == pytest.approx(1.0 - 0.12)  # the whole recompute
    # Without the headroom for all activations: the selective advice, as a code change in reftrain.
    tight = dataclasses.replace(ref, recompute=dataclasses.replace(ref.recompute, peak_bytes=LIMIT - LINEAR_OUT_BYTES))
    s = rules_recompute.rule_selective_checkpointing(tight)
    assert s is not None and s.change.overrides == {} and "reftrain/parallel.py" in s.change.advice
    assert s.predicted.step_time_ms_after == pytest.approx(0.90)


def test_grad_accumulation_predicts_tokens_from_the_trace_shapes(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with_ids = [s for s in suggest(analyze(_trace(tmp_path / "a", comm=True).parent)) if s.rule == "grad_accumulation"]
    assert with_ids, "exposed comm 15 % of the step: grad_accumulation fires"
    p = with_ids[0].predicted
    assert (p.tokens_per_step_before, p.tokens_per_step_after) == (512, 4 * 512)
    assert with_ids[0].evidence["tokens_source"].startswith("trace input shapes: aten::embedding input ids [4, 128]")
    assert with_ids[0].coverage["tokens_source"] == with_ids[0].evidence["tokens_source"]
    assert "tokens per step unknown" not in p.method
    # Without shapes that say tokens, the prediction is per step of the trace (work ratio 4, no tokens).
    no_ids = [
        s
        for s in suggest(analyze(_trace(tmp_path / "b", comm=True, embedding=False).parent))
        if s.rule == "grad_accumulation"
    ]
    assert no_ids and no_ids[0].predicted.tokens_per_step_before is None
    assert no_ids[0].predicted.work_ratio == 4.0 and "tokens per step unknown" in no_ids[0].predicted.method
    assert p.step_time_ms_after == pytest.approx(no_ids[0].predicted.step_time_ms_after)  # same what-if either way


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/traces is absent")
@pytest.mark.parametrize(
    ("trace", "tokens"),
    [
        ("tracelens-samples/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", 16 * 559),
        ("tracelens-samples/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", 16 * 559),
        ("tracelens-samples/h100/gaunernst_bert-small-uncased__1016001.json.gz", 141),
        ("tracelens-samples/mi300/gaunernst_bert-small-uncased__1016001.json.gz", 141),
    ],
)
def test_tokens_from_the_shared_samples_embedding(trace: str, tokens: int) -> None:
    # The embeddings' recorded ids: Qwen [16, 559]; bert [1, 141] on its word, token-type and position embeddings.
    f = run_facts(analyze(SHARED / trace))
    assert f.tokens_per_step == tokens and "aten::embedding" in f.tokens_source
    assert f.recompute is None  # inference traces: no backward, nothing recomputed


@pytest.fixture(scope="module")
def ac_run(tmp_path_factory) -> Path:
    """A real 2-rank CPU reftrain run of the tiny model with activation checkpointing (checkpoint_wrapper,
    non-reentrant), grad_accum 2 so that each profiled step embeds two micro-batches; 6 steps, 2 profiled."""
    import subprocess
    import sys

    runs = tmp_path_factory.mktemp("runs")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "reftrain",
            "--nproc",
            "2",
            "--runs-dir",
            str(runs),
            "--run-name",
            "ac",
            "--preset",
            "tiny",
            "--steps",
            "6",
            "--set",
            "train.activation_checkpointing=true",
            "--set",
            "train.grad_accum=2",
            "--set",
            "profile.wait=1",
            "--set",
            "profile.warmup=1",
            "--set",
            "profile.active=2",
            "--set",
            "train.warmup_steps=1",
        ],
        cwd=runs,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return runs / "ac"


def test_recompute_and_tokens_of_a_real_checkpointed_run(ac_run: Path) -> None:
    ra = analyze(ac_run)
    f = run_facts(ra)
    r = f.recompute
    assert r is not None and not r.reentrant and r.ranks == 2 and r.windows == 4
    # Per block the recompute reruns 5 matmul-like ops (qkv, SDPA, out projection, MLP up and down), two blocks,
    # two micro-batches per step; their fp32 outputs per micro-batch: 4 x 64 tokens x (3d + d + d + 4d + d), d = 64.
    assert r.flop_ops == 2 * 5 * 2 and r.shaped_ops == r.flop_ops
    assert r.out_bytes == 2 * 2 * 4 * 64 * (10 * 64) * 4
    assert 0 < r.flop_share <= r.share < 1
    # The trace's own estimate of the tokens (embedding ids, both micro-batches, both ranks) is run.json's.
    from analyzer.verbs.suggest.facts import trace_tokens, usable_windows, usable_workload

    tokens, source = trace_tokens(usable_workload(ra, usable_windows(ra.steps)))
    assert tokens == f.tokens_per_step == 2 * 2 * 4 * 64 and "aten::embedding input ids [4, 64]" in source


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/traces is absent")
def test_no_tokens_without_a_step_window_to_count_them_in() -> None:
    # The B200 eager sample embeds [888] ids but has no ProfilerStep window: no per-step estimate.
    rt = load_trace(SHARED / "tracelens-samples/b200/eager_trace.json.gz")
    assert rt.steps.empty and rank_workload(rt.events, rt.steps).empty
    assert run_facts(analyze(SHARED / "tracelens-samples/b200/eager_trace.json.gz")).tokens_per_step is None
