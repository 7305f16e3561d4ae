"""Communication: overlap and exposed communication per rank, and every
collective's size, duration, bandwidth and arrival skew."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from analyzer.api import RunAnalysis
from dashboard.text import html_text, plain
from dashboard.ui import FEW_RANKS, open_run, show_chart, show_table

COLLECTIVE_COLUMNS = {
    "step": "step",
    "kind": "kind",
    "bytes": "bytes",
    "n_ranks": "ranks",
    "duration_ms": "duration (ms)",
    "algbw_gbps": "algbw (GB/s)",
    "busbw_gbps": "busbw (GB/s)",
    "skew_ms": "arrival skew (ms)",
    "last_rank": "last to arrive",
    "wait_ms": "wait caused (ms)",
}


def rank_table(ra: RunAnalysis) -> pd.DataFrame:
    """Per rank: the analyzer's overlap, exposed share and communication parts."""
    rows = []
    for r in ra.ranks:
        parts = r.breakdown
        rows.append(
            {
                "rank": r.rank,
                "comm/compute overlap % (HTA)": r.comm_comp_overlap_pct,
                "exposed comm % of step": r.exposed_comm_pct,
                "overlapped comm ms/step": parts.get("overlapped_comm", {}).get("mean_ms"),
                "exposed comm ms/step": parts.get("exposed_comm", {}).get("mean_ms"),
                "waiting at collectives ms/step": parts.get("collective_wait", {}).get("mean_ms"),
                "timeline": r.source,
            }
        )
    return pd.DataFrame(rows)


def rank_figure(table: pd.DataFrame) -> go.Figure:
    """Overlap and exposed share per rank: grouped bars up to FEW_RANKS ranks, beyond
    that one point per rank on a rank axis (WebGL: 2 x 1,024 points stay light)."""
    fig = go.Figure()
    overlap, exposed = table["comm/compute overlap % (HTA)"], table["exposed comm % of step"]
    if len(table) <= FEW_RANKS:
        labels = [f"rank {r}" for r in table["rank"]]
        fig.add_bar(name="comm/compute overlap (HTA)", x=labels, y=overlap)
        fig.add_bar(name="exposed comm (% of step)", x=labels, y=exposed)
        fig.update_layout(barmode="group", yaxis_title="%", yaxis_range=[0, 100])
        return fig
    ranks = table["rank"].to_numpy()
    fig.add_trace(
        go.Scattergl(name="comm/compute overlap (HTA)", x=ranks, y=overlap, mode="markers", marker=dict(size=4))
    )
    fig.add_trace(
        go.Scattergl(name="exposed comm (% of step)", x=ranks, y=exposed, mode="markers", marker=dict(size=4))
    )
    fig.update_layout(xaxis_title="rank", yaxis_title="%", yaxis_range=[0, 100])
    return fig


def render() -> None:
    opened = open_run()
    if opened is None:
        return
    _, ra = opened
    st.header("Communication")

    st.subheader("Per rank")
    table = rank_table(ra)
    if table.empty:
        st.info("No ranks were analyzed.")
    else:
        show_chart(rank_figure(table), key="comm_ranks")
        show_table(table, hide_index=True)
        if len(table) > FEW_RANKS:
            st.caption(
                "Sort the table by a column (click its header) to find the ranks with the most exposed "
                "communication or waiting."
            )
        st.caption(
            "Overlap (HTA): time with communication and compute kernels both running, over communication time. "
            "Exposed: communication with no compute running, as a share of step time. Waiting at collectives: "
            "time this rank waited for a later rank to arrive (not its own communication or compute). All in "
            "docs/metrics.md. "
            "CPU-only traces have no communication kernels, so the HTA overlap is n/a there."
        )

    st.subheader("Collectives")
    coll = ra.collectives
    if coll is None or coll.empty:
        st.info("No collectives were matched across ranks in this run.")
        return
    source = ra.stragglers.arrival_source
    if source:
        st.caption(f"From {plain(source)}.")
    left, right = st.columns(2)
    with left:
        fig = go.Figure()
        for kind, rows in coll.groupby("kind", sort=True):
            fig.add_scatter(
                x=rows["bytes"],
                y=rows["duration_ms"],
                mode="markers",
                name=html_text(str(kind)),
                hovertext=[f"step {s}" for s in rows["step"]],
            )
        fig.update_layout(title="Size and duration", xaxis_title="bytes", yaxis_title="duration (ms)", xaxis_type="log")
        show_chart(fig, key="coll_size")
    with right:
        fig = go.Figure()
        for kind, rows in coll.groupby("kind", sort=True):
            fig.add_scatter(x=rows.index, y=rows["skew_ms"], mode="markers", name=html_text(str(kind)))
        fig.update_layout(
            title="Arrival skew per collective", xaxis_title="collective (in order of arrival)", yaxis_title="skew (ms)"
        )
        show_chart(fig, key="coll_skew")
    shown = coll[[c for c in COLLECTIVE_COLUMNS if c in coll.columns]].rename(columns=COLLECTIVE_COLUMNS)
    show_table(shown, hide_index=True)
    st.caption(
        "Duration: the last arriver's start to end (the transfer without waiting). Arrival skew: last arrival "
        "minus first. Wait caused: the other ranks' total wait for the last arriver. algbw = bytes / duration; "
        "busbw applies the nccl-tests factor."
    )


if __name__ == "__main__":
    render()
