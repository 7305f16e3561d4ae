"""History: MFU, step time and tokens/s of every reftrain run in order
(analyzer.history), the CI gate's verdict between consecutive runs and the
change points; picking two runs opens Compare on them."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import state
from dashboard.data import history
from dashboard.text import plain
from dashboard.ui import show_table, show_vega

METRICS = {
    "mfu": ("MFU", ".1%"),
    "step_time_ms": ("step time (ms)", ".1f"),
    "tokens_per_s": ("tokens/s", ".1f"),
    "goodput": ("goodput", ".1%"),
}


# One x position per run, labelled with its name, in the history's order (the runs' names sort otherwise).
X_RUN = {
    "field": "run",
    "type": "ordinal",
    "title": "run",
    "sort": {"field": "order"},
    "axis": {"labelAngle": -40, "labelLimit": 160},
}


def render() -> None:
    st.title("History")
    runs = state.all_runs()
    left, right = st.columns([1, 1])
    by = left.radio(
        "Order", ["time", "commit"], horizontal=True, key="history_by", help="commit: the latest run of each git commit"
    )
    metric = right.selectbox("Metric", list(METRICS), key="history_metric", format_func=lambda m: METRICS[m][0])
    loaded, refused = history(state.runs_root(), runs, by)
    for line in refused:
        st.caption(plain(line))
    if loaded.value is None:
        st.error(plain(loaded.error or "history failed"))
        return
    h = loaded.value
    if not h.points:
        st.info("No reftrain run directories in this folder: a history needs their start times.")
        return
    table = pd.DataFrame(
        [
            {
                "order": i,
                "run": p.run,
                "start": p.start_time,
                "commit": (p.commit or "")[:10],
                "mfu": p.mfu,
                "step_time_ms": p.step_time_ms,
                "tokens_per_s": p.tokens_per_s,
                "goodput": p.goodput,
                "verdict": p.verdict or ("cannot judge" if p.verdict_error else ""),
                "change": p.direction if p.change_point else "",
            }
            for i, p in enumerate(h.points)
        ]
    )
    title, fmt = METRICS[metric]
    spec = {
        "title": f"{title} per run ({by} order)",
        "layer": [
            {
                "mark": {"type": "line", "point": True, "tooltip": True},
                "encoding": {
                    "x": X_RUN,
                    "y": {
                        "field": metric,
                        "type": "quantitative",
                        "title": title,
                        "scale": {"zero": False},
                        "axis": {"format": fmt},
                    },
                    "tooltip": [
                        {"field": "run"},
                        {"field": "commit"},
                        {"field": metric, "format": fmt},
                        {"field": "verdict"},
                    ],
                },
            },
            {
                "transform": [{"filter": "datum.change != ''"}],
                "mark": {"type": "point", "shape": "triangle", "size": 200, "filled": True},
                "encoding": {
                    "x": X_RUN,
                    "y": {"field": metric, "type": "quantitative"},
                    "color": {
                        "field": "change",
                        "type": "nominal",
                        "title": "change point",
                        "scale": {"domain": ["slower", "faster"], "range": ["#d62728", "#2ca02c"]},
                    },
                },
            },
        ],
    }
    show_vega(spec, table, key="history_chart")
    st.caption(
        "Verdict: the CI gate (analyzer.check) from the previous run; a change point is a significant change "
        "either way (docs/dashboard.md, History)."
    )
    # The table in the chart's units: MFU and goodput in percent (the history holds fractions).
    shown = table.drop(columns=["order"]).rename(columns={"mfu": "MFU %", "goodput": "goodput %"})
    shown[["MFU %", "goodput %"]] = 100.0 * shown[["MFU %", "goodput %"]].astype(float)
    show_table(
        shown,
        hide_index=True,
        column_config={c: st.column_config.NumberColumn(c, format="%.1f") for c in ("MFU %", "goodput %")},
    )
    for s in h.skipped:
        st.caption(plain(f"skipped {s}"))
    names = [p.run for p in h.points]
    a, b = st.columns(2)
    base = a.selectbox("Baseline", names, index=None, key="history_base", placeholder="pick a run")
    cand = b.selectbox("Candidate", names, index=None, key="history_cand", placeholder="pick a run")
    if base and cand and base != cand:
        st.page_link(
            "views/compare.py",
            label=f"Compare {plain(base)} → {plain(cand)}",
            query_params={state.RUN_PARAM: cand, state.BASE_PARAM: base},
        )


if __name__ == "__main__":
    render()
