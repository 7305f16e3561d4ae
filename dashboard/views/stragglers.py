"""Stragglers: rank-by-step heatmaps of step time over the median and of
lateness, the analyzer's verdict and its per-rank evidence."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from analyzer.metrics.stragglers import StragglerResult
from dashboard import state
from dashboard.text import plain
from dashboard.ui import run_header, show_chart

EVIDENCE_COLUMNS = (
    "rank",
    "flagged",
    "signals",
    "n_steps",
    "step_time_ms",
    "step_time_ratio",
    "step_excess_ms",
    "step_z",
    "lateness_excess_ms",
    "lateness_z",
    "last_arrivals",
    "n_collectives",
    "wait_ms",
    "caused_wait_ms",
)


def rank_step_heatmap(per_step: pd.DataFrame, value: str, title: str, colorbar: str, center: float) -> go.Figure:
    grid = per_step.pivot_table(index="rank", columns="step", values=value).sort_index()
    fig = go.Figure(
        go.Heatmap(
            z=grid.to_numpy(),
            x=grid.columns.to_numpy(),
            y=[f"rank {r}" for r in grid.index],
            colorscale="RdBu_r",
            zmid=center,
            colorbar=dict(title=colorbar),
        )
    )
    fig.update_layout(title=title, xaxis_title="step", height=140 + 40 * len(grid.index))
    return fig


def evidence_table(result: StragglerResult) -> pd.DataFrame:
    rows = []
    for r in result.per_rank:
        row = {c: getattr(r, c, None) for c in EVIDENCE_COLUMNS}
        row["signals"] = ", ".join(row["signals"] or [])
        rows.append(row)
    return pd.DataFrame(rows, columns=list(EVIDENCE_COLUMNS))


def render() -> None:
    runs = state.all_runs()
    run = state.selected_run(runs)
    if run is None:
        return
    loaded = run_header(run)
    if loaded.value is None:
        return
    result = loaded.value.stragglers
    st.header("Stragglers")
    if result.ranks:
        st.warning(plain(result.verdict))
    else:
        st.success(plain(result.verdict))
    sources = [f"step times: {result.step_source}" if result.step_source else None,
               f"arrivals: {result.arrival_source}" if result.arrival_source else None]
    st.caption(plain("; ".join(s for s in sources if s)))
    for note in result.notes:
        st.caption(plain(note))

    per_step = result.per_step
    if per_step is not None and not per_step.empty and "step_time_ratio" in per_step.columns:
        show_chart(
            rank_step_heatmap(per_step, "step_time_ratio", "Step time over the median across ranks", "ratio", 1.0),
            key="straggler_ratio",
        )
        if "lateness_ms" in per_step.columns and per_step["lateness_ms"].notna().any():
            show_chart(
                rank_step_heatmap(
                    per_step, "lateness_ms", "Lateness: arrival after the first rank, summed over the step's collectives", "ms", 0.0
                ),
                key="straggler_lateness",
            )
    else:
        st.info("No per-step times to compare across ranks.")

    st.subheader("Evidence per rank")
    st.dataframe(evidence_table(result), hide_index=True)
    for r in result.per_rank:
        if r.flagged:
            st.markdown(f"- {plain(r.evidence)}")
    cfg = result.config
    st.caption(
        f"A rank is a persistent straggler when it is slow in at least {cfg.min_slow_share:.0%} of steps with a robust "
        f"z of at least {cfg.min_z} and an excess of at least {cfg.min_excess_ms} ms and {cfg.min_excess_frac:.0%} of "
        f"the median step, over at least {cfg.min_steps} steps (docs/metrics.md, \"Stragglers\")."
    )


if __name__ == "__main__":
    render()
