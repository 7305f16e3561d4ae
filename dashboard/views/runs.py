"""Runs page: every run below RUNS_DIR in one sortable, filterable table.

A run that cannot be read shows its one-line error in its own row; the other
rows are unaffected.
"""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import quote

import pandas as pd
import streamlit as st

from dashboard import state
from dashboard.data import analysis, throughput
from dashboard.discover import RunEntry, trace_files
from dashboard.text import plain
from dashboard.ui import show_table

COLUMNS = (
    "run",
    "open",
    "status",
    "error",
    "MFU",
    "HFU",
    "MFU source",
    "step time (ms)",
    "tokens/s",
    "steps",
    "world size",
    "model",
    "params",
    "date",
    "git sha",
    "kind",
)


def _trace_date(run: RunEntry) -> str | None:
    """Newest trace file's modification time (UTC), for folders without a manifest."""
    mtimes = [p.stat().st_mtime for p in trace_files(run)]
    if not mtimes:
        return None
    return dt.datetime.fromtimestamp(max(mtimes), tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M")


def _manifest_date(start: str | None) -> str | None:
    if not start:
        return None
    try:
        return dt.datetime.fromisoformat(str(start)).astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return str(start)


def run_row(run: RunEntry) -> dict[str, Any]:
    """One table row: recorded facts from the manifest, numbers from the analyzer."""
    row: dict[str, Any] = {c: None for c in COLUMNS}
    row.update(run=run.name, open=f"./overview?{state.RUN_PARAM}={quote(run.name, safe='')}", kind=run.kind)
    loaded = analysis(run)
    if loaded.error:
        row.update(status="error", error=loaded.error, date=_trace_date(run))
        return row
    ra = loaded.value
    assert ra is not None  # a Loaded without an error holds its value
    has_manifest, manifest = bool(ra.manifest), ra.run_manifest
    params = manifest.params.total if manifest.params else None
    model_config = (manifest.config or {}).get("model")
    model = model_config.get("preset") if isinstance(model_config, dict) else None
    tp = throughput(run)
    row.update(
        date=_manifest_date(manifest.start_time) if has_manifest else _trace_date(run),
        **{
            "git sha": ((manifest.git.sha if manifest.git else None) or "")[:10] or None,
            "world size": manifest.world_size or len(ra.ranks) or None,
            "model": model,
            "params": params,
            "tokens/s": tp.median,
            "MFU": ra.mfu.median,
            "HFU": ra.mfu.hfu_median,  # hardware FLOPs: activation recompute included
            # The lower-bound label travels with the source (docs/mfu.md, FLOP coverage).
            "MFU source": ra.mfu.source
            + (
                f", lower bound (FLOP coverage {100 * ra.mfu.flop_coverage:.1f}%)"
                if ra.mfu.lower_bound and ra.mfu.flop_coverage is not None
                else ", lower bound"
                if ra.mfu.lower_bound
                else ""
            ),
            "step time (ms)": ra.step_time.ms,
            "steps": manifest.steps if has_manifest else max((r.n_steps for r in ra.ranks), default=None),
            # A trace folder has no recorded status: say whether every file was usable.
            "status": manifest.status if has_manifest else ("partial" if ra.errors else "ok"),
            "error": "; ".join(ra.errors) if ra.errors else None,
        },
    )
    return row


_TABLE_KEY = "runs_table"
_SHOWN_KEY = "runs_table_names"
_OPEN_KEY = "runs_table_open"


def _on_pick() -> None:
    """A row was selected: remember its run; the rerun opens it (see render)."""
    rows = st.session_state[_TABLE_KEY].selection.rows
    if rows:
        st.session_state[_OPEN_KEY] = st.session_state[_SHOWN_KEY][rows[0]]


def render() -> None:
    name = st.session_state.pop(_OPEN_KEY, None)
    if name is not None:
        # Switch before building the table again: inside the app the run page
        # reuses this session and its cached analysis (1.3-1.6 s from the
        # click to a drawn page here, 2.5-3.3 s in a new tab; docs/dashboard.md).
        # Selected rows are positions in `shown` as built, whatever the sort.
        st.switch_page("views/overview.py", query_params={state.RUN_PARAM: name})
    st.title("Runs")
    root = state.runs_root()
    runs = state.all_runs()
    st.caption(f"{len(runs)} run(s) in {plain(str(root))}")
    if not runs:
        st.info(
            "No runs here yet. A run is a reftrain run directory (run.json) or a folder of "
            "PyTorch profiler traces (*.json, *.json.gz). `make demo` writes one into runs/."
        )
        return
    col_filter, col_kind = st.columns([3, 2])
    needle = col_filter.text_input("Filter by name, status or error", key="runs_filter")
    kinds = col_kind.multiselect("Kind", ["reftrain", "traces"], default=["reftrain", "traces"], key="runs_kinds")
    table = pd.DataFrame([run_row(r) for r in runs], columns=list(COLUMNS))
    shown = table[table["kind"].isin(kinds)]
    if needle:
        text = shown[["run", "status", "error"]].fillna("").astype(str).agg(" ".join, axis=1)
        shown = shown[text.str.contains(needle, case=False, regex=False)]
    st.session_state[_SHOWN_KEY] = list(shown["run"])
    show_table(
        shown,
        hide_index=True,
        key=_TABLE_KEY,
        on_select=_on_pick,
        selection_mode="single-row",
        column_config={
            "open": st.column_config.LinkColumn("open", display_text="open", help="open the run's overview"),
            "params": st.column_config.NumberColumn("params", format="compact"),
            "tokens/s": st.column_config.NumberColumn("tokens/s", format="%.1f"),
            "step time (ms)": st.column_config.NumberColumn(
                "step time (ms)", format="%.1f", help="the run's headline step time (analyzer; docs/metrics.md)"
            ),
            "MFU": st.column_config.NumberColumn("MFU", format="percent", help="median over steps (analyzer)"),
            "HFU": st.column_config.NumberColumn(
                "HFU", format="percent", help="hardware FLOPs utilization: MFU plus activation recompute (analyzer)"
            ),
            "world size": st.column_config.NumberColumn("world size", format="%d"),
            "steps": st.column_config.NumberColumn("steps", format="%d"),
        },
    )
    st.caption('Select a row to open its run here; "open" opens it in a new browser tab.')
    n_bad = int(table["error"].notna().sum())
    if n_bad:
        st.caption(f"{n_bad} run(s) have errors; their rows say why. The other runs are unaffected.")


if __name__ == "__main__":
    render()
