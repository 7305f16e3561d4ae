"""Ground truth for the FLOPs from trace shapes: CPU profiler traces of small models, made here, against
torch's FlopCounterMode counting the same training step.

Each model is built in this file and kept tiny (seconds per test). A step is profiled with
``record_shapes=True`` and ProfilerStep markers (``schedule``/``step``), written as a Kineto trace, and the
analyzer (which never imports torch) reads that file. The MFU's FLOPs (model: forward and backward) and the
HFU's (hardware: plus activation recompute) must be within 1 % of the counter's:

* model FLOPs: FlopCounterMode over a step of the model without checkpointing (same weights, same batch);
* hardware FLOPs: FlopCounterMode over a step of the model as profiled (it sees the recomputed forward).

FlopCounterMode has no formula for the CPU flash attention ops that SDPA takes on CPU
(``_scaled_dot_product_flash_attention_for_cpu`` and its backward); the counter here registers torch's own
SDPA formulas for them (``custom_mapping``), as docs/mfu.md says.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from torch.utils.checkpoint import checkpoint  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop, sdpa_flop  # noqa: E402

from analyzer.api import analyze  # noqa: E402

aten = torch.ops.aten
# torch's SDPA formulas, for the CPU flash ops FlopCounterMode has none for (their arguments start with the
# same query, key, value, and grad_out, query, key, value). The module's names are the registered, already
# shape-wrapped functions; custom_mapping wraps again, so it takes the formulas themselves.
CPU_FLASH = {
    aten._scaled_dot_product_flash_attention_for_cpu: sdpa_flop.__wrapped__,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: sdpa_backward_flop.__wrapped__,
}
TOLERANCE = 0.01


def counted_flops(model: nn.Module, batch: torch.Tensor) -> int:
    """FlopCounterMode's FLOPs of one forward and backward of ``model`` on ``batch``."""
    with FlopCounterMode(display=False, custom_mapping=CPU_FLASH) as counter:
        model(batch).float().square().mean().backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


def traced_step(model: nn.Module, batch: torch.Tensor, out: Path) -> Path:
    """A Kineto trace (CPU, record_shapes) of the second of two training steps, with ProfilerStep markers."""
    from torch.profiler import ProfilerActivity, profile, schedule

    out.mkdir(parents=True, exist_ok=True)
    trace = out / "rank0.pt.trace.json"
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: every step does the same arithmetic
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        schedule=schedule(wait=0, warmup=1, active=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(trace)),
    ) as prof:
        for _ in range(2):
            model(batch).float().square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    return trace


def analyzed_flops(trace: Path) -> tuple[float, float, dict]:
    """(model FLOPs, hardware FLOPs) of the trace's one profiled step, and the MFU's JSON."""
    mfu = analyze(trace, cache=False).mfu
    assert len(mfu.steps) == 1, mfu.to_json()
    row = mfu.steps.iloc[0]
    return float(row["flops"]), float(row["hardware_flops"]), mfu.to_json()


def assert_close(ours: float, truth: int, what: str) -> None:
    assert truth > 0
    assert abs(ours - truth) / truth < TOLERANCE, f"{what}: ours {ours:.6g}, FlopCounterMode {truth:.6g}"


# -- models ------------------------------------------------------------------------------------------------------


class ResBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.down = (
            None
            if stride == 1 and c_in == c_out
            else nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    """ResNet-style: a stem convolution with batch norm, two residual blocks (one strided), an fc head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.blocks = nn.Sequential(ResBlock(8, 8, 1), ResBlock(8, 16, 2))
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1).flatten(1))


class Block(nn.Module):
    """A pre-norm transformer block on F.scaled_dot_product_attention."""

    def __init__(self, d: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(d, dim=2)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """GPT-style decoder: token and position embeddings, causal blocks, a vocabulary head. ``checkpointing``:
    None, "reentrant" or "non-reentrant" (each block under torch.utils.checkpoint)."""

    def __init__(self, seq: int = 1024, d: int = 32, layers: int = 2, vocab: int = 64) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, 2, causal=True) for _ in range(layers))
        self.head = nn.Linear(d, vocab, bias=False)
        self.checkpointing: str | None = None

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            if self.checkpointing:
                x = checkpoint(block, x, use_reentrant=self.checkpointing == "reentrant")
            else:
                x = block(x)
        return self.head(x)


class ViT(nn.Module):
    """ViT-style: a patch-embedding convolution, a class token, bidirectional blocks, a class head."""

    def __init__(self, d: int = 32, patch: int = 8, image: int = 32) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, d, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.zeros(1, (image // patch) ** 2 + 1, d))
        self.blocks = nn.Sequential(Block(d, 2, causal=False), Block(d, 2, causal=False))
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patches(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.blocks(x)[:, 0])


# -- tests -------------------------------------------------------------------------------------------------------


def _check(model: nn.Module, batch: torch.Tensor, tmp_path: Path, truth_model: int | None = None) -> dict:
    truth_hw = counted_flops(model, batch)
    truth = truth_model if truth_model is not None else truth_hw
    model_flops, hw_flops, doc = analyzed_flops(traced_step(model, batch, tmp_path / "trace"))
    assert_close(model_flops, truth, "model FLOPs (MFU)")
    assert_close(hw_flops, truth_hw, "hardware FLOPs (HFU)")
    assert not doc["lower_bound"] and doc["flop_coverage"] == pytest.approx(1.0), doc
    return doc


def test_resnet_conv_backward_counted(tmp_path: Path) -> None:
    torch.manual_seed(0)
    doc = _check(ResNet(), torch.randn(2, 3, 16, 16), tmp_path)
    # Convolution backward is recorded (aten::convolution_backward), not estimated: the fc layer's recorded
    # backward matmul must not make the convolutions' backward "recorded" by proxy.
    assert doc["backward_families"] == {"gemm": "recorded", "conv": "recorded"}


def test_vit_patch_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    doc = _check(ViT(), torch.randn(2, 3, 32, 32), tmp_path)
    assert doc["backward_families"] == {"gemm": "recorded", "attention": "recorded", "conv": "recorded"}


def test_gpt_cpu_flash_attention_at_1024(tmp_path: Path) -> None:
    torch.manual_seed(0)
    doc = _check(GPT(), torch.randint(0, 64, (1, 1024)), tmp_path)
    assert doc["backward_families"]["attention"] == "recorded"
    # The CPU flash path is what ran (the formula FlopCounterMode lacks).
    events = json.loads((tmp_path / "trace" / "rank0.pt.trace.json").read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu_backward" in names


@pytest.mark.parametrize("mode", ["reentrant", "non-reentrant"])
def test_gpt_checkpointed_model_and_hardware_flops_apart(tmp_path: Path, mode: str) -> None:
    torch.manual_seed(0)
    gpt, batch = GPT(), torch.randint(0, 64, (1, 1024))
    model_truth = counted_flops(gpt, batch)
    gpt.checkpointing = mode
    doc = _check(gpt, batch, tmp_path, truth_model=model_truth)
    # The recomputed forward is every block's forward: hardware FLOPs exceed the model's by far more than noise.
    assert doc["hardware_flops_per_step"] > 1.2 * doc["flops_per_step"]


# torch.compile works on this CPU box (Inductor's C++ backend, gcc), but compiling forward and backward takes
# about 45 s of CPU time: slow, run with the slow tests.
@pytest.mark.slow
def test_compiled_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    gpt = GPT(seq=256, layers=1)
    batch = torch.randint(0, 64, (1, 256))
    truth = counted_flops(gpt, batch)  # eager: the compiled graph does the same products
    compiled = torch.compile(gpt)
    model_flops, hw_flops, doc = analyzed_flops(traced_step(compiled, batch, tmp_path / "trace"))
    assert_close(model_flops, truth, "model FLOPs (MFU), compiled")
    assert_close(hw_flops, truth, "hardware FLOPs (HFU), compiled")
    # Compiled graphs call the CPU flash kernel with no scaled_dot_product_attention around it: still counted,
    # backward included (inside CompiledFunctionBackward).
    assert doc["backward_families"]["attention"] == "recorded"
