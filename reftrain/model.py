"""A decoder-only transformer: pre-norm blocks, causal SDPA attention, GELU or SwiGLU MLP.

The model is plain: parallelism, activation checkpointing and compilation are
applied to it from outside (`reftrain.parallel`), block by block, through
`model.blocks`.

Profiler ranges: each block runs inside `record_function("nn.Module: blocks.N")`
and its attention and MLP inside `nn.Module: attn` / `nn.Module: mlp`, so a
trace attributes kernels to `blocks.N/attn` without the Python tracer
(`with_stack`); the analyzer reads ranges so named as modules (docs/metrics.md,
"Attribution"). Outside a profiler a range costs about a microsecond.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function

from reftrain.config import ModelConfig, ModelShape, model_shape


class Attention(nn.Module):
    """Multi-head causal self-attention through `scaled_dot_product_attention`."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        # (B, T, D) -> (B, H, T, Q)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class GeluMLP(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, d_ff, bias=False)
        self.proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class SwiGLU(nn.Module):
    """SwiGLU MLP (Shazeer 2020): proj(silu(x W_gate) * x W_up)."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelShape) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.d_model, bias=False)
        self.attn = Attention(cfg.d_model, cfg.n_heads)
        self.norm2 = nn.LayerNorm(cfg.d_model, bias=False)
        self.mlp = GeluMLP(cfg.d_model, cfg.d_ff) if cfg.mlp == "gelu" else SwiGLU(cfg.d_model, cfg.d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with record_function("nn.Module: attn"):
            x = x + self.attn(self.norm1(x))
        with record_function("nn.Module: mlp"):
            return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    """Token + learned position embeddings, `n_layers` blocks, final norm, LM head.

    `forward(idx, targets)` returns the mean next-token cross-entropy (fp32).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg = model_shape(config)
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model, bias=False)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.tok_emb.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 initialization: N(0, 0.02), residual output projections scaled by 1/sqrt(2L)."""
        residual_std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            if p.dim() < 2:
                nn.init.ones_(p)  # norm gains
            elif name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=residual_std)
            else:
                nn.init.normal_(p, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for i, block in enumerate(self.blocks):
            with record_function(f"nn.Module: blocks.{i}"):
                x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def parameter_counts(model: Transformer) -> dict[str, int]:
    """{"total", "non_embedding", "embedding"}: parameter counts, shared tensors once.

    `embedding` holds the parameters used only as lookup tables: the position
    embedding and, when untied, the token embedding. With tied embeddings the
    shared matrix also serves as the output projection, a matmul on every
    token, so it counts as non-embedding (docs/mfu.md, "N").
    """
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once
    embedding = model.pos_emb.weight.numel()
    if not model.cfg.tie_embeddings:
        embedding += model.tok_emb.weight.numel()
    return {"total": total, "non_embedding": total - embedding, "embedding": embedding}


def block_parameter_count(model: Transformer) -> int:
    """Parameters inside the transformer blocks (what activation checkpointing recomputes)."""
    return sum(p.numel() for p in model.blocks.parameters())
