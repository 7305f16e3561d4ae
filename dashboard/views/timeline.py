"""Timeline: a rank-by-time occupancy heatmap, the critical path of each profiled step, and a zoomed window of events.

The overview bins time from the rank summaries (``RunAnalysis.timeline_overview``:
each rank's fine time grid, built where its events were read), so it reads
no event and costs the same for 1k or 10M events and about the same for 2
or 1,024 ranks. The zoomed window reads the events of at most
:data:`MAX_ZOOM_RANKS` ranks (all of them up to that many; beyond, a rank
picker, the slowest rank and rank 0 by default) and draws them with WebGL
(``scattergl``), capped at :data:`MAX_EVENTS` (the user may lower the cap):
SVG bar timelines take over 10 s at 100k events, WebGL lines stay
interactive at tens of thousands.

The critical path section reads ``RunAnalysis.critical_path`` (computed by
the analyzer per rank and profiled step, which this page asks for:
``analyze(..., critical_path=True)``; docs/metrics.md, "Critical path"):
what bounds each step of one rank, the ops with the most time on the path,
and a download of that rank's trace with the path marked for the Perfetto
UI (``analyzer.verbs.critical_trace``, made on request: it reads the file).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from analyzer.metrics.timeline import states_of
from dashboard import state
from analyzer.metrics.depgraph import BOUND_CATEGORIES
from dashboard.data import (
    analysis,
    critical_path_trace,
    timeline_overview,
    timeline_window,
    trace_windows,
    window_label,
)
from dashboard.discover import RunEntry
from dashboard.text import html_text, plain
from dashboard.ui import rank_axis, show_chart, show_table

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
# HTA's category colours are not fixed; these follow the timeline's: compute blue, communication red.
_BOUND_COLORS = {
    "cpu_bound": "#9467bd",
    "data_loading": "#8c564b",
    "gpu_compute_bound": "#1f77b4",
    "gpu_communication_bound": "#d62728",
    "gpu_kernel_kernel_overhead": "#ff7f0e",
    "gpu_kernel_launch_overhead": "#bcbd22",
}


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


def bound_figure(table: pd.DataFrame) -> go.Figure:
    """One stacked bar per profiled step: the share of its critical path in each of HTA's categories."""
    x = [f"step {s}" for s in table["step"]]
    fig = go.Figure(
        [
            go.Bar(
                name=name,
                x=x,
                y=table[name],
                marker_color=_BOUND_COLORS[name],
                hovertemplate="%{x}<br>" + name + " %{y:.1f}%<extra></extra>",
            )
            for name in BOUND_CATEGORIES
        ]
    )
    fig.update_layout(barmode="stack", title="What bounds the critical path (% of the path)", yaxis_title="%")
    return fig


def critical_path_section(run: RunEntry, ra, window_name: str, window: int | None) -> None:
    """One rank's critical paths: the bound breakdown per step, the top ops of a step, the overlaid trace."""
    st.subheader("Critical path")
    paths = ra.critical_path.paths if ra.critical_path is not None else []
    if not paths:
        st.info("No critical path: it is computed per profiled step (ProfilerStep#N), and no rank of this run has one.")
        return
    ranks = sorted({p.rank for p in paths})
    rank = st.selectbox("Rank", ranks, key="critical_path_rank") if len(ranks) > 1 else ranks[0]
    mine = ra.critical_path.for_rank(int(rank))
    table = ra.critical_path.table()
    table = table.loc[table["rank"] == rank].reset_index(drop=True)
    show_chart(bound_figure(table), key="critical_path_bounds")
    show_table(table.drop(columns=["rank"]), hide_index=True, key="critical_path_steps")
    st.caption(
        "The critical path is the longest chain of dependent work in a step (CPU ops, launches, kernels, syncs, "
        "collectives): shortening what is on it shortens the step; what is off it buys nothing. Its length is the "
        "step's measured span; the categories are HTA's (docs/metrics.md, \"Critical path\")."
    )
    by_step = {p.step: p for p in mine}
    step = st.selectbox("Step", list(by_step), key="critical_path_step") if len(by_step) > 1 else mine[0].step
    chosen = by_step[int(step)]
    st.markdown(
        f"**Ops on the critical path of step {chosen.step}** ({chosen.n_ops} in all; the {len(chosen.ops)} with the "
        "most time on it)"
    )
    show_table(
        chosen.ops,
        hide_index=True,
        key="critical_path_ops",
        column_config={
            "ms_on_path": st.column_config.NumberColumn("ms on path", format="%.3f"),
            "pct": st.column_config.NumberColumn("% of path", format="%.1f"),
        },
    )
    names_of = ra.timeline.traces(window) if ra.timeline is not None else {}
    files = {f.name: f for f in trace_windows(run).get(window_name, [])}
    file = files.get(names_of.get(int(rank), ""))
    if file is None:
        st.caption(f"Rank {rank} has no trace file in {plain(window_name)}: no overlaid trace to download.")
        return
    if not st.toggle(f"Make rank {rank}'s trace with the critical path marked", key="critical_path_make"):
        st.caption("For the Perfetto UI: events on the path get args.critical = 1, arrows follow it across threads.")
        return
    loaded = critical_path_trace(run, file)
    if loaded.value is None:
        st.error(plain(loaded.error or "the overlaid trace could not be made"))
        return
    overlay = loaded.value
    st.download_button(
        f"Download rank {rank}'s critical-path trace ({overlay.n_marked:,} events marked, {overlay.n_flows:,} arrows)",
        data=overlay.to_bytes(),
        file_name=f"critical_path_rank{rank}_{file.name.removesuffix('.gz').removesuffix('.json')}.json.gz",
        mime="application/gzip",
        on_click="ignore",
        key="critical_path_download",
    )
    st.caption('Open it in the Perfetto UI (https://ui.perfetto.dev); docs/dashboard.md, "Timeline".')


def render() -> None:
    runs = state.all_runs()
    run = state.selected_run(runs)
    if run is None:
        return
    st.title(f"Timeline · {plain(run.name)}")
    loaded = analysis(run, critical_path=True)
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

    critical_path_section(run, ra, window_name, window)

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
