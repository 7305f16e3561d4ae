"""Timeline: a rank-by-time occupancy heatmap, and a zoomed window of events.

The overview bins time from the rank summaries (``RunAnalysis.timeline_overview``:
each rank's fine time grid, built where its events were read), so it reads
no event and costs the same for 1k or 10M events and about the same for 2
or 1,024 ranks. The zoomed window reads the events of at most
:data:`MAX_ZOOM_RANKS` ranks (all of them up to that many; beyond, a rank
picker, the slowest rank and rank 0 by default) and draws them with WebGL
(``scattergl``), capped at :data:`MAX_EVENTS` (the user may lower the cap):
SVG bar timelines take over 10 s at 100k events, WebGL lines stay
interactive at tens of thousands.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from analyzer.metrics.timeline import states_of
from dashboard import state
from dashboard.data import analysis, timeline_overview, timeline_window, trace_windows, window_label
from dashboard.text import html_text, plain
from dashboard.ui import rank_axis, show_chart

MAX_ZOOM_RANKS = 8
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
    y, height, yaxis = rank_axis(grid.index)
    fig = go.Figure(
        go.Heatmap(
            z=grid.to_numpy(),
            x=centers_ms,
            y=y,
            zmin=0.0,
            zmax=1.0,
            colorscale="Viridis",
            colorbar=dict(title="share", tickformat=".0%"),
            hovertemplate=("rank %{y}" if yaxis else "%{y}")
            + "<br>t = %{x:.2f} ms<br>"
            + state_name
            + " %{z:.1%}<extra></extra>",
        )
    )
    fig.update_layout(
        title=f"Share of time in {state_name}, per rank and time bin",
        xaxis_title="time since the first common profiler step (ms)",
        height=120 + height,
    )
    if yaxis:
        fig.update_yaxes(**yaxis)
    return fig


def zoom_ranks(ranks: list[int], slowest: list[int]) -> list[int]:
    """Ranks to read events for: all of them up to MAX_ZOOM_RANKS, else a picker
    (default: the slowest rank and the first rank)."""
    if len(ranks) <= MAX_ZOOM_RANKS:
        return ranks
    default = list(dict.fromkeys([r for r in slowest[:1] if r in ranks] + ranks[:1]))
    picked = st.multiselect(
        f"Ranks to zoom into (at most {MAX_ZOOM_RANKS}; type a rank to find it)",
        ranks,
        default=default,
        max_selections=MAX_ZOOM_RANKS,
        key="timeline_ranks",
        help="Only these ranks' trace files are read; the heatmap above covers every rank.",
    )
    return sorted(int(r) for r in picked)


def window_figure(events: pd.DataFrame, source: str) -> go.Figure:
    """One WebGL line per event, one trace per kind, one row per lane.

    A lane is a GPU stream (device timeline) or a host thread (host
    timeline); on a host thread, annotations (ProfilerStep, phases) get a
    row of their own above the thread's ops, which they would cover.
    """
    what = "stream" if source == "device" else "thread"
    sub = np.where(events["kind"].to_numpy() == "annotation", 0, 1) if source == "host" else np.ones(len(events), int)
    keyed = events.assign(_sub=sub)
    lanes = (
        keyed[["rank", "lane", "_sub"]].drop_duplicates().sort_values(["rank", "lane", "_sub"]).reset_index(drop=True)
    )
    # First lane on top. The y axis is not reversed (autorange="reversed"):
    # Streamlit's plotly.js draws scattergl lines on a reversed axis all on
    # one row; counting lanes down from the top gives the same picture.
    top = len(lanes) - 1
    lane_index = {
        (int(r), int(lane), int(k)): top - i
        for i, (r, lane, k) in enumerate(zip(lanes["rank"], lanes["lane"], lanes["_sub"]))
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
    loaded = analysis(run)
    if loaded.value is None:
        st.error(plain(loaded.error or "the run could not be analyzed"))
        return
    ra = loaded.value
    windows = {window_label(w): w for w in ra.timeline_windows()}
    if not windows:
        st.info("This run has no usable trace files, so there is no timeline.")
        return
    names = list(windows)
    window_name = st.selectbox("Profiler window", names, key="timeline_window") if len(names) > 1 else names[0]
    window = windows[window_name]
    n_bins = st.select_slider(
        "Time bins",
        BIN_CHOICES,
        value=DEFAULT_BINS,
        key="timeline_bins",
        help="about this many: whole numbers of the ranks' fine time grids",
    )
    ov_loaded = timeline_overview(run, window, n_bins)
    if ov_loaded.value is None:
        st.error(plain(ov_loaded.error or "no timeline"))
        return
    ov, notes = ov_loaded.value
    if not len(ov.origins):
        st.info("No rank of this window has events on the run's timeline.")
        return
    states = list(states_of(ov.source))
    # Device: exposed communication, what overlap failed to hide. Host (gloo
    # collectives mostly run inside backward, so exposed_comm is often 0):
    # "other", the step time outside every phase.
    default_state = "exposed_comm" if ov.source == "device" else "other"
    state_name = st.radio("Show", states, index=states.index(default_state), horizontal=True, key="timeline_state")
    show_chart(heatmap(ov, state_name), key="timeline_heatmap")
    n_shown = int(ov.occupancy["bin"].max()) + 1
    st.caption(
        f"{ov.source} timeline of {len(ov.origins):,} rank(s); {n_shown} bins of "
        f"{(ov.span_ns[1] - ov.span_ns[0]) / n_shown / _NS_PER_MS:.3g} ms. "
        "The shares per bin are the step breakdown's parts (docs/metrics.md) over that bin, from the rank summaries; "
        "ranks are aligned at the start of their first common profiler step."
    )
    for note in notes:
        st.caption(plain(note))

    st.subheader("Zoom")
    ranks = sorted(ov.origins)
    picked = zoom_ranks(ranks, [r.rank for r in ra.stragglers.slowest(1)])
    if not picked:
        st.info("Pick a rank to see its events.")
        return
    by_name = {f.name: f for f in trace_windows(run).get(window_name, [])}
    names_of = ra.timeline.traces(window) if ra.timeline is not None else {}
    files = [by_name[names_of[r]] for r in picked if names_of.get(r) in by_name]
    if not files:
        st.error("The trace files of these ranks are gone; the run changed since its analysis.")
        return
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
    zoom_ov = replace(ov, origins={r: ov.origins[r] for r in picked})
    win_loaded = timeline_window(run, files, zoom_ov, span_ns, int(max_events))
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
