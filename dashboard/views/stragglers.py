"""Stragglers: rank-by-step heatmaps of step time over the median and of
lateness, the analyzer's verdict, the slowest ranks, one picked rank's
detail and every rank's evidence.

Built for many ranks: the heatmaps put ranks on an axis (1,024 rows draw as
one image), the slowest :data:`~dashboard.ui.TOP_K` ranks are a table, and
one rank at a time is opened in full from the picker (its rows of the
analysis' tables, which come from its rank summary)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from analyzer.api import RunAnalysis
from analyzer.metrics.stragglers import RankStraggle, StragglerResult
from dashboard.text import plain
from dashboard.ui import TOP_K, fmt_ms, open_run, rank_axis, show_chart, show_table

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


# The least half-span of a heatmap's colour scale around its centre: a healthy run's 1 % noise on a
# scale fitted to the data (0.99-1.01) painted every cell saturated red or blue. Below these, colour
# stays pale; a rank further off widens the scale to its own value.
RATIO_MIN_HALF_SPAN = 0.05  # step time over the median: 0.95-1.05
LATENESS_MIN_HALF_SPAN_MS = 1.0


def color_span(values: np.ndarray, center: float, min_half_span: float) -> tuple[float, float]:
    """(zmin, zmax) of a diverging colour scale: symmetric around `center`, at least `min_half_span` each side,
    wide enough for every finite value."""
    finite = values[np.isfinite(values)]
    half = max(min_half_span, float(np.abs(finite - center).max()) if finite.size else 0.0)
    return center - half, center + half


def rank_step_heatmap(
    per_step: pd.DataFrame, value: str, title: str, colorbar: str, center: float, min_half_span: float
) -> go.Figure:
    grid = per_step.pivot_table(index="rank", columns="step", values=value).sort_index()
    y, height, yaxis = rank_axis(grid.index)
    z = grid.to_numpy(dtype=float)
    zmin, zmax = color_span(z, center, min_half_span)
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=grid.columns.to_numpy(),
            y=y,
            colorscale="RdBu_r",
            zmin=zmin,
            zmax=zmax,
            colorbar=dict(title=colorbar),
            hovertemplate=("rank %{y}" if yaxis else "%{y}")
            + "<br>step %{x}<br>%{z:.3f} "
            + colorbar
            + "<extra></extra>",
        )
    )
    fig.update_layout(title=title, xaxis_title="step", height=140 + height)
    if yaxis:
        fig.update_yaxes(**yaxis)
    return fig


def evidence_table(result: StragglerResult, ranks: list[RankStraggle] | None = None) -> pd.DataFrame:
    """One row per rank of `ranks` (default: every rank), the analyzer's evidence columns."""
    rows = []
    for r in result.per_rank if ranks is None else ranks:
        row = {c: getattr(r, c, None) for c in EVIDENCE_COLUMNS}
        row["signals"] = ", ".join(row["signals"] or [])
        rows.append(row)
    return pd.DataFrame(rows, columns=list(EVIDENCE_COLUMNS))


def render() -> None:
    opened = open_run()
    if opened is None:
        return
    _, ra = opened
    result = ra.stragglers
    st.header("Stragglers")
    if result.ranks:
        st.warning(plain(result.verdict))
    else:
        st.success(plain(result.verdict))
    sources = [
        f"step times: {result.step_source}" if result.step_source else None,
        f"arrivals: {result.arrival_source}" if result.arrival_source else None,
    ]
    st.caption(plain("; ".join(s for s in sources if s)))
    for note in result.notes:
        st.caption(plain(note))

    per_step = result.per_step
    if per_step is not None and not per_step.empty and "step_time_ratio" in per_step.columns:
        show_chart(
            rank_step_heatmap(
                per_step, "step_time_ratio", "Step time over the median across ranks", "ratio", 1.0, RATIO_MIN_HALF_SPAN
            ),
            key="straggler_ratio",
        )
        st.caption(
            f"Colour: white at 1.0; the scale spans at least {1 - RATIO_MIN_HALF_SPAN:.2f}-"
            f"{1 + RATIO_MIN_HALF_SPAN:.2f}, so a few percent of noise stays pale, and widens to the "
            "furthest rank."
        )
        if "lateness_ms" in per_step.columns and per_step["lateness_ms"].notna().any():
            show_chart(
                rank_step_heatmap(
                    per_step,
                    "lateness_ms",
                    "Lateness: arrival after the first rank, summed over the step's collectives",
                    "ms",
                    0.0,
                    LATENESS_MIN_HALF_SPAN_MS,
                ),
                key="straggler_lateness",
            )
            st.caption(
                f"Colour: white at 0 ms; the scale spans at least {LATENESS_MIN_HALF_SPAN_MS:.0f} ms, "
                "and widens to the latest arrival."
            )
    else:
        st.info("No per-step times to compare across ranks.")

    for r in result.per_rank:
        if r.flagged:
            st.markdown(f"- {plain(r.evidence)}")
    slowest = result.slowest(TOP_K)
    if len(result.per_rank) > TOP_K:
        st.subheader(f"The {len(slowest)} slowest ranks")
        show_table(evidence_table(result, slowest), hide_index=True, key="straggler_top")
        st.caption("Ordered by step time over the median across ranks (median over steps), then by lateness.")
    rank_detail(ra, result, slowest)
    st.subheader("Evidence per rank")
    show_table(evidence_table(result), hide_index=True)
    cfg = result.config
    st.caption(
        f"A rank is a persistent straggler when it is slow in at least {cfg.min_slow_share:.0%} of steps with a robust "
        f"z of at least {cfg.min_z} and an excess of at least {cfg.min_excess_ms} ms and {cfg.min_excess_frac:.0%} of "
        f'the median step, over at least {cfg.min_steps} steps (docs/metrics.md, "Stragglers").'
    )


PICK_KEY = "straggler_rank"


def rank_detail(ra: RunAnalysis, result: StragglerResult, slowest: list[RankStraggle]) -> None:
    """One rank, picked by id (the slowest first in the list; type to search), in full:
    its evidence, its steps and its step breakdown, from the analysis (its rank summary)."""
    st.subheader("One rank")
    order = list(dict.fromkeys([r.rank for r in slowest] + [r.rank for r in ra.ranks]))
    if not order:
        st.info("No ranks were analyzed.")
        return
    rank = st.selectbox(
        "Rank (slowest first; type a rank to find it)", order, key=PICK_KEY, format_func=lambda r: f"rank {r}"
    )
    evidence = next((r for r in result.per_rank if r.rank == rank), None)
    summary = next((r for r in ra.ranks if r.rank == rank), None)
    if evidence is not None:
        st.markdown(
            plain(evidence.evidence)
            if evidence.evidence
            else f"rank {rank}: step time {fmt_ms(evidence.step_time_ms)}, "
            f"{evidence.last_arrivals} of {evidence.n_collectives} collectives arrived last"
        )
    per_step = result.per_step
    if per_step is not None and not per_step.empty:
        mine = per_step.loc[per_step["rank"] == rank].drop(columns="rank")
        show_table(mine, hide_index=True, key="straggler_rank_steps")
    if summary is not None and summary.breakdown:
        parts = pd.DataFrame(
            [
                {"part": p, "mean ms per step": v["mean_ms"], "median ms": v["median_ms"], "% of step": v["pct"]}
                for p, v in summary.breakdown.items()
            ]
        )
        show_table(parts, hide_index=True, key="straggler_rank_breakdown")
        st.caption(
            f"rank {rank}'s step breakdown over its profiled steps ({summary.source} timeline; docs/metrics.md)."
        )


if __name__ == "__main__":
    render()
