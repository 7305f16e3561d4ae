"""reftrain's model names its blocks, attention and MLP as module ranges; the analyzer's module tree shows
each block's forward and backward. A real torch.profiler trace of two training steps
of the tiny model on CPU, read by the analyzer."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from analyzer.api import analyze  # noqa: E402
from reftrain.config import Config, apply_set, resolve  # noqa: E402
from reftrain.model import Transformer  # noqa: E402


def test_module_tree_has_every_block_forward_and_backward(tmp_path: Path) -> None:
    cfg = Config()
    apply_set(cfg, "model.preset=tiny")
    cfg = resolve(cfg)
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    idx = torch.randint(0, cfg.model.vocab_size, (2, cfg.model.seq_len))
    trace = tmp_path / "rank0.pt.trace.json.gz"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            model(idx, idx).backward()
            prof.step()
    prof.export_chrome_trace(str(trace))
    mods = analyze(trace, cache=False).modules(0).set_index(["module", "backward"])
    for i in range(cfg.model.n_layers):
        for path in (f"blocks.{i}", f"blocks.{i}/attn", f"blocks.{i}/mlp"):
            for backward in (False, True):
                row = mods.loc[(path, backward)]
                assert row["calls"] >= 1 and row["host_ms"] > 0, (path, backward)
        # A block's time holds its attention's and MLP's.
        fwd = mods.xs(False, level="backward")
        assert (
            fwd.loc[f"blocks.{i}", "host_ms"]
            >= fwd.loc[f"blocks.{i}/attn", "host_ms"] + fwd.loc[f"blocks.{i}/mlp", "host_ms"]
        )
