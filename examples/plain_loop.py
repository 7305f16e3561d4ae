"""A plain PyTorch training loop recorded with the recorder: a small GPT on synthetic tokens.

    python examples/plain_loop.py --runs-dir runs --steps 30
    torchrun --nproc-per-node 2 examples/plain_loop.py --runs-dir runs --steps 30
    analyzer report runs/<the run>

The recorder lines are marked `# recorder`; everything else is an ordinary
loop. No FLOP count is given: the recorder counts the first step with
torch's FlopCounterMode (docs/record.md, "Model FLOPs").

`--slowdown F` makes every step do F times its own CPU work again (busy
elementwise work in the loop's thread after the optimizer step), a stand-in for a
regression: `analyzer check` fails such a run against runs without it
(docs/record.md, "Examples").
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import recorder  # recorder


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


class GPT(nn.Module):
    def __init__(
        self, vocab: int = 512, seq_len: int = 64, d_model: int = 128, n_layers: int = 2, n_heads: int = 4
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def batches(batch_size: int, seq_len: int, vocab: int, seed: int):
    """Counting sequences from random starts: next token = token + 1, learnable in a few steps."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        start = torch.randint(0, vocab, (batch_size, 1), generator=gen)
        seq = (start + torch.arange(seq_len + 1)) % vocab
        yield seq[:, :-1], seq[:, 1:]


def burn_cpu(seconds: float) -> None:
    """Busy elementwise work in this thread for `seconds` of its CPU time: load, not a sleep, and no
    matmul, so the model's FLOPs (counted on the first step) stay the same."""
    a = torch.full((32, 32), 0.5)
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        torch.sin(a, out=a)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs-dir", required=True, help="folder the run directory is created in")
    p.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    p.add_argument("--name", help="run directory name (default: time, model class and world size)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per rank per step (default 8)")
    p.add_argument(
        "--slowdown",
        type=float,
        default=0.0,
        metavar="F",
        help="after each step, busy work of F times the step's CPU time in this thread (0.25: 25 %% more)",
    )
    args = p.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    torch.manual_seed(0)
    model = GPT()
    seq_len, vocab = model.pos.num_embeddings, model.head.out_features
    ddp = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    config = {**vars(args), "world_size": world, "lr": 3e-3}
    data = batches(args.batch_size, seq_len, vocab, seed=rank)

    with recorder.open(
        args.runs_dir,
        name=args.name,
        config=config,
        model=ddp,
        optimizer=opt,  # recorder
        steps=args.steps,
    ) as rec:
        for _ in range(args.steps):
            x, y = next(data)
            with rec.step(tokens=x.numel()) as s:  # recorder
                cpu0 = time.thread_time()
                loss = ddp(x, y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                if args.slowdown:
                    burn_cpu(args.slowdown * (time.thread_time() - cpu0))
                s.loss = loss  # recorder
    if rank == 0:
        print(f"run directory: {rec.run_dir}")
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
