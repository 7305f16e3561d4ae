"""recorder.integrations: the Lightning and Hugging Face callbacks map steps, tokens and failures.

In-process fits of a one-layer model, without profiler windows (tests/test_examples.py runs the
full examples, with traces and several processes).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from recorder import ProfileSchedule  # noqa: E402

BATCH, SEQ, VOCAB = 4, 8, 32


def _manifest(runs: Path) -> dict:
    (run,) = runs.iterdir()
    return json.loads((run / "run.json").read_text())


def _metrics(runs: Path) -> list[dict]:
    (run,) = runs.iterdir()
    return [json.loads(line) for line in (run / "metrics/rank0.jsonl").read_text().splitlines()]


def _lightning_fit(runs: Path, fail_at: int | None = None, accumulate: int = 1, steps: int = 3) -> None:
    pl = pytest.importorskip("lightning.pytorch", reason="pip install 'trainperf[integrations]'")
    from recorder.integrations.lightning import RecorderCallback

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(VOCAB, 16)
            self.out = torch.nn.Linear(16, VOCAB)

        def training_step(self, batch, batch_idx):
            if batch_idx == fail_at:
                raise ValueError(f"bad batch {batch_idx}")
            x, y = batch
            return torch.nn.functional.cross_entropy(self.out(self.emb(x)).view(-1, VOCAB), y.view(-1))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    x = torch.randint(0, VOCAB, (BATCH * accumulate * steps, SEQ))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x), batch_size=BATCH)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        accumulate_grad_batches=accumulate,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            RecorderCallback(
                runs, tokens=lambda b: b[0].numel(), warmup_steps=0, profile=ProfileSchedule(enabled=False)
            )
        ],
    )
    trainer.fit(Tiny(), data)


def test_lightning_one_record_per_optimizer_step_with_the_accumulated_tokens(tmp_path):
    _lightning_fit(tmp_path, accumulate=2, steps=3)
    metrics = _metrics(tmp_path)
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert [m["tokens"] for m in metrics] == [2 * BATCH * SEQ] * 3  # two batches per optimizer step
    manifest = _manifest(tmp_path)
    assert manifest["status"] == "completed" and manifest["tokens_per_step"] == 2 * BATCH * SEQ
    # measured on the first step, both batches: the output layer's forward and its weight and input
    # gradients (the embedding needs the latter; its lookup has no FLOPs)
    assert manifest["flops"]["measured"]["model"] == 3 * (2 * BATCH * SEQ * 16 * VOCAB) * 2


def test_lightning_exception_fails_the_run_with_its_error(tmp_path):
    with pytest.raises(ValueError, match="bad batch 2"):
        _lightning_fit(tmp_path, fail_at=2, steps=4)
    manifest = _manifest(tmp_path)
    assert manifest["status"] == "failed" and "ValueError: bad batch 2" in manifest["error"]
    assert [m["step"] for m in _metrics(tmp_path)] == [0, 1]  # the steps before it are kept


def test_hugging_face_failing_marks_the_run_failed(tmp_path):
    transformers = pytest.importorskip("transformers", reason="pip install 'trainperf[integrations]'")
    from recorder.integrations.huggingface import RecorderCallback

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.out = torch.nn.Linear(SEQ, SEQ)
            self.calls = 0

        def forward(self, input_ids, labels):
            self.calls += 1
            if self.calls == 3:
                raise ValueError("bad batch 3")
            loss = ((self.out(input_ids.float()) - labels.float()) ** 2).mean()
            return transformers.modeling_outputs.CausalLMOutput(loss=loss)

    x = torch.randint(0, VOCAB, (BATCH * 4, SEQ))
    data = [{"input_ids": row, "labels": row} for row in x]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=4,
        per_device_train_batch_size=BATCH,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        include_num_input_tokens_seen=True,
    )
    runs = tmp_path / "runs"
    callback = RecorderCallback(runs, warmup_steps=0, profile=ProfileSchedule(enabled=False))
    trainer = transformers.Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=[callback])
    with pytest.raises(ValueError, match="bad batch 3"), callback.failing():
        trainer.train()
    manifest = _manifest(runs)
    assert manifest["status"] == "failed" and "ValueError: bad batch 3" in manifest["error"]
    metrics = _metrics(runs)
    assert [m["step"] for m in metrics] == [0, 1]
    assert [m["tokens"] for m in metrics] == [BATCH * SEQ] * 2  # the Trainer's token count
    assert all(m["loss"] > 0 for m in metrics)  # the model outputs' loss
