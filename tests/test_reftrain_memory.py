"""reftrain's `profile.memory` switch: torch.profiler records [memory] events that the analyzer reads.
Three training steps of the tiny model on CPU (one profiler warm-up, two recorded),
in this process, through reftrain's own StepProfiler; the analyzer's peaks equal a plain JSON read
of the same trace."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from analyzer.api import analyze  # noqa: E402
from reftrain.config import Config, apply_set, from_dict, resolve  # noqa: E402
from reftrain.model import Transformer  # noqa: E402
from recorder.profiling import StepProfiler  # noqa: E402
from test_memory import _raw_memory_peaks  # noqa: E402


def _profiled_steps(cfg: Config, traces: Path) -> list[Path]:
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    idx = torch.randint(0, cfg.model.vocab_size, (2, cfg.model.seq_len))
    with StepProfiler(cfg.profile, 0, traces, torch.device("cpu"), start_step=0) as prof:
        for step in range(3):  # one warm-up step (traced, discarded), two recorded
            model(idx, idx).backward()
            prof.step_done(step)
    return sorted(traces.rglob("*.json.gz"))


def _config(*settings: str) -> Config:
    cfg = Config()
    for s in (
        "model.preset=tiny",
        "profile.wait=0",
        "profile.warmup=1",
        "profile.active=2",
        "profile.repeat=1",
        *settings,
    ):
        apply_set(cfg, s)
    return resolve(cfg)


def test_profile_memory_true_gives_memory_events_the_analyzer_reads(tmp_path: Path) -> None:
    (trace,) = _profiled_steps(_config("profile.memory=true"), tmp_path / "traces")
    a = analyze(trace, cache=False)
    m = a.memory
    assert m.source == "trace" and m.kind == "cpu"
    peaks = {r.device: (r.peak_allocated_bytes, r.peak_reserved_bytes, r.n_events) for r in m.trace_peaks.itertuples()}
    assert peaks == _raw_memory_peaks(trace)
    # The tiny model's activations alone are tens of kB: hundreds of allocations per step, a real peak.
    assert peaks["cpu"][2] > 100 and peaks["cpu"][0] > 10_000
    assert list(m.ranks["n_steps"]) == [2] and not m.timeline.empty


def test_profile_memory_off_records_none(tmp_path: Path) -> None:
    (trace,) = _profiled_steps(_config(), tmp_path / "traces")
    assert _raw_memory_peaks(trace) == {}
    assert analyze(trace, cache=False).memory.source is None


def test_the_old_key_profile_memory_still_loads() -> None:
    """A config.yaml saved before the rename (profile.profile_memory) still resumes."""
    assert from_dict({"profile": {"profile_memory": True}}).profile.memory is True
    cfg = Config()
    apply_set(cfg, "profile.profile_memory=true")
    assert cfg.profile.memory is True
