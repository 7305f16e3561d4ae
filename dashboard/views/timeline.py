"""Timeline: a rank-by-time occupancy heatmap, and a zoomed window of events.

The overview bins time (analyzer.timeline.overview), so it costs the same
for 1k or 10M events. The zoomed window draws individual events with WebGL
(``scattergl``), capped at :data:`MAX_EVENTS` (the user may lower the cap):
SVG bar timelines take over 10 s at 100k events, WebGL lines stay
interactive at tens of thousands.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from analyzer.metrics.timeline import states_of
from dashboard import state
from dashboard.data import timeline_overview, timeline_window, trace_windows, traces
from dashboard.text import html_text, plain
from dashboard.ui import show_chart

MAX_EVENTS = 50_000
DEFAULT_EVENTS = 20_000
BIN_CHOICES = (50, 100, 200, 400, 800)
DEFAULT_BINS = 200
_NS_PER_MS = 1e6
_KIND_COLORS = {
    "compute": "#1f77b4",
    "comm": "#d62728",
    "memcpy": "#2ca02c",
    "memset": "#98df8a",
    "cpu_op": "#1f77b4",
    "cpu_comm": "#d62728",
    "annotation": "#9467bd",
}
_MAX_NAME_CHARS = 160


def heatmap(ov, state_name: str) -> go.Figure:
    """Rank (rows) by time bin (columns), colour = share of the bin in `state_name`."""
    occ = ov.occupancy
    grid = occ.pivot(index="rank", columns="bin", values=f"{state_name}_frac").sort_index()
    centers_ms = occ.loc[occ["rank"] == grid.index[0], ["start_ns", "end_ns"]].mean(axis=1).to_numpy() / _NS_PER_MS
    fig = go.Figure(
        go.Heatmap(
            z=grid.to_numpy(),
            x=centers_ms,
            y=[f"rank {r}" for r in grid.index],
            zmin=0.0,
            zmax=1.0,
            colorscale="Viridis",
            colorbar=dict(title="share", tickformat=".0%"),
            hovertemplate="%{y}<br>t = %{x:.2f} ms<br>" + state_name + " %{z:.1%}<extra></extra>",
        )
    )
    fig.update_layout(
        title=f"Share of time in {state_name}, per rank and time bin",
        xaxis_title="time since the first common profiler step (ms)",
        height=120 + 40 * len(grid.index),
    )
    return fig


def window_figure(events: pd.DataFrame, source: str) -> go.Figure:
    """One WebGL line per event, one trace per kind, one row per lane.

    A lane is a GPU stream (device timeline) or a host thread (host
    timeline); on a host thread, annotations (ProfilerStep, phases) get a
    row of their own above the thread's ops, which they would cover.
    """
    what = "stream" if source == "device" else "thread"
    sub = np.where(events["kind"].to_numpy() == "annotation", 0, 1) if source == "host" else np.ones(len(events), int)
    keyed = events.assign(_sub=sub)
    lanes = keyed[["rank", "lane", "_sub"]].drop_duplicates().sort_values(["rank", "lane", "_sub"]).reset_index(drop=True)
    # First lane on top. The y axis is not reversed (autorange="reversed"):
    # Streamlit's plotly.js draws scattergl lines on a reversed axis all on
    # one row; counting lanes down from the top gives the same picture.
    top = len(lanes) - 1
    lane_index = {
        (int(r), int(lane), int(k)): top - i for i, (r, lane, k) in enumerate(zip(lanes["rank"], lanes["lane"], lanes["_sub"]))
    }
    row = np.array(
        [lane_index[(int(r), int(lane), int(k))] for r, lane, k in zip(keyed["rank"], keyed["lane"], keyed["_sub"])],
        dtype=np.int64,
    )
    labels = [
        f"rank {r} · {what} {lane}" + (" · ranges" if source == "host" and k == 0 else "")
        for r, lane, k in zip(lanes["rank"], lanes["lane"], lanes["_sub"])
    ]
    fig = go.Figure()
    for kind, sel in events.groupby("kind", sort=True):
        idx = sel.index.to_numpy()
        n = len(idx)
        # start, end, gap per event; the gap (None, JSON null) breaks the line.
        x: list[float | None] = [None] * (3 * n)
        y: list[float | None] = [None] * (3 * n)
        x[0::3] = (sel["start_ns"].to_numpy() / _NS_PER_MS).tolist()
        x[1::3] = (sel["end_ns"].to_numpy() / _NS_PER_MS).tolist()
        y[0::3] = row[idx].tolist()
        y[1::3] = row[idx].tolist()
        names = [html_text(str(n_)[:_MAX_NAME_CHARS]) for n_ in sel["name"]]
        text: list[str | None] = [None] * (3 * n)
        text[0::3] = names
        text[1::3] = names
        fig.add_trace(
            go.Scattergl(
                x=x,
                y=y,
                mode="lines",
                line=dict(width=10, color=_KIND_COLORS.get(str(kind))),
                name=str(kind),
                hovertext=text,
                hoverinfo="text+x",
                connectgaps=False,
            )
        )
    fig.update_yaxes(tickvals=[top - i for i in range(len(lanes))], ticktext=labels, range=[-0.5, top + 0.5])
    fig.update_layout(
        xaxis_title="time since the first common profiler step (ms)",
        height=120 + 30 * len(lanes),
        legend_title="kind",
    )
    return fig


def render() -> None:
    runs = state.all_runs()
    run = state.selected_run(runs)
    if run is None:
        return
    st.title(f"Timeline · {plain(run.name)}")
    windows = trace_windows(run)
    if not windows:
        st.info("This run has no trace files, so there is no timeline.")
        return
    names = list(windows)
    window_name = st.selectbox("Profiler window", names, key="timeline_window") if len(names) > 1 else names[0]
    files = windows[window_name]
    loaded = traces(run, files)
    if loaded.value is None:
        st.error(plain(loaded.error or "traces could not be read"))
        return
    for err in loaded.value.errors:
        st.error(plain(str(err)))
    n_bins = st.select_slider("Time bins", BIN_CHOICES, value=DEFAULT_BINS, key="timeline_bins")
    ov_loaded = timeline_overview(run, files, n_bins)
    if ov_loaded.value is None:
        st.error(plain(ov_loaded.error or "no timeline"))
        return
    ov = ov_loaded.value
    states = list(states_of(ov.source))
    # Device: exposed communication, what overlap failed to hide. Host (gloo
    # collectives mostly run inside backward, so exposed_comm is often 0):
    # "other", the step time outside every phase.
    default_state = "exposed_comm" if ov.source == "device" else "other"
    state_name = st.radio("Show", states, index=states.index(default_state), horizontal=True, key="timeline_state")
    show_chart(heatmap(ov, state_name), key="timeline_heatmap")
    st.caption(
        f"{ov.source} timeline; each bin is {(ov.span_ns[1] - ov.span_ns[0]) / n_bins / _NS_PER_MS:.3g} ms. "
        "The shares per bin are the step breakdown's parts (docs/metrics.md) over that bin; ranks are aligned "
        "at the start of their first common profiler step."
    )

    st.subheader("Zoom")
    lo_ms, hi_ms = ov.span_ns[0] / _NS_PER_MS, ov.span_ns[1] / _NS_PER_MS
    first = ov.steps.sort_values(["step", "rank"]).head(1)
    default_hi = float(first["end_ns"].iloc[0]) / _NS_PER_MS if len(first) else lo_ms + (hi_ms - lo_ms) / 10
    default = (lo_ms, min(max(default_hi, lo_ms), hi_ms))
    t0_ms, t1_ms = st.slider(
        "Time range (ms)", min_value=lo_ms, max_value=hi_ms, value=default, key="timeline_range", format="%.2f"
    )
    if t1_ms <= t0_ms:
        st.info("Pick a non-empty time range.")
        return
    max_events = st.number_input(
        "Events drawn at most (the longest are kept)",
        min_value=100,
        max_value=MAX_EVENTS,
        value=min(DEFAULT_EVENTS, MAX_EVENTS),
        step=1000,
        key="timeline_max_events",
    )
    span_ns = (round(t0_ms * _NS_PER_MS), round(t1_ms * _NS_PER_MS))
    win_loaded = timeline_window(run, files, ov, span_ns, int(max_events))
    if win_loaded.value is None:
        st.error(plain(win_loaded.error or "no events"))
        return
    win = win_loaded.value
    if not len(win.events):
        st.info("No events in this range.")
        return
    show_chart(window_figure(win.events, ov.source), key="timeline_window_chart")
    shown = f"{len(win.events):,} of {win.n_total:,} events in this range"
    if win.n_dropped:
        shown += f"; the {win.n_dropped:,} shortest are not drawn (narrow the range to see them)"
    st.caption(shown)
    st.caption(
        "Every event, with its arguments and flows: download the traces on the Overview page and open them "
        "in the Perfetto UI (https://ui.perfetto.dev)."
    )


if __name__ == "__main__":
    render()
