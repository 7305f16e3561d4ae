"""Shared presentation helpers: number formats, the run header, charts.

Formatting only: every number shown comes from an analyzer result. Where a
headline has one value per rank, the page shows the value or the range
(lowest to highest rank) rather than deriving a new statistic from them.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, TypeGuard

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from analyzer.api import RunAnalysis
from dashboard.data import Loaded, analysis
from dashboard.discover import RunEntry
from dashboard.text import plain

NA = "n/a"
PLOTLY_CONFIG = {"displaylogo": False}


def _finite(x: object) -> TypeGuard[float]:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(float(x))


def fmt_pct(fraction: float | None, digits: int = 1) -> str:
    """0.647 -> '64.7%'; None/NaN -> 'n/a'."""
    return f"{100.0 * float(fraction):.{digits}f}%" if _finite(fraction) else NA


def fmt_pct_points(pct: float | None, digits: int = 1) -> str:
    """A value already in percent (0..100): 12.34 -> '12.3%'."""
    return f"{float(pct):.{digits}f}%" if _finite(pct) else NA


def fmt_ms(ms: float | None) -> str:
    """Milliseconds with a precision that suits the size."""
    if not _finite(ms):
        return NA
    ms = float(ms)
    if abs(ms) >= 100:
        return f"{ms:.0f} ms"
    if abs(ms) >= 1:
        return f"{ms:.1f} ms"
    return f"{ms * 1e3:.0f} us"


def fmt_rate(per_s: float | None, unit: str = "tok/s") -> str:
    """1234.5 -> '1.23k tok/s'."""
    if not _finite(per_s):
        return NA
    v = float(per_s)
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{suffix} {unit}"
    return f"{v:.3g} {unit}"


def fmt_bytes(n: float | None) -> str:
    if not _finite(n):
        return NA
    v = float(n)
    for scale, suffix in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(v) >= scale:
            return f"{v / scale:.1f} {suffix}"
    return f"{v:.0f} B"


def fmt_flops(per_s: float | None) -> str:
    """1.64e10 -> '16.4 GFLOP/s'."""
    if not _finite(per_s):
        return NA
    v = float(per_s)
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {prefix}FLOP/s"
    return f"{v:.3g} FLOP/s"


def fmt_range(values: Iterable[float | None], fmt: Callable[[float | None], str]) -> str:
    """One value formatted, or 'low–high unit' over ranks; 'n/a' when none is known."""
    known = sorted(float(v) for v in values if _finite(v))
    if not known:
        return NA
    lo, hi = fmt(known[0]), fmt(known[-1])
    if lo == hi:
        return lo
    lo_num, _, lo_unit = lo.partition(" ")
    hi_num, _, hi_unit = hi.partition(" ")
    if lo_unit == hi_unit and lo_unit:
        return f"{lo_num}–{hi_num} {lo_unit}"
    if lo.endswith("%") and hi.endswith("%"):
        return f"{lo[:-1]}–{hi}"
    return f"{lo}–{hi}"


def run_header(run: RunEntry) -> Loaded:
    """Title, kind and the analysis of `run`; shows its errors and warnings.

    Returns the cached analysis; when it failed, the error is on the page
    and ``value`` is None.
    """
    st.title(plain(run.name))
    loaded = analysis(run)
    kind = "run directory" if run.kind == "reftrain" else "folder of profiler traces"
    st.caption(f"{kind} · {plain(str(run.path))}")
    if loaded.error:
        st.error(plain(loaded.error))
        return loaded
    ra = loaded.value
    assert ra is not None  # a Loaded without an error holds its value
    for err in ra.errors:
        st.error(plain(err))
    if ra.warnings:
        with st.expander(f"{len(ra.warnings)} warning(s) from the analyzer"):
            for w in ra.warnings:
                st.warning(plain(w))
    return loaded


def open_run() -> tuple[RunEntry, RunAnalysis] | None:
    """A run page's start: the run selected in the sidebar or URL, its header (:func:`run_header`) and its
    analysis; None when no run is selected or it could not be analyzed (the page says why)."""
    from dashboard import state

    run = state.selected_run(state.all_runs())
    if run is None:
        return None
    loaded = run_header(run)
    return None if loaded.value is None else (run, loaded.value)


def show_vega(spec: dict[str, Any], data: pd.DataFrame, key: str) -> None:
    """A small Vega-Lite chart at full width (Streamlit theme).

    The run page draws its few small charts with Vega-Lite rather than
    Plotly: in headless software-rendered Chromium, loading Plotly's 4.7 MB
    bundle costs about 2.5 CPU-seconds per page load, three Vega-Lite charts
    about 1.2 in all (docs/dashboard.md, "Performance"). Vega draws labels
    as SVG text, and its tooltip handler escapes HTML.
    """
    # The top-level "name" is Vega-Lite's own chart name; it also lets tests
    # find a chart (Streamlit gives a Vega-Lite element no id of its key).
    st.vega_lite_chart(data, {"name": key, **spec}, key=key)


def show_table(data: Any, **kwargs: Any) -> Any:
    """``st.dataframe`` with missing values shown as "n/a" (Streamlit's own default prints the literal "None");
    the cells keep their types, so numeric columns still sort as numbers. Returns what ``st.dataframe`` returns
    (the selection state when ``on_select`` is set)."""
    return st.dataframe(data, placeholder=NA, **kwargs)


def show_chart(fig: go.Figure, key: str | None = None) -> None:
    """A Plotly figure at full width, Streamlit theme, no Plotly logo."""
    fig.update_layout(margin=dict(l=10, r=10, t=40, b=10))
    st.plotly_chart(fig, config=PLOTLY_CONFIG, key=key)


# Up to this many ranks a page draws one bar, line or labelled heatmap row per rank; beyond it
# ranks become an axis (a heatmap), the slowest TOP_K a table, and any one rank a pick
# (docs/dashboard.md, "Many ranks").
FEW_RANKS = 16
TOP_K = 16
_MANY_RANKS_HEIGHT_PX = 720


def rank_axis(ranks: Iterable[int]) -> tuple[list[Any], int, dict[str, Any]]:
    """A heatmap's rank axis: y values, figure height (px) and y-axis settings.

    Few ranks: one labelled row each ("rank 3"), 40 px a row. Many: the rank
    ids as a numeric axis in a fixed height (1,024 rows in 720 px draw as one
    image; Plotly's zoom reaches single ranks), ticks chosen by Plotly.
    """
    ids = [int(r) for r in ranks]
    if len(ids) <= FEW_RANKS:
        return [f"rank {r}" for r in ids], 40 * len(ids), {}
    return ids, _MANY_RANKS_HEIGHT_PX, {"title": "rank"}
