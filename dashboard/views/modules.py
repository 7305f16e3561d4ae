"""Modules: the nn.Module tree's inclusive time as an icicle, forward and
backward apart, with the analyzer's module table beside it.

Presentation only: each bar's width is the analyzer's inclusive time of a
module path (``RunAnalysis.attribution.modules``: device time, or host time
where a run has no device kernels); the icicle only places the bars, each
child from its parent's left edge in path order, one row per depth.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard.views.operators import attribution_table, rank_options, scope_rank
from dashboard.ui import open_run, show_table, show_vega

SCOPE_KEY = "modules_scope"
DEPTH_KEY = "modules_depth"
MEASURE_KEY = "modules_measure"
MEASURES = {"device time": "device_ms", "host time": "host_ms"}
TABLE_COLUMNS = {
    "module": "module",
    "direction": "direction",
    "device_ms": "device ms (inclusive)",
    "share_of_step_pct": "% of step",
    "device_self_ms": "device ms (self)",
    "host_ms": "host ms",
    "calls": "calls",
    "depth": "depth",
}


def icicle_rows(modules: pd.DataFrame, value: str, max_depth: int) -> pd.DataFrame:
    """Bars of the icicle for one direction: x0/x1 in the value's unit, one row per depth.

    A root starts where the previous root ends; a child starts at its parent's
    x0 plus the widths of its earlier siblings (paths in name order). Rows
    deeper than `max_depth`, and rows whose value is zero, are not drawn.
    """
    rows = modules.loc[modules["depth"] <= max_depth].sort_values("module", kind="stable")
    left: dict[str, float] = {}
    next_free: dict[str, float] = {}
    out = []
    for r in rows.to_dict("records"):
        path = str(r["module"])
        width = float(r[value])
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        if parent and parent not in left:
            continue  # a parent not drawn (zero time): its subtree has no place either
        x0 = next_free.get(parent, left.get(parent, 0.0))
        next_free[parent] = x0 + width
        if width <= 0:
            continue
        left[path] = x0
        out.append(
            {
                "module": path,
                "name": path.rsplit("/", 1)[-1],
                "depth": int(r["depth"]),
                "depth_end": int(r["depth"]) + 1,
                "x0": x0,
                "x1": x0 + width,
                "value_ms": width,
                "top": path.split("/")[min(1, int(r["depth"]))],
                "calls": int(r["calls"]),
                "device_ms": float(r["device_ms"]),
                "device_self_ms": float(r["device_self_ms"]),
                "host_ms": float(r["host_ms"]),
                "share_of_step_pct": float(r["share_of_step_pct"]) if "share_of_step_pct" in modules.columns else None,
            }
        )
    return pd.DataFrame(
        out,
        columns=[
            "module",
            "name",
            "depth",
            "depth_end",
            "x0",
            "x1",
            "value_ms",
            "top",
            "calls",
            "device_ms",
            "device_self_ms",
            "host_ms",
            "share_of_step_pct",
        ],
    )


def icicle_spec(measure: str, n_depths: int) -> dict[str, Any]:
    return {
        # Streamlit fits the whole chart (axes included) into this height: 48 px a level plus the x axis.
        "height": 48 * n_depths + 70,
        "layer": [
            {
                "mark": {"type": "rect", "stroke": "white", "strokeWidth": 1},
                "encoding": {
                    "x": {"field": "x0", "type": "quantitative", "title": f"{measure} (ms)"},
                    "x2": {"field": "x1"},
                    "y": {
                        "field": "depth",
                        "type": "quantitative",
                        "scale": {"reverse": True, "domain": [0, n_depths]},
                        "title": "depth",
                        "axis": {"tickMinStep": 1},
                    },
                    "y2": {"field": "depth_end"},
                    "color": {"field": "top", "type": "nominal", "title": "module", "legend": None},
                    "tooltip": [
                        {"field": "module", "type": "nominal"},
                        {
                            "field": "device_ms",
                            "type": "quantitative",
                            "title": "device ms (inclusive)",
                            "format": ".3f",
                        },
                        {
                            "field": "device_self_ms",
                            "type": "quantitative",
                            "title": "device ms (self)",
                            "format": ".3f",
                        },
                        {"field": "host_ms", "type": "quantitative", "title": "host ms", "format": ".3f"},
                        {"field": "share_of_step_pct", "type": "quantitative", "title": "% of step", "format": ".2f"},
                        {"field": "calls", "type": "quantitative"},
                    ],
                },
            },
            {
                "mark": {
                    "type": "text",
                    "align": "left",
                    "baseline": "middle",
                    "dx": 3,
                    "limit": 160,
                    "color": "white",
                },
                "transform": [{"calculate": "(datum.depth + datum.depth_end) / 2", "as": "mid"}],
                "encoding": {
                    "x": {"field": "x0", "type": "quantitative"},
                    "y": {"field": "mid", "type": "quantitative"},
                    "text": {"field": "name"},
                },
            },
        ],
    }


def render() -> None:
    opened = open_run()
    if opened is None:
        return
    _, ra = opened
    st.header("Modules")
    if ra.attribution is None or ra.attribution.totals.empty:
        st.info("No attribution tables for this run: no rank's trace could be analyzed.")
        return
    rank = scope_rank(
        st.selectbox("Ranks", rank_options(ra), key=SCOPE_KEY, help="every rank's module tree summed, or one rank's")
    )
    modules = attribution_table(ra, "modules", rank)
    if modules.empty:
        st.info(
            "No nn.Module ranges in these traces: profile with with_modules=True (or with_stack=True), or wrap "
            "modules in record_function('nn.Module: NAME') as reftrain does."
        )
        return
    has_device = float(modules["device_ms"].sum()) > 0
    left, right = st.columns([1, 1])
    measure = left.radio(
        "Width",
        list(MEASURES),
        key=MEASURE_KEY,
        horizontal=True,
        index=0 if has_device else 1,
        help="inclusive device time of the kernels attributed to the module, or the host time of its calls",
    )
    if not has_device:
        st.caption(
            "No device kernels in these traces (a CPU run): host time (the wall time of the module's calls) "
            "is the only measure; the table leaves the device columns out."
        )
    deepest = int(modules["depth"].max())
    depth = right.slider("Deepest level", 0, deepest, min(deepest, 3), key=DEPTH_KEY) if deepest > 0 else 0
    value = MEASURES[measure]
    chart, table = st.columns([3, 2])
    with chart:
        for backward, direction in ((False, "forward"), (True, "backward")):
            bars = icicle_rows(modules.loc[modules["backward"].astype(bool) == backward], value, depth)
            if bars.empty:
                st.caption(f"No {direction} {measure} in any module.")
                continue
            st.markdown(f"**{direction.capitalize()}**: inclusive {measure}")
            show_vega(icicle_spec(measure, depth + 1), bars, key=f"modules_{direction}")
    with table:
        shown = modules.loc[modules["depth"] <= depth].copy()
        shown.insert(1, "direction", ["backward" if b else "forward" for b in shown["backward"].astype(bool)])
        shown = shown.sort_values(value, ascending=False, kind="stable")
        shown = shown[[c for c in TABLE_COLUMNS if c in shown.columns]].rename(columns=TABLE_COLUMNS)
        if not has_device:  # every device figure is 0 on a CPU run: a column of 0.000 would read as measured
            shown = shown.drop(columns=["device ms (inclusive)", "device ms (self)", "% of step"], errors="ignore")
        show_table(
            shown,
            hide_index=True,
            key="modules_table",
            column_config={
                c: st.column_config.NumberColumn(c, format="%.3f")
                for c in ("device ms (inclusive)", "device ms (self)", "host ms", "% of step")
                if c in shown.columns
            },
        )
    st.caption(
        "Each bar: a module path (nn.Module ranges nested as the trace records them); its width the inclusive "
        "time of the module, its children below it. Backward: the kernels of the autograd nodes whose forward "
        'op ran inside the module (docs/metrics.md, "Attribution").'
    )


if __name__ == "__main__":
    render()
