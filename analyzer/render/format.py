"""The formatters every renderer uses: numbers, percentages, kernel names, gated values, delta rows.

One function per job, so that the text report, the Markdown summary, the
HTML pages, the JUnit file and the notebook views print the same figure the
same way. A missing or non-finite number prints as ``-`` everywhere.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

from analyzer.verbs.printable import printable

if TYPE_CHECKING:
    from analyzer.verbs.compare import Comparison, Delta
    from analyzer.verbs.suggest.engine import Suggestion

MISSING = "-"
KERNEL_NAME_WIDTH = 72


def num(value: Any, fmt: str = ".1f", none: str = MISSING) -> str:
    """``value`` formatted with ``fmt``; ``none`` when it is None, NaN or infinite; text that is no number as it is."""
    if value is None:
        return none
    try:
        x = float(value)
    except (TypeError, ValueError):
        return str(value)
    return none if not math.isfinite(x) else format(x, fmt)


def pct(fraction: float | None, digits: int = 1) -> str:
    """A fraction (0..1) as a percentage with ``digits`` decimals (``0.4551`` -> ``45.5%``); ``-`` when missing."""
    text = num(None if fraction is None else 100.0 * fraction, f".{digits}f")
    return text if text == MISSING else text + "%"


def mib(value: Any) -> str:
    """Bytes as MiB with a thousands separator (``1,024.0``); ``-`` when missing."""
    return num(None if value is None else float(value) / 2**20, ",.1f")


def short_kernel_name(name: str, width: int = KERNEL_NAME_WIDTH) -> str:
    """A kernel or op name a table or a sentence can show, at most ``width`` characters.

    Drops a leading ``void``, ``(anonymous namespace)::`` and the parameter
    list of a C++ signature (``foo<float>(int, float*)`` becomes
    ``foo<float>``; ``Memcpy HtoD (Pinned -> Device)`` is not a signature
    and stays), then elides the middle (``…``) so that both the start and the
    distinguishing template arguments at the end remain. Control characters
    are escaped (:func:`~analyzer.verbs.printable.printable`).
    """
    text = printable(name.strip(), one_line=True)
    if text.startswith("void "):
        text = text[5:]
    text = text.replace("(anonymous namespace)::", "")
    if text.endswith(")"):
        depth = 0
        for i in range(len(text) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(text[i], 0)
            if depth == 0:
                if i > 0 and not text[i - 1].isspace():
                    text = text[:i]
                break
    if len(text) <= width:
        return text
    head = (width - 1) * 3 // 5
    return text[:head] + "…" + text[len(text) - (width - 1 - head) :]


def value_text(metric: str, value: float | None) -> str:
    """A gated value of ``analyzer check`` in its unit: MFU as %, tokens/s, steps/s or steps per CPU second."""
    if value is None or not math.isfinite(value):
        return MISSING
    if metric == "mfu":
        return f"{100 * value:.2f}%"
    if metric == "tokens_per_s":
        return f"{value:,.0f} tokens/s"
    if metric == "cpu_steps_per_s":
        return f"{value:.2f} steps/CPU-s"
    return f"{value:.3f} steps/s"


def points_change(base: float | None, cand: float | None, digits: int = 2) -> str:
    """The change between two fractions in signed percentage points, computed from the values
    as displayed (each a percent rounded to ``digits`` decimals), so that it agrees with the
    two figures printed beside it: ``45.52% -> 44.10%`` gives ``-1.42``; ``-`` when either is missing."""
    if base is None or cand is None or not (math.isfinite(base) and math.isfinite(cand)):
        return MISSING
    change = round(round(100 * cand, digits) - round(100 * base, digits), digits)
    return f"{change + 0.0:+.{digits}f}"  # + 0.0 turns -0.0 into 0.0: no "-0.00"


def delta_rows(deltas: Sequence["Delta"], fmt: str = ".2f", kernel: bool = False) -> list[list[str]]:
    """Table rows of a comparison's deltas: name (and kind or pass), base, cand, delta, delta %
    (``new`` for a row the baseline lacks)."""
    rows = []
    for d in deltas:
        name = short_kernel_name(d.name) if kernel else d.name
        change = "new" if d.delta_pct is None and d.delta else num(d.delta_pct, "+.1f")
        rows.append(
            [name]
            + ([d.kind or MISSING] if kernel else [])
            + [num(d.base, fmt), num(d.cand, fmt), num(d.delta, "+" + fmt), change]
        )
    return rows


def growth_text(c: "Comparison") -> str:
    """``; growth of the peak +12.5%`` when the comparison has a peak memory growth, else ``""``."""
    return f"; growth of the peak {num(100 * c.memory_growth, '+.1f')}%" if c.memory_growth is not None else ""


def evidence_value(value: Any) -> str:
    """A suggestion's evidence value: booleans lower-case, floats to 3 significant places (``-`` when missing)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.3f}".rstrip("0").rstrip(".") if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def prediction_text(s: "Suggestion") -> str:
    """``step 76.4 -> 28.1 ms, tokens/s 1.68k -> 4.56k, MFU 5.4% -> 14.6% (+172%)``."""
    p = s.predicted
    if p is None:
        return "no prediction"
    parts = [f"step {p.step_time_ms_before:.1f} -> {p.step_time_ms_after:.1f} ms"]
    if p.tokens_per_step_before and p.tokens_per_step_after and p.tokens_per_step_after != p.tokens_per_step_before:
        parts.append(f"tokens/step {p.tokens_per_step_before:.0f} -> {p.tokens_per_step_after:.0f}")
    elif not p.tokens_per_step_before and p.work_ratio != 1.0:
        parts.append(f"{p.work_ratio:g}x the work per step")
    if p.tokens_per_s_before is not None and p.tokens_per_s_after is not None:
        parts.append(f"tokens/s {p.tokens_per_s_before:,.0f} -> {p.tokens_per_s_after:,.0f}")
    if p.mfu_before is not None and p.mfu_after is not None:
        parts.append(f"MFU {100 * p.mfu_before:.1f}% -> {100 * p.mfu_after:.1f}%")
    text = ", ".join(parts) + f" ({p.gain:+.0%} throughput"
    return text + (", run wall time)" if p.scope != "steady-state step" else ")")


def coverage_text(cov: dict[str, Any]) -> str:
    """``windows 5/5, ranks 1/8, FLOPs 97%; capped: 1 of 8 ranks traced ...``."""
    parts = []
    if cov.get("windows_total"):
        parts.append(f"windows {cov['windows_used']}/{cov['windows_total']}")
    if cov.get("ranks_in_job"):
        parts.append(f"ranks {cov.get('ranks_traced', 0)}/{cov['ranks_in_job']}")
    if cov.get("flop_coverage") is not None:
        parts.append(f"FLOPs known for {cov['flop_coverage']:.0%} of compute")
    text = ", ".join(parts) or "-"
    if cov.get("limits"):
        text += "; confidence capped: " + "; ".join(cov["limits"])
    return text
