"""A PyTorch Lightning fit recorded with one callback: a small GPT on synthetic tokens.

    python examples/lightning_trainer.py --runs-dir runs --steps 30
    python examples/lightning_trainer.py --runs-dir runs --steps 30 --devices 2   # DDP on gloo, 2 processes
    analyzer report runs/<the run>

The recorder line is marked `# recorder`. No FLOP count is given: the
recorder counts the first step with torch's FlopCounterMode.
"""

from __future__ import annotations

import argparse

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from recorder.integrations.lightning import RecorderCallback  # recorder


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.n_heads, -1).transpose(1, 2) for z in self.qkv(self.norm1(x)).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp(self.norm2(x))


class GPT(pl.LightningModule):
    def __init__(
        self,
        vocab: int = 512,
        seq_len: int = 64,
        d_model: int = 128,
        n_layers: int = 2,
        n_heads: int = 4,
        lr: float = 3e-3,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def counting_sequences(n: int, seq_len: int, vocab: int) -> TensorDataset:
    """Sequences from random starts where next token = token + 1: learnable in a few steps."""
    gen = torch.Generator().manual_seed(0)
    seq = (torch.randint(0, vocab, (n, 1), generator=gen) + torch.arange(seq_len + 1)) % vocab
    return TensorDataset(seq[:, :-1], seq[:, 1:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs-dir", required=True, help="folder the run directory is created in")
    p.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    p.add_argument("--name", help="run directory name (default: time, model class and world size)")
    p.add_argument("--devices", type=int, default=1, help="CPU processes; 2 or more train with DDP on gloo")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per process per step (default 8)")
    args = p.parse_args()

    pl.seed_everything(0, verbose=False)
    model = GPT()
    data = DataLoader(
        counting_sequences(args.steps * args.batch_size * args.devices, model.hparams.seq_len, model.hparams.vocab),
        batch_size=args.batch_size,
        shuffle=True,
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[RecorderCallback(args.runs_dir, tokens=lambda batch: batch[0].numel(), name=args.name)],  # recorder
    )
    trainer.fit(model, data)


if __name__ == "__main__":
    main()
