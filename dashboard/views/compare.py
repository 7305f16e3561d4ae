"""Compare: two runs side by side, with the analyzer's deltas per phase, per
kernel and per rank, the MFU delta and the CI gate's verdict (the same
paragraph ``analyzer check`` prints)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboard import state
from dashboard.data import analysis, compared, curves
from dashboard.text import html_text, plain
from dashboard.ui import NA, fmt_ms, fmt_pct, show_chart, show_table, show_vega

BASE_KEY = "compare_base"


def delta_table(deltas, unit: str) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "name": d.name,
                "kind": d.kind,
                f"baseline ({unit})": d.base,
                f"candidate ({unit})": d.cand,
                f"delta ({unit})": d.delta,
                "delta %": d.delta_pct,
            }
            for d in deltas
        ]
    )


def delta_chart(deltas, title: str, unit: str) -> go.Figure:
    names = [html_text(d.name)[:80] for d in deltas]
    values = [d.delta for d in deltas]
    fig = go.Figure(
        go.Bar(
            x=values,
            y=names,
            orientation="h",
            marker_color=["#d62728" if v > 0 else "#2ca02c" for v in values],
        )
    )
    fig.update_layout(
        title=title,
        xaxis_title=f"candidate - baseline ({unit})",
        yaxis_autorange="reversed",
        height=160 + 24 * len(deltas),
    )
    return fig


OVERLAY_RUNS_KEY = "compare_overlay_runs"
OVERLAY_METRIC_KEY = "compare_overlay_metric"
OVERLAY_SMOOTH_KEY = "compare_overlay_smooth"


def curves_overlay(runs, base, cand) -> None:
    """Training curves of the two runs (and any others chosen) overlaid, one metric at a time."""
    from analyzer.metrics.curves import METRICS, overlay, smooth

    st.subheader("Training curves")
    extra = st.multiselect(
        "Also overlay", [r.name for r in runs if r.name not in (base.name, cand.name)], key=OVERLAY_RUNS_KEY
    )
    chosen = [base, cand] + [r for r in runs if r.name in extra]
    by_run = {r.name: curves(r) for r in chosen}
    available = [m for m in METRICS if any(m in c.metrics for c in by_run.values())]
    if not available:
        st.info("None of these runs has per-step metrics records (folders of traces have none).")
        return
    left, right = st.columns([3, 1])
    metric = left.selectbox("Metric", available, key=OVERLAY_METRIC_KEY, format_func=lambda m: METRICS[m][0])
    window = right.number_input(
        "Smoothing window (steps)", min_value=1, max_value=1000, value=1, step=1, key=OVERLAY_SMOOTH_KEY
    )
    title, unit, how = METRICS[metric]
    table = smooth(overlay(by_run, metric), int(window), by=("run",))
    y = {
        "field": "value",
        "type": "quantitative",
        "title": f"{title} ({unit})" if unit else title,
        "scale": {"zero": False},
    }
    if metric == "mfu":
        y["axis"] = {"format": ".1%"}
    spec = {
        "title": f"{title} per step",
        "mark": {"type": "line", "point": True, "tooltip": True},
        "encoding": {
            "x": {"field": "step", "type": "quantitative", "axis": {"tickMinStep": 1}},
            "y": y,
            "color": {"field": "run", "type": "nominal", "title": None, "sort": list(by_run)},
        },
    }
    show_vega(spec, table[["run", "step", "value"]], key="compare_curves")
    lacking = [name for name, c in by_run.items() if metric not in c.metrics]
    note = f"{how} over ranks per step" + (f"; smoothed over {int(window)} steps" if window > 1 else "")
    if lacking:
        note += "; no values in " + ", ".join(lacking)
    st.caption(plain(note))


def _on_base() -> None:
    st.query_params[state.BASE_PARAM] = st.session_state[BASE_KEY]


def render() -> None:
    runs = state.all_runs()
    cand = state.selected_run(runs)
    if cand is None:
        return
    st.title(f"Compare · {plain(cand.name)}")
    others = [r.name for r in runs if r.name != cand.name]
    if not others:
        st.info("Only one run in the folder: nothing to compare with.")
        return
    wanted = st.query_params.get(state.BASE_PARAM)
    if wanted in others:
        st.session_state[BASE_KEY] = wanted
    st.selectbox("Baseline", others, key=BASE_KEY, index=None, placeholder="choose a baseline run", on_change=_on_base)
    base = state.param_run(runs, state.BASE_PARAM) if wanted else None
    if base is None and st.session_state.get(BASE_KEY):
        base = next(r for r in runs if r.name == st.session_state[BASE_KEY])
    if base is None:
        st.caption("The selected run is the candidate; choose the baseline to compare it against.")
        return
    st.caption(f"baseline {plain(base.name)} → candidate {plain(cand.name)}")
    loaded = compared(base, cand)
    if loaded.value is None:
        st.error(plain(loaded.error or "comparison failed"))
        return
    c, gate = loaded.value.comparison, loaded.value.gate

    st.subheader("CI gate")
    if gate is not None:
        from analyzer.verbs.check import explain

        text = plain(explain(gate))
        # Three verdicts, three colours: an inconclusive gate (runs noisier
        # than the threshold) must not look like a pass.
        if gate.result.regression:
            st.error(text)
        elif gate.result.inconclusive:
            st.warning(text)
        else:
            st.success(text)
    else:
        st.info(plain(f"The CI gate cannot judge these runs: {loaded.value.gate_error}"))

    shown_base, shown_cand = fmt_pct(c.mfu.base), fmt_pct(c.mfu.cand)
    cols = st.columns(4)
    # Each run's own MFU and step time, the figures its overview and the runs table show.
    cols[0].metric("MFU baseline", shown_base)
    cols[0].caption(f"HFU (with recompute) {fmt_pct(c.mfu.base_hfu)} → {fmt_pct(c.mfu.cand_hfu)}")
    # The badge's change is the difference of the two figures on the page, as a reader would take it (the
    # analyzer's delta uses the candidate on the baseline's peak when the peaks differ: another figure).
    both = NA not in (shown_base, shown_cand)
    cols[1].metric(
        "MFU candidate",
        shown_cand,
        delta=f"{float(shown_cand.rstrip('%')) - float(shown_base.rstrip('%')):+.1f} pts" if both else None,
    )
    if c.mfu.cand_on_base_peak is not None:
        cols[1].caption(f"{fmt_pct(c.mfu.cand_on_base_peak)} on the baseline's measured peak; the drop uses it")
    cols[2].metric("MFU drop", fmt_pct(c.mfu.drop), help="(baseline - candidate) / baseline")
    sm = c.step_time_median
    cols[3].metric(
        "Step time",
        fmt_ms(sm.cand),
        delta=None if sm.base is None or sm.cand is None else f"{sm.delta:+.1f} ms",
        delta_color="inverse",
        help="each run's headline step time (docs/metrics.md, Step time)",
    )
    cols[3].caption(
        f"baseline {fmt_ms(sm.base)}; mean over the phase rows {fmt_ms(c.step_time.base)} → "
        f"{fmt_ms(c.step_time.cand)} (the phases add up to it)"
    )
    for note in c.notes:
        st.caption(plain(note))
    for which, ra in (("baseline", analysis(base).value), ("candidate", analysis(cand).value)):
        if ra is not None and ra.mfu.lower_bound:
            cov = f" (FLOP coverage {fmt_pct(ra.mfu.flop_coverage)})" if ra.mfu.flop_coverage is not None else ""
            st.caption(f"The {which}'s MFU is a lower bound{cov}: shapes cover only part of the kernel time.")
    curves_overlay(runs, base, cand)

    st.subheader("Per phase")
    st.caption(plain(c.phase_source))
    if c.phases:
        show_chart(delta_chart(c.phases, "Change per phase, largest first", "ms per step"), key="compare_phases")
        show_table(delta_table(c.phases, "ms"), hide_index=True)
    st.subheader("Per kernel")
    st.caption(plain(c.kernel_source))
    if c.kernels:
        show_chart(
            delta_chart(c.kernels, "Change per kernel, largest first", "ms per profiled step"), key="compare_kernels"
        )
        show_table(delta_table(c.kernels, "ms"), hide_index=True)
    st.subheader("Per rank")
    show_table(delta_table(c.ranks, "ms"), hide_index=True)


if __name__ == "__main__":
    render()
