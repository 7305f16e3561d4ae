"""The GPU acceptance check's CPU dry run (bench/gpu_check.py --dry-run): three one-rank reftrain runs
(DDP, FSDP2 bf16, torch.compile), their traces and reports, and three FLOP counts per step.

The figures are exact for the ``tiny`` preset (L=2, d=64, H=4, T=64, vocab 512 tied, 2 x 64 tokens a
step): matmul weights 131,072 (6 FLOPs per token each), attention 4*H*Q*T = 16,384 FLOPs per token per
layer forward. About a minute on the development VM."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

TOKENS = 2 * 64
MATMUL = 6 * 131_072  # per token
ATTENTION_FWD = 2 * 16_384  # per token, both layers


def _bench():
    spec = importlib.util.spec_from_file_location("gpu_check_bench", REPO / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def summary(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu_check") / "out"
    rc = _bench().main(["--dry-run", "--out", str(out)])
    result = json.loads((out / "gpu_check.json").read_text())
    result["rc"] = rc
    return result


def test_dry_run_runs_every_case_and_reports(summary) -> None:
    assert summary["schema"] == "bench.gpu_check/1" and summary["dry_run"] is True and summary["device"] == "cpu"
    cases = {c["name"]: c for c in summary["cases"]}
    assert list(cases) == ["ddp", "fsdp2-bf16", "compile"]
    for name, c in cases.items():
        assert c["reftrain_rc"] == 0 and c["report_rc"] == 0, name
        assert Path(c["run_dir"], "report.json").is_file(), name
        assert c["n_host_ops"] > 0 and c["n_kernels"] == 0, name  # a CPU run: host ops, no kernels
        assert c["telemetry_note"].startswith("CPU run: no GPU to sample"), name  # the recorder's CPU note
        # The report's MFU is the manifest's, over the steady steps after the profiler window.
        assert c["mfu"]["source"] == "manifest" and c["mfu"]["median"] > 0, name


def test_dry_run_manifest_flops_match_flop_counter(summary) -> None:
    """FlopCounterMode (with the CPU flash-attention formulas it lacks) counts attention's backward as
    2.5x the forward, PaLM's formula in the manifest as 2x: converted, they differ only by the 320
    norm and bias parameters that 6N counts as matmul weights (6 x 320 / 884,736 = +0.217 %)."""
    for c in summary["cases"]:
        f = c["flops_per_step"]
        assert f["flop_counter"] == TOKENS * (MATMUL + 3.5 * ATTENTION_FWD), c["name"]
        assert f["flop_counter_palm_attention"] == TOKENS * (MATMUL + 3 * ATTENTION_FWD), c["name"]
        assert f["manifest"] == TOKENS * 886_656, c["name"]
        assert c["rel_diff_vs_flop_counter"]["manifest"] == pytest.approx(6 * 320 / 884_736, rel=1e-9), c["name"]
        assert c["checks"]["manifest FLOPs within 1 % of FlopCounterMode"], c["name"]


def test_dry_run_trace_shape_flops_match_flop_counter(summary) -> None:
    """The acceptance bound on the analyzer's count from trace shapes: within 1 % of FlopCounterMode on
    every case. Needs the FLOP table to count SDPA's CPU flash kernels, forward and backward, also
    inside a compiled region (docs/mfu.md)."""
    bad = {
        c["name"]: c["rel_diff_vs_flop_counter"]["trace_shapes"]
        for c in summary["cases"]
        if not c["checks"]["trace_shapes FLOPs within 1 % of FlopCounterMode"]
    }
    assert bad == {}
    assert summary["ok"] and summary["rc"] == 0
