"""Whether two runs can be gated against each other, and what about them the explanation should note."""

from __future__ import annotations

from typing import TYPE_CHECKING

from analyzer.errors import AnalyzerError
from analyzer.ingest.formats import Inject, RunManifest

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis


def _model_identity(manifest: RunManifest) -> dict:
    return {
        "model": (manifest.config or {}).get("model"),
        "params": manifest.params.total if manifest.params else None,
        "flops_per_token": manifest.model_flops.per_token,
    }


def _describe_model(manifest: RunManifest) -> str:
    ident = _model_identity(manifest)
    model = ident["model"] or {}
    preset = model.get("preset", "?") if isinstance(model, dict) else "?"
    return f"preset {preset}, {ident['params']} parameters"


def check_compatible(base: "RunAnalysis", cand: "RunAnalysis") -> list[str]:
    """Raise AnalyzerError when the runs cannot be compared; return notes otherwise.

    Incompatible: one is a reftrain run directory and the other a trace
    folder (their step samples measure different things), or two run
    directories of different models (model config, parameter count or
    FLOPs per token differ). Differing world sizes or hardware are allowed
    (MFU is per device) and noted, as are trace folders whose FLOPs per
    step (from matmul shapes) differ by more than 1%.
    """
    if base.kind != cand.kind:
        what = {"reftrain": "a reftrain run directory", "traces": "a trace folder"}
        raise AnalyzerError(f"incompatible runs: the baseline is {what[base.kind]}, the candidate {what[cand.kind]}")
    notes: list[str] = []
    if base.kind == "reftrain":
        bm, cm = base.run_manifest, cand.run_manifest
        if _model_identity(bm) != _model_identity(cm):
            raise AnalyzerError(
                f"incompatible runs: different model (baseline {_describe_model(bm)}; candidate {_describe_model(cm)})"
            )
        bw, cw = bm.world_size, cm.world_size
        if bw != cw:
            notes.append(f"world sizes differ (baseline {bw}, candidate {cw}); MFU is per device")
        bh, ch = bm.hw.device_names, cm.hw.device_names
        if bh != ch:
            notes.append(f"hardware differs (baseline {bh}, candidate {ch})")
    else:
        # Trace folders carry no model identity; the FLOPs per step from the
        # matmul shapes are the closest thing to one.
        bf, cf = base.mfu.flops_per_step, cand.mfu.flops_per_step
        if bf and cf and abs(cf - bf) > 0.01 * bf:
            notes.append(
                f"FLOPs per step differ ({bf:.3g} vs {cf:.3g}): different workloads? MFU stays comparable, "
                "throughput would not"
            )
    return notes


def injected_notes(label: str, manifest: RunManifest) -> list[str]:
    """What reftrain injected into a run on purpose (run.json ``inject``), as notes for the explanation."""
    inject = manifest.inject or Inject()
    measured = inject.measured or {}
    out = []
    if inject.slowdown:
        factors = measured.get("compute_factor") or []
        got = f" (measured {', '.join(f'{f:.2f}' for f in factors)} per rank)" if factors else ""
        out.append(f"{label}: forward and backward slowed {inject.slowdown:g}x on purpose (--inject-slowdown){got}")
    if inject.slow_rank is not None and inject.delay_ms:
        ms = measured.get("injected_ms") or []
        got = f" (measured median {max(ms):.1f} ms per step)" if ms else ""
        out.append(
            f"{label}: rank {inject.slow_rank} delayed {inject.delay_ms:g} ms per step on purpose "
            f"(--inject-slow-rank){got}"
        )
    return out
