"""Telemetry: the NVML samples a GPU run recorded (utilization, SM clock,
power, memory, temperature), one line per GPU; or why there are none."""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from dashboard import state
from dashboard.data import run_dir
from dashboard.text import plain
from dashboard.ui import show_chart, show_table

# Series of reftrain.telemetry/1 (docs/rundir.md) and their axis titles.
SERIES = {
    "gpu_util_pct": "GPU utilization (%)",
    "mem_util_pct": "memory utilization (%)",
    "sm_clock_mhz": "SM clock (MHz)",
    "power_w": "power (W)",
    "mem_used_bytes": "memory used (bytes)",
    "temp_c": "temperature (°C)",
}
NO_TELEMETRY = "This run had no GPU telemetry."


def render() -> None:
    runs = state.all_runs()
    run = state.selected_run(runs)
    if run is None:
        return
    st.title(f"Telemetry · {plain(run.name)}")
    if run.kind != "reftrain":
        st.info(NO_TELEMETRY + " A folder of profiler traces carries no NVML samples.")
        return
    loaded = run_dir(run)
    if loaded.value is None:
        st.error(plain(loaded.error or "the run directory could not be read"))
        return
    rd = loaded.value
    telemetry = rd.telemetry
    if telemetry is None or telemetry.empty:
        note = rd.run.telemetry_note  # the typed run.json (RunDir.run)
        st.info(NO_TELEMETRY + (f" ({plain(note)})" if note else ""))
        return
    device_col = "rank"  # telemetry/gpu{R}.jsonl, R the rank (analyzer.rundir)
    t0 = int(telemetry["time_ns"].min())
    available = [s for s in SERIES if s in telemetry.columns and telemetry[s].notna().any()]
    chosen = st.multiselect("Series", available, default=available[:4], key="telemetry_series")
    for series in chosen:
        fig = go.Figure()
        for device, rows in telemetry.groupby(device_col, sort=True):
            rows = rows.sort_values("time_ns")
            fig.add_scattergl(
                x=(rows["time_ns"] - t0) / 1e9, y=rows[series], mode="lines", name=f"{device_col} {device}"
            )
        fig.update_layout(
            title=SERIES[series], xaxis_title="seconds since the first sample", yaxis_title=SERIES[series]
        )
        show_chart(fig, key=f"telemetry_{series}")
    if "throttle_reasons" in telemetry.columns:
        throttled = telemetry[telemetry["throttle_reasons"].map(lambda v: bool(v) if isinstance(v, list) else False)]
        if len(throttled):
            st.caption(f"{len(throttled)} sample(s) report clock throttling:")
            show_table(throttled[[device_col, "time_ns", "throttle_reasons"]], hide_index=True)


if __name__ == "__main__":
    render()
