"""Operators: where device time goes op by op (the analyzer's attribution
tables), each op's shapes and top kernels, and the roofline of the ops whose
shapes the analyzer models (``RunAnalysis.roofline``).

Presentation only: every number is a column of ``RunAnalysis.attribution``
or of :class:`analyzer.metrics.roofline.Roofline`, renamed and formatted
(FLOP/s shown as TFLOP/s, bytes/s as TB/s). The lines of the roofline
chart are the analyzer's two roofs drawn across the chart's range.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import streamlit as st

from analyzer.api import RunAnalysis
from analyzer.metrics.roofline import Roofline
from dashboard.text import plain
from dashboard.ui import fmt_ms, fmt_pct_points, open_run, show_table, show_vega

ALL_RANKS = "all ranks (summed)"
SCOPE_KEY = "operators_scope"
OP_KEY = "operators_op"

OPS_COLUMNS = {
    "op": "op",
    "direction": "direction",
    "calls": "calls",
    "device_ms": "device ms",
    "device_inclusive_ms": "device ms (inclusive)",
    "host_ms": "host ms",
    "share_of_step_pct": "% of step",
    "n_kernels": "kernels",
    "family": "roofline model",
    "achieved_tflops_per_s": "achieved TFLOP/s",
    "achieved_tb_per_s": "achieved TB/s",
    "flop_per_byte": "FLOP/byte",
    "bound": "bound",
    "efficiency_pct": "efficiency %",
}
# The ops table's columns that only device kernels fill: left out on a run without any.
DEVICE_ONLY_OPS_COLUMNS = (
    "device ms",
    "device ms (inclusive)",
    "% of step",
    "kernels",
    "roofline model",
    "achieved TFLOP/s",
    "achieved TB/s",
    "FLOP/byte",
    "bound",
    "efficiency %",
)
SHAPE_COLUMNS = {
    "input_dims": "input dims",
    "input_types": "input types",
    "concrete_inputs": "scalar arguments",
    "calls": "calls",
    "n_kernels": "kernels",
    "device_ms": "device ms",
    "gflops_per_call": "GFLOP per call",
    "mb_per_call": "MB moved per call",
    "flop_per_byte": "FLOP/byte",
    "achieved_tflops_per_s": "achieved TFLOP/s",
    "achieved_tb_per_s": "achieved TB/s",
    "bound": "bound",
    "efficiency_pct": "efficiency %",
}
KERNEL_COLUMNS = {"kernel": "kernel", "cls": "class", "count": "count", "device_ms": "device ms"}


def rank_options(ra: RunAnalysis) -> list[str]:
    """The scope picker's choices: every rank summed, then each rank with attribution tables."""
    ranks = [] if ra.attribution is None else sorted({int(r) for r in ra.attribution.totals["rank"]})
    return [ALL_RANKS, *(f"rank {r}" for r in ranks)]


def scope_rank(choice: str) -> int | None:
    return None if choice == ALL_RANKS else int(choice.split()[1])


def attribution_table(ra: RunAnalysis, name: str, rank: int | None) -> pd.DataFrame:
    """One of the analyzer's attribution tables: summed over ranks, or one rank's rows."""
    if ra.attribution is None:
        return pd.DataFrame()
    if rank is None:
        return ra.attribution.summed(name)
    table = getattr(ra.attribution, name)
    return table.loc[table["rank"] == rank].drop(columns="rank").reset_index(drop=True)


def _direction(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.copy()
    out.insert(1, "direction", ["backward" if b else "forward" for b in out["backward"].astype(bool)])
    return out


def _rates_in_units(frame: pd.DataFrame) -> pd.DataFrame:
    """The roofline's SI rates as TFLOP/s and TB/s (a unit change for display)."""
    out = frame.copy()
    out["achieved_tflops_per_s"] = out["achieved_flops_per_s"] / 1e12
    out["achieved_tb_per_s"] = out["achieved_bytes_per_s"] / 1e12
    return out


def ops_view(ops: pd.DataFrame, rf: Roofline) -> pd.DataFrame:
    """The ops table with each op's roofline figures beside it (joined on op and direction)."""
    shown = _direction(ops)
    if len(rf.ops):
        model = _rates_in_units(rf.ops)[
            [
                "op",
                "backward",
                "family",
                "achieved_tflops_per_s",
                "achieved_tb_per_s",
                "flop_per_byte",
                "bound",
                "efficiency_pct",
            ]
        ]
        shown = shown.merge(model, on=["op", "backward"], how="left")
    else:
        for c in ("achieved_tflops_per_s", "achieved_tb_per_s", "flop_per_byte", "efficiency_pct"):
            shown[c] = float("nan")
        shown["bound"] = shown["family"] = None
    shown["op"] = shown["op"].astype(str)
    return shown[[c for c in OPS_COLUMNS if c in shown.columns]].rename(columns=OPS_COLUMNS)


def shapes_view(shapes: pd.DataFrame, rf: Roofline, op: str, backward: bool) -> pd.DataFrame:
    """One op's rows by input shapes, with their roofline figures where the analyzer models them."""
    mine = shapes.loc[(shapes["op"].astype(str) == op) & (shapes["backward"].astype(bool) == backward)].copy()
    if "concrete_inputs" not in mine.columns:  # a run summarized before the column existed
        mine["concrete_inputs"] = ""
    for c in ("op", "input_dims", "input_types", "concrete_inputs"):
        mine[c] = mine[c].astype(str)
    keys = ["op", "backward", "input_dims", "input_types", "concrete_inputs"]
    if len(rf.points):
        pts = _rates_in_units(rf.points)
        pts["gflops_per_call"] = pts["flops"] / pts["calls"] / 1e9
        pts["mb_per_call"] = pts["bytes"] / pts["calls"] / 1e6
        mine = mine.merge(
            pts[
                keys
                + [
                    "gflops_per_call",
                    "mb_per_call",
                    "flop_per_byte",
                    "achieved_tflops_per_s",
                    "achieved_tb_per_s",
                    "bound",
                    "efficiency_pct",
                ]
            ],
            on=keys,
            how="left",
        )
    if not (mine["concrete_inputs"] != "").any():  # only CONCRETE_OPS have their scalar arguments kept
        mine = mine.drop(columns=["concrete_inputs"])
    return mine[[c for c in SHAPE_COLUMNS if c in mine.columns]].rename(columns=SHAPE_COLUMNS)


def _number_formats(frame: pd.DataFrame) -> dict[str, Any]:
    fmt = {
        "device ms": "%.3f",
        "device ms (inclusive)": "%.3f",
        "host ms": "%.3f",
        "% of step": "%.2f",
        "achieved TFLOP/s": "%.2f",
        "achieved TB/s": "%.3f",
        "FLOP/byte": "%.1f",
        "efficiency %": "%.1f",
        "GFLOP per call": "%.4f",
        "MB moved per call": "%.3f",
    }
    return {c: st.column_config.NumberColumn(c, format=f) for c, f in fmt.items() if c in frame.columns}


def roofline_spec(rf: Roofline, points: pd.DataFrame) -> dict[str, Any]:
    """Vega-Lite: the points (log-log), the memory roof up to each ridge, each dtype's compute roof
    from its ridge on, and the ridge points marked and labelled."""
    xs = [v for v in points["flop_per_byte"] if v > 0]
    ridges = [float(r) for r in rf.roofs["ridge_flop_per_byte"] if r and math.isfinite(float(r))]
    lo = min(xs + ridges) / 10.0
    hi = max(xs + ridges) * 10.0
    tooltip = [
        {"field": "op", "type": "nominal"},
        {"field": "direction", "type": "nominal"},
        {"field": "input_dims", "type": "nominal", "title": "input dims"},
        {"field": "dtype", "type": "nominal"},
        {"field": "calls", "type": "quantitative"},
        {"field": "device_ms", "type": "quantitative", "title": "device ms", "format": ".3f"},
        {"field": "flop_per_byte", "type": "quantitative", "title": "FLOP/byte", "format": ".1f"},
        {"field": "achieved_tflops_per_s", "type": "quantitative", "title": "achieved TFLOP/s", "format": ".2f"},
        {"field": "achieved_tb_per_s", "type": "quantitative", "title": "achieved TB/s", "format": ".3f"},
        {"field": "bound", "type": "nominal"},
        {"field": "efficiency_pct", "type": "quantitative", "title": "efficiency %", "format": ".1f"},
    ]
    x = {
        "field": "x",
        "type": "quantitative",
        "scale": {"type": "log", "domain": [lo, hi]},
        "title": "arithmetic intensity (FLOP/byte)",
    }
    y_title = "achieved FLOP/s"
    layers: list[dict[str, Any]] = [
        {
            "mark": {"type": "point", "filled": True, "size": 80, "opacity": 0.8},
            "transform": [
                {"calculate": "datum.flop_per_byte", "as": "x"},
                {"calculate": "datum.achieved_flops_per_s", "as": "y"},
            ],
            "encoding": {
                "x": x,
                "y": {
                    "field": "y",
                    "type": "quantitative",
                    "scale": {"type": "log"},
                    "title": y_title,
                    "axis": {"format": "~s"},
                },
                "color": {"field": "op", "type": "nominal", "title": "op"},
                "shape": {"field": "direction", "type": "nominal", "title": "direction"},
                "tooltip": tooltip,
            },
        }
    ]
    hbm = rf.hbm_bytes_per_s
    if hbm and len(rf.roofs):
        roof_rows, ridge_rows = [], []
        for dtype, peak, ridge in rf.roofs[["dtype", "peak_flops_per_s", "ridge_flop_per_byte"]].itertuples(
            index=False
        ):
            label = f"{dtype} roof {peak / 1e12:.4g} TFLOP/s"
            roof_rows += [
                {"roof": f"memory {hbm / 1e12:.4g} TB/s", "x": lo, "y": lo * hbm, "order": 0},
                {"roof": f"memory {hbm / 1e12:.4g} TB/s", "x": ridge, "y": peak, "order": 1},
                {"roof": label, "x": ridge, "y": peak, "order": 0},
                {"roof": label, "x": hi, "y": peak, "order": 1},
            ]
            ridge_rows.append({"x": ridge, "y": peak, "label": f"ridge {dtype}: {ridge:.0f} FLOP/B"})
        # One memory-roof segment per dtype (each ends at that dtype's ridge): the longest covers the others.
        layers.append(
            {
                "data": {"values": roof_rows},
                "mark": {"type": "line", "strokeWidth": 2},
                "encoding": {
                    "x": x,
                    "y": {"field": "y", "type": "quantitative", "scale": {"type": "log"}, "title": y_title},
                    "detail": {"field": "roof", "type": "nominal"},
                    "order": {"field": "order", "type": "quantitative"},
                    "strokeDash": {"field": "roof", "type": "nominal", "title": "roofs (datasheet)"},
                    "color": {"value": "#888888"},
                    "tooltip": [{"field": "roof", "type": "nominal"}],
                },
            }
        )
        layers.append(
            {
                "data": {"values": ridge_rows},
                "mark": {"type": "point", "shape": "diamond", "size": 140, "filled": True, "color": "#444444"},
                "encoding": {
                    "x": x,
                    "y": {"field": "y", "type": "quantitative", "scale": {"type": "log"}, "title": y_title},
                    "tooltip": [{"field": "label", "type": "nominal", "title": "ridge point"}],
                },
            }
        )
        layers.append(
            {
                "data": {"values": ridge_rows},
                "mark": {"type": "text", "align": "left", "dx": 8, "dy": 12, "color": "#444444"},
                "encoding": {
                    "x": x,
                    "y": {"field": "y", "type": "quantitative", "scale": {"type": "log"}, "title": y_title},
                    "text": {"field": "label"},
                },
            }
        )
    return {"height": 420, "layer": layers, "resolve": {"scale": {"color": "independent"}}}


def render() -> None:
    opened = open_run()
    if opened is None:
        return
    _, ra = opened
    st.header("Operators")
    if ra.attribution is None or ra.attribution.totals.empty:
        st.info("No attribution tables for this run: no rank's trace could be analyzed.")
        return
    choice = st.selectbox(
        "Ranks",
        rank_options(ra),
        key=SCOPE_KEY,
        help="every rank's tables summed (calls and times added), or one rank's",
    )
    rank = scope_rank(choice)
    totals = ra.attribution.totals
    rows = totals if rank is None else totals.loc[totals["rank"] == rank]
    st.caption(plain(attribution_caption(rows)))
    ops = attribution_table(ra, "ops", rank)
    rf = ra.roofline(rank)
    no_device = len(rows) and float(rows["device_ms"].sum()) == 0.0
    if no_device:
        st.info(
            "These traces have no device kernels (a CPU run): device time, shapes, kernels and the roofline "
            "are empty, so the table leaves their columns out and shows each op's host time (the wall time "
            "of its outermost calls), largest first."
        )
    st.subheader("Ops")
    if ops.empty:
        st.info("No ops in the traces.")
        return
    shown = ops_view(ops, rf)
    if no_device:
        # Every device figure of a CPU run is 0 (no kernels) and no op is modeled: a column of 0.000 would read
        # as a measurement. The ops' host time is what these traces measure.
        shown = shown.drop(columns=[c for c in DEVICE_ONLY_OPS_COLUMNS if c in shown.columns])
        shown = shown.sort_values("host ms", ascending=False, kind="stable")
    show_table(shown, hide_index=True, key="operators_ops", column_config=_number_formats(shown))
    st.caption(
        "Click a column header to sort. Device ms: the op's attributed kernels (backward: the kernels of its "
        "autograd node); inclusive: every kernel launched under the op; host ms: its outermost calls' wall "
        "time; % of step: device ms over the summed step windows. Achieved rates, bound and efficiency "
        'exist for the ops the analyzer models from recorded shapes (docs/metrics.md, "Roofline").'
    )
    shapes_section(ra, ops, rf, rank)
    roofline_section(rf)


def attribution_caption(rows: pd.DataFrame) -> str:
    """Attributed and unattributed device time of the rank (or each rank), as the analyzer gives them."""
    parts = []
    for rank, device_ms, attributed_pct, unattributed_pct in zip(
        rows["rank"], rows["device_ms"], rows["attributed_pct"], rows["unattributed_pct"]
    ):
        parts.append(
            f"rank {rank}: {fmt_ms(device_ms)} device time, {fmt_pct_points(attributed_pct)} attributed "
            f"to ops, {fmt_pct_points(unattributed_pct)} unattributed"
        )
    return "; ".join(parts[:8]) + (f"; … ({len(parts)} ranks)" if len(parts) > 8 else "")


def shapes_section(ra: RunAnalysis, ops: pd.DataFrame, rf: Roofline, rank: int | None) -> None:
    st.subheader("One op: its shapes and kernels")
    choices = [(str(o), bool(b)) for o, b in ops[["op", "backward"]].itertuples(index=False)]
    pick = st.selectbox(
        "Op (by device time)",
        choices,
        key=OP_KEY,
        format_func=lambda c: f"{c[0]} ({'backward' if c[1] else 'forward'})",
    )
    if pick is None:
        return
    op, backward = pick
    shapes = attribution_table(ra, "shapes", rank)
    mine = shapes_view(shapes, rf, op, backward) if len(shapes) else pd.DataFrame()
    if mine.empty:
        st.info(
            f"No recorded input shapes for {plain(op)}: the analyzer keeps shapes for GEMM, attention and "
            "convolution ops, and only in traces taken with record_shapes=True."
        )
    else:
        show_table(mine, hide_index=True, key="operators_shapes", column_config=_number_formats(mine))
    kernels = attribution_table(ra, "op_kernels", rank)
    if len(kernels):
        kernels = kernels.loc[(kernels["op"].astype(str) == op) & (kernels["backward"].astype(bool) == backward)]
    if kernels.empty:
        st.info(f"No device kernels attributed to {plain(op)}.")
    else:
        top = kernels.copy()
        for c in ("kernel", "cls"):
            top[c] = top[c].astype(str)
        top = top.sort_values("device_ms", ascending=False, kind="stable")
        show_table(
            top[list(KERNEL_COLUMNS)].rename(columns=KERNEL_COLUMNS),
            hide_index=True,
            key="operators_kernels",
            column_config={"device ms": st.column_config.NumberColumn("device ms", format="%.3f")},
        )
        st.caption("The op's top kernels by device time (at most five per op and rank).")


def roofline_section(rf: Roofline) -> None:
    st.subheader("Roofline")
    for note in rf.notes:
        st.caption(plain(note))
    points = rf.points
    if len(points):
        points = points.loc[(points["flop_per_byte"] > 0) & (points["achieved_flops_per_s"] > 0)]
    if points.empty:
        st.info(
            "No op on the roofline: it needs device kernels attributed to GEMM or attention ops with recorded "
            "input shapes (a GPU trace taken with record_shapes=True)."
        )
        return
    if not rf.hbm_bytes_per_s or rf.roofs.empty:
        st.info(
            f"The device's peaks are unknown ({plain(rf.device_name or 'no device name in the trace')}): the points "
            "are drawn without roofs, bound or efficiency."
        )
    data = _direction(_rates_in_units(points))
    for c in ("op", "input_dims", "input_types", "dtype", "bound"):
        data[c] = data[c].astype(str)
    show_vega(roofline_spec(rf, data), data, key="roofline")
    if rf.hbm_bytes_per_s and len(rf.roofs):
        roofs = "; ".join(
            f"{d}: {p / 1e12:.4g} TFLOP/s, ridge {r:.0f} FLOP/byte ({s})"
            for d, p, r, s in rf.roofs[["dtype", "peak_flops_per_s", "ridge_flop_per_byte", "source"]].itertuples(
                index=False
            )
        )
        st.caption(
            plain(f"Memory roof {rf.hbm_bytes_per_s / 1e12:.4g} TB/s ({rf.hbm_source}). Compute roofs: {roofs}.")
        )
    share = 100.0 * rf.modeled_device_ms / rf.shapes_device_ms if rf.shapes_device_ms else None
    st.caption(
        f"One point per op, direction and input shapes: {len(points)} point(s), "
        f"{fmt_ms(rf.modeled_device_ms)} of device time ({fmt_pct_points(share)} of the time of ops with "
        "recorded shapes). Efficiency: achieved FLOP/s over min(peak FLOP/s, intensity x HBM bandwidth)."
    )


if __name__ == "__main__":
    render()
