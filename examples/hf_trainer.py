"""A Hugging Face Trainer run recorded with one callback: a tiny GPT-2 built from a config (no download).

    python examples/hf_trainer.py --runs-dir runs --steps 30
    torchrun --nproc-per-node 2 examples/hf_trainer.py --runs-dir runs --steps 30
    analyzer report runs/<the run>

The recorder lines are marked `# recorder`. No FLOP count is given: the
recorder counts the first step with torch's FlopCounterMode.
`include_num_input_tokens_seen=True` makes the Trainer count tokens, which
the recorder needs for tokens/s and MFU.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from recorder.integrations.huggingface import RecorderCallback  # recorder


class CountingSequences(torch.utils.data.Dataset):
    """Sequences from random starts where next token = token + 1: learnable in a few steps."""

    def __init__(self, n: int, seq_len: int, vocab: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.ids = (torch.randint(0, vocab, (n, 1), generator=gen) + torch.arange(seq_len)) % vocab

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}  # the model shifts the labels itself


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs-dir", required=True, help="folder the run directory is created in")
    p.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    p.add_argument("--name", help="run directory name (default: time, model class and world size)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per process per step (default 8)")
    args = p.parse_args()

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=512, n_positions=64, n_embd=128, n_layer=2, n_head=4)
    model = GPT2LMHeadModel(config)
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(
            output_dir=out,
            max_steps=args.steps,
            per_device_train_batch_size=args.batch_size,
            learning_rate=3e-3,
            use_cpu=True,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            dataloader_num_workers=0,
            include_num_input_tokens_seen=True,
        )
        callback = RecorderCallback(args.runs_dir, name=args.name)  # recorder
        data = CountingSequences(
            args.steps * args.batch_size * training.world_size, config.n_positions, config.vocab_size
        )
        trainer = Trainer(model=model, args=training, train_dataset=data, callbacks=[callback])  # recorder
        with callback.failing():  # recorder
            trainer.train()


if __name__ == "__main__":
    main()
