"""In-process tests of reftrain's parts: config, model size and FLOPs, peaks, data, schedules."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from reftrain import flops
from reftrain.config import (
    Config,
    ProfileConfig,
    apply_set,
    from_dict,
    load_file,
    reference_markdown,
    resolve,
    to_yaml,
)
from reftrain.data import SYNTHETIC_NOISE, SyntheticTokens, build_loader, check_batch
from reftrain.errors import ReftrainError
from reftrain.model import Transformer, block_parameter_count, parameter_counts
from recorder.profiling import StepProfiler
from reftrain.inject import Injector
from reftrain.train import lr_at

REPO = Path(__file__).resolve().parent.parent


def tiny(**sets: object) -> Config:
    cfg = Config()
    apply_set(cfg, "model.preset=tiny")
    for key, value in sets.items():
        apply_set(cfg, f"{key.replace('__', '.')}={value}")
    return resolve(cfg)


def test_the_model_takes_its_sizes_from_the_resolved_config() -> None:
    cfg = Config()
    apply_set(cfg, "model.preset=tiny")
    apply_set(cfg, "model.d_model=128")
    with pytest.raises(
        ReftrainError, match=r"model\.n_layers is not set \(resolve\(\) fills it from model\.preset=tiny\)"
    ):
        Transformer(cfg.model)
    model = Transformer(resolve(cfg).model)
    assert (model.cfg.d_model, model.cfg.n_layers, model.cfg.d_ff) == (128, 2, 512)  # d_ff = 4 * d_model (gelu)


# ---------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------


def test_config_round_trip_yaml_and_toml(tmp_path: Path) -> None:
    cfg = tiny(train__dtype="bf16", optim__lr="3e-4", parallel__strategy="fsdp", run__name="x")
    (tmp_path / "c.yaml").write_text(to_yaml(cfg))
    again = resolve(from_dict(load_file(tmp_path / "c.yaml")))
    assert again == cfg
    (tmp_path / "c.toml").write_text('[model]\npreset = "tiny"\nn_layers = 3\n[optim]\nlr = 1\n')
    t = resolve(from_dict(load_file(tmp_path / "c.toml")))
    assert (t.model.n_layers, t.model.d_model, t.optim.lr) == (3, 64, 1.0)
    assert isinstance(t.optim.lr, float)


def test_set_parses_yaml_values() -> None:
    cfg = Config()
    for s in (
        "optim.lr=2e-3",
        "train.compile=true",
        "inject.slowdown=2",
        "run.name=2024",
        "model.preset=1.3b",
        "data.path=null",
        "run.peak_flops=1e12",
    ):
        apply_set(cfg, s)
    assert cfg.optim.lr == 2e-3 and cfg.train.compile is True and cfg.inject.slowdown == 2.0
    assert cfg.run.name == "2024" and cfg.model.preset == "1.3b" and cfg.data.path is None
    assert cfg.run.peak_flops == 1e12


def test_explicit_sizes_override_the_preset() -> None:
    cfg = resolve(from_dict({"model": {"preset": "125m", "n_layers": 2, "mlp": "swiglu"}}))
    assert (cfg.model.n_layers, cfg.model.d_model, cfg.model.vocab_size) == (2, 768, 50304)
    assert cfg.model.d_ff == 2048  # 8/3 * 768 = 2048, already a multiple of 64


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("model.foo=1", "unknown config key 'model.foo'"),
        ("foo.bar=1", "unknown config section 'foo'"),
        ("train.dtype=fp16", "train.dtype='fp16' is not one of fp32, bf16"),
        ("train.steps=1.5", "train.steps=1.5 is not an integer"),
        ("profile.enabled=1", "profile.enabled=1 is not true or false"),
        ("train.steps", "expected section.key=value"),
    ],
)
def test_bad_assignments(assignment: str, message: str) -> None:
    with pytest.raises(ReftrainError, match=message.replace(".", r"\.").replace("(", r"\(")):
        apply_set(Config(), assignment)


def test_validation() -> None:
    with pytest.raises(ReftrainError, match="not divisible"):
        tiny(model__n_heads=5)
    with pytest.raises(ReftrainError, match="go together"):
        tiny(inject__slow_rank=1)
    with pytest.raises(ReftrainError, match="must be >= 1"):
        tiny(inject__slowdown=0.5)
    with pytest.raises(ReftrainError, match="ddp only"):
        tiny(parallel__strategy="fsdp", parallel__overlap_grad_sync="false")
    with pytest.raises(ReftrainError, match="world has 2 ranks"):
        resolve(from_dict({"inject": {"slow_rank": 2, "delay_ms": 1}}), world_size=2)


def test_docs_hold_the_generated_config_reference() -> None:
    """docs/reftrain.md embeds reference_markdown(): the docs cannot drift from the dataclasses."""
    assert reference_markdown() in (REPO / "docs" / "reftrain.md").read_text()


# ---------------------------------------------------------------------------
# Model size and FLOPs (hand-computed)
# ---------------------------------------------------------------------------


def test_tiny_parameter_count_and_flops() -> None:
    """tiny: L=2, d=64, H=4 (Q=16), T=64, V=512, GELU d_ff=256, tied embeddings.

    Block: 2 norms 2*64 + qkv 64*192 + proj 64*64 + fc 64*256 + proj 256*64 = 49280; two blocks 98560.
    N = blocks 98560 + final norm 64 + head/tied embedding 512*64 = 32768 -> 131392.
    Embedding (lookup only): positions 64*64 = 4096. Total 135488.
    FLOPs/token = 6*131392 + 12*2*4*16*64 = 788352 + 98304 = 886656.
    Hardware: + 2*2*4*16*64 = 16384 (attention backward recomputes QK^T) = 903040; with activation
    checkpointing + 2*(98560 - 2*256*64) + 4*2*4*16*64 = 131584 + 32768 more = 1067392 (the blocks'
    forward again, all but the MLP's output projection, F = 256).
    """
    cfg = tiny()
    model = Transformer(cfg.model)
    assert parameter_counts(model) == {"total": 135488, "non_embedding": 131392, "embedding": 4096}
    assert block_parameter_count(model) == 98560
    f = flops.flops_per_token(131392, 98560, 2, 4, 16, 64, 256, activation_checkpointing=False)
    assert (f.model, f.hardware) == (886656, 903040)
    f = flops.flops_per_token(131392, 98560, 2, 4, 16, 64, 256, activation_checkpointing=True)
    assert (f.model, f.hardware) == (886656, 1067392)


def test_swiglu_untied_parameter_count() -> None:
    """L=1, d=8, H=2, T=4, V=16, SwiGLU d_ff = 8*8/3 = 21 rounded up to 64, untied.

    Block: norms 16 + qkv 8*24 = 192 + proj 64 + gate 512 + up 512 + down 512 = 1808.
    Final norm 8, head 16*8 = 128 -> N = 1944. Lookup tables: tokens 128 + positions 32 = 160.
    FLOPs/token = 6*1944 + 12*1*2*4*4 = 11664 + 384 = 12048.
    """
    cfg = resolve(
        from_dict(
            {
                "model": {
                    "preset": "tiny",
                    "n_layers": 1,
                    "d_model": 8,
                    "n_heads": 2,
                    "seq_len": 4,
                    "vocab_size": 16,
                    "mlp": "swiglu",
                    "tie_embeddings": False,
                }
            }
        )
    )
    assert cfg.model.d_ff == 64
    model = Transformer(cfg.model)
    assert parameter_counts(model) == {"total": 2104, "non_embedding": 1944, "embedding": 160}
    assert flops.flops_per_token(1944, 1808, 1, 2, 4, 4, 64, False).model == 12048


def test_model_forward_is_a_causal_lm_loss() -> None:
    cfg = tiny()
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    x = torch.randint(0, 512, (2, 64))
    loss = model(x, torch.randint(0, 512, (2, 64)))
    assert abs(loss.item() - math.log(512)) < 0.1  # near-uniform predictions at init
    # Causality: changing the last token does not change the loss of earlier positions.
    x2 = x.clone()
    x2[:, -1] = (x2[:, -1] + 1) % 512
    y = torch.full_like(x, -100)
    y[:, :10] = x[:, 1:11]
    assert torch.allclose(model(x, y), model(x2, y))


def test_mfu_formula() -> None:
    # 1000 tokens x 1e6 FLOPs in 0.5 s on a 4e9 FLOP/s device = 2e9 / 4e9
    assert flops.mfu(1000, 10**6, 0.5, 4e9) == 0.5


@pytest.mark.parametrize(
    "name, dtype, expected",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4e12),
        ("NVIDIA H100 PCIe", "bf16", 756e12),
        ("NVIDIA H100 NVL", "tf32", 417.5e12),
        ("NVIDIA H200", "bf16", 989.4e12),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156e12),
        ("NVIDIA A100 80GB PCIe", "bf16", 312e12),
        ("NVIDIA B200", "bf16", 2250e12),
        ("AMD Instinct MI300X", "bf16", 1307.4e12),
        ("NVIDIA L4", "bf16", 121e12),
        ("NVIDIA L40S", "bf16", 362.05e12),
        ("NVIDIA A10G", "fp32", 31.2e12),
        ("Tesla V100-SXM2-16GB", "bf16", None),
        ("Some Future GPU", "bf16", None),
    ],
)
def test_peak_table(name: str, dtype: str, expected: float | None) -> None:
    peak = flops.table_peak(name, dtype)
    assert (peak.per_s if peak else None) == expected
    if peak:
        assert peak.source == "table" and peak.dtype == dtype


def test_peak_dtype() -> None:
    assert flops.peak_dtype("bf16", "cuda", True) == "bf16"
    assert flops.peak_dtype("fp32", "cuda", True) == "tf32"
    assert flops.peak_dtype("fp32", "cuda", False) == "fp32"
    assert flops.peak_dtype("fp32", "cpu", True) == "fp32"


def test_cpu_matmul_measurement_is_plausible() -> None:
    peak = flops.measure_matmul_peak("cpu", "fp32", max_size=256, repeats=2)
    assert peak.source == "measured" and peak.dtype == "fp32"
    assert re.match(r"cpu matmul (128|256)\^3 fp32, best of 2, \d+ threads?$", peak.detail), peak.detail
    assert 1e7 < peak.per_s < 1e14, (peak.per_s, peak.detail)


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


def batches(cfg: Config, rank: int, start_step: int, workers: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    apply_set(cfg, f"data.num_workers={workers}")
    return list(build_loader(cfg, rank, start_step, "cpu"))


def test_synthetic_stream_is_a_function_of_seed_rank_and_step() -> None:
    cfg = tiny(train__steps=4, train__grad_accum=2)
    in_process = batches(cfg, rank=1, start_step=0, workers=0)
    with_workers = batches(cfg, rank=1, start_step=0, workers=2)
    resumed = batches(cfg, rank=1, start_step=3, workers=0)
    assert len(in_process) == 8 and len(resumed) == 2  # steps x micro-batches
    for (x0, y0), (x1, y1) in zip(in_process, with_workers):
        assert torch.equal(x0, x1) and torch.equal(y0, y1)
    for (x0, _), (x1, _) in zip(in_process[6:], resumed):
        assert torch.equal(x0, x1)
    other_rank = batches(cfg, rank=0, start_step=0, workers=0)
    assert not torch.equal(other_rank[0][0], in_process[0][0])
    other_seed = batches(tiny(train__steps=4, train__grad_accum=2, train__seed=7), rank=1, start_step=0, workers=0)
    assert not torch.equal(other_seed[0][0], in_process[0][0])
    # The world size is not an input: rank r's micro-batch i is SyntheticTokens(seed, r, ...)[i].
    direct = SyntheticTokens(cfg.train.seed, 1, 4, 64, 512, length=8)
    assert torch.equal(direct[5][0], in_process[5][0])


def test_synthetic_tokens_follow_a_learnable_bigram() -> None:
    ds = SyntheticTokens(seed=3, rank=0, micro_batch_size=64, seq_len=64, vocab_size=512, length=1)
    x, y = ds[0]
    assert x.shape == y.shape == (64, 64) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    follows = (torch.from_numpy(ds.successor)[x] == y).float().mean().item()
    # Noise replaces a token with probability 0.1 (and lands on the successor 1/512 of the time).
    assert follows == pytest.approx(1 - SYNTHETIC_NOISE, abs=0.02)


def test_token_file_windows(tmp_path: Path) -> None:
    path = tmp_path / "tokens.bin"
    np.arange(0, 500, dtype=np.uint16).tofile(path)
    cfg = tiny(train__steps=2, data__path=str(path), model__vocab_size=512)
    (x, y), _ = batches(cfg, rank=0, start_step=0, workers=0)
    assert x.shape == (4, 64)
    assert torch.equal(y, x + 1)  # contiguous windows of 0, 1, 2, ...
    assert int(y.max()) < 500
    with pytest.raises(ReftrainError, match="token id 9 >= model.vocab_size=8"):
        check_batch(torch.tensor([[1, 9]]), 8, str(path))


def test_slow_data_source_sleeps() -> None:
    import time

    ds = SyntheticTokens(seed=0, rank=0, micro_batch_size=1, seq_len=8, vocab_size=16, length=1, delay_ms=30)
    start = time.perf_counter()
    ds[0]
    assert time.perf_counter() - start >= 0.03  # a lower bound: load can only lengthen a sleep


# ---------------------------------------------------------------------------
# Schedules
# ---------------------------------------------------------------------------


def test_profiler_schedule_counts_from_the_first_step(tmp_path: Path) -> None:
    cfg = ProfileConfig(enabled=True, wait=1, warmup=1, active=2, repeat=1)
    prof = StepProfiler(cfg, rank=0, traces_dir=tmp_path, device=torch.device("cpu"), start_step=10)
    assert [s for s in range(10, 20) if prof.collecting(s)] == [11, 12, 13]
    off = StepProfiler(ProfileConfig(enabled=False), 0, tmp_path, torch.device("cpu"), 0)
    assert not any(off.collecting(s) for s in range(10))


def test_lr_schedule() -> None:
    cfg = tiny(train__steps=10, optim__lr=1.0, optim__min_lr=0.1, optim__lr_warmup_steps=2)
    assert lr_at(0, cfg) == 0.5 and lr_at(1, cfg) == 1.0
    assert lr_at(2, cfg) == pytest.approx(1.0) and lr_at(9, cfg) == pytest.approx(0.1)
    assert lr_at(2, cfg) > lr_at(5, cfg) > lr_at(8, cfg)


def test_injected_slowdown_and_straggler_delay() -> None:
    import time

    def burn(ms: float) -> None:  # stands for compute: CPU work on this thread
        until = time.thread_time() + ms / 1e3
        while time.thread_time() < until:
            pass

    slow = Injector(tiny(inject__slowdown=3), rank=0, device=torch.device("cpu"))
    start = time.perf_counter()
    with slow.compute("backward"):
        burn(20)
    total_ms = (time.perf_counter() - start) * 1e3
    # Twice the block's own CPU time is injected, measured in CPU time too (time descheduled is
    # not CPU time): never less, the spin stops at its first turn past the target; past it by one
    # turn of a 32x32 matmul on one thread (0.1 ms worst seen beside load 6; 11 ms when the burn
    # used two intra-op threads, the defect this caught), so 25 % over 40 ms is generous, while
    # injecting F rather than F - 1 times the work would be 50 % over.
    assert slow.compute_cpu_ms >= 20
    assert 2 * slow.compute_cpu_ms <= slow.injected_cpu_ms <= 1.25 * 2 * slow.compute_cpu_ms
    # On the wall clock the injected work took at least its CPU time, and all of it is backward.
    assert slow.injected["backward"] >= slow.injected_cpu_ms and slow.injected["forward"] == 0
    assert total_ms >= slow.injected_ms + 20 >= 60
    for rank, expected in ((1, 30.0), (0, 0.0)):
        inj = Injector(tiny(inject__slow_rank=1, inject__delay_ms=30), rank=rank, device=torch.device("cpu"))
        inj.start_step()
        start = time.perf_counter()
        with inj.compute(first_forward=True):
            pass
        with inj.compute():  # backward and later micro-batches: no straggler delay
            pass
        # Measured: a busy wait to a deadline lasts at least the delay (load may only lengthen it).
        assert inj.injected_ms >= expected if expected else inj.injected_ms == 0
        assert inj.injected["forward"] == inj.injected_ms  # the straggler's delay belongs to the forward
        assert (time.perf_counter() - start) * 1e3 >= expected
