"""``analyzer whatif``'s text: the predicted step, MFU and critical path next to the measured ones."""

from __future__ import annotations

from typing import TYPE_CHECKING

from analyzer.render.format import num, pct, short_kernel_name
from analyzer.verbs.printable import printable

if TYPE_CHECKING:
    from analyzer.verbs.whatif import WhatIfResult


def whatif_text(result: "WhatIfResult") -> str:
    """The run's measured and predicted step and MFU, then per profiled step the new critical path."""
    out = [f"What if: {'; '.join(result.changes) or 'no change'}  ({result.path})"]
    if not result.steps:
        out += [f"  note: {n}" for n in result.notes]
        return printable("\n".join(out) + "\n")
    speed = result.speedup
    out.append(
        f"  step time   {num(result.measured_step_ms, '.2f')} ms measured -> {num(result.predicted_step_ms, '.2f')} ms "
        f"predicted (median over {len(result.steps)} profiled step(s) of the slowest rank)"
    )
    if result.work_ratio != 1.0:
        out.append(f"  work/step   {result.work_ratio:g}x (larger micro-batch)")
    out.append(f"  throughput  {num(None if speed is None else speed - 1.0, '+.1%')}")
    out.append(f"  MFU         {pct(result.mfu_before, 2)} measured -> {pct(result.mfu_after, 2)} predicted")
    err = result.unchanged_error
    out.append(f"  model check the unchanged replay is within {pct(err, 2)} of every measured step")
    for s in result.steps:
        out.append(
            f"\n  step {s.step}: {s.job_measured_ms:.2f} -> {s.job_predicted_ms:.2f} ms; critical path on rank "
            f"{s.rank_on_path}, by what bounds it (before -> after):"
        )
        for cat, after in s.breakdown_after_pct.items():
            before = s.breakdown_before_pct.get(cat, 0.0)
            if before or after:
                out.append(f"    {cat:28s} {before:5.1f}% -> {after:5.1f}%")
        if s.path_ops:
            out.append("    on the new path:")
            for o in s.path_ops:
                out.append(f"      {o.ms_on_path:9.3f} ms {o.pct:5.1f}%  {o.kind:8s} {short_kernel_name(o.name, 60)}")
    out += [f"  note: {n}" for n in result.notes]
    return printable("\n".join(out) + "\n")
