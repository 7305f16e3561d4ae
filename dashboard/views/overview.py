"""Run overview: headline figures, training curves, per-rank breakdown,
per-step MFU and step time, config and hardware, suggestions, raw trace
downloads."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from analyzer.api import RunAnalysis
from analyzer.metrics.mfu import MfuResult
from dashboard import state
from dashboard.data import curves, suggestions, throughput, trace_windows
from dashboard.discover import RunEntry, RunLookupError, safe_file
from dashboard.perfetto import PERFETTO_URL, open_in_perfetto
from dashboard.text import plain
from dashboard.ui import (
    show_table,
    FEW_RANKS,
    TOP_K,
    fmt_flops,
    fmt_ms,
    fmt_pct,
    fmt_pct_points,
    fmt_range,
    fmt_rate,
    open_run,
    show_vega,
)


def mfu_caption(mfu: MfuResult) -> str:
    """Where the MFU figure came from, or why there is none (analyzer's words)."""
    if mfu.source == "none" or mfu.median is None:
        return f"source: none ({mfu.reason or 'no reason given'})"
    peak = fmt_flops(mfu.peak_flops_per_s) if mfu.peak_flops_per_s else "unknown peak"
    detail = f", {mfu.peak_detail}" if mfu.peak_detail else ""
    text = f"source: {mfu.source}; peak {peak} per device ({mfu.peak_source}{detail})"
    return f"{mfu_bound_label(mfu)}; {text}" if mfu_bound_label(mfu) else text


def mfu_bound_label(mfu: MfuResult) -> str:
    """'lower bound (FLOP coverage 62.0%)' when the analyzer marks the MFU so, else ''."""
    if not mfu.lower_bound:
        return ""
    cov = f" (FLOP coverage {fmt_pct(mfu.flop_coverage)})" if mfu.flop_coverage is not None else ""
    return f"lower bound{cov}"


def headline(run: RunEntry, ra: RunAnalysis) -> None:
    tp = throughput(run)
    st_ = ra.step_time  # the run's one step time, as in its text, JSON and HTML reports
    step_value = fmt_ms(st_.ms)
    step_note = st_.label
    if st_.source == "steady_state" and st_.profiled_ms is not None:
        step_note += f"; profiled windows {fmt_ms(st_.profiled_ms)}"
    top = st.columns(3)
    bound = "≥ " if ra.mfu.lower_bound and ra.mfu.median is not None else ""
    top[0].metric(
        "MFU", bound + fmt_pct(ra.mfu.median), help="model FLOPs utilization, median over steps (docs/metrics.md)"
    )
    top[0].caption(plain(mfu_caption(ra.mfu)))
    top[1].metric("HFU", fmt_pct(ra.mfu.hfu_median), help="hardware FLOPs utilization: MFU plus activation recompute")
    top[1].caption("counts activation recompute as work" if ra.mfu.hfu_median is not None else "")
    top[2].metric("Tokens/s", fmt_rate(tp.median), help="all ranks, median over steady-state steps")
    top[2].caption("all ranks" if tp.median is not None else plain(tp.reason or ""))
    bottom = st.columns(3)
    bottom[0].metric(
        "Step time", step_value, help="median over steps of the mean over ranks (docs/metrics.md, Step time)"
    )
    bottom[0].caption(plain(step_note))
    bottom[1].metric("Exposed communication", fmt_range([r.exposed_comm_pct for r in ra.ranks], fmt_pct_points))
    bottom[1].caption("% of step time, per rank (lowest–highest)")
    overlap = [r.comm_comp_overlap_pct for r in ra.ranks]
    bottom[2].metric("Comm/compute overlap", fmt_range(overlap, fmt_pct_points))
    bottom[2].caption(
        "HTA definition, per rank (lowest–highest)"
        if any(v is not None for v in overlap)
        else "no GPU communication kernels in the traces"
    )


def goodput_section(ra: RunAnalysis) -> None:
    """Goodput and where the rest of the wall time went (analyzer.metrics.goodput; reftrain runs only)."""
    gp = ra.goodput()
    if gp is None:
        return  # a folder of traces has no attempts or wall clock: nothing to show, nothing to claim
    st.subheader("Goodput")
    left, right = st.columns([1, 3])
    left.metric(
        "Goodput",
        fmt_pct(gp.goodput),
        help="productive step time / wall time over every attempt (docs/rundir.md, Restarts and goodput)",
    )
    notes = [f"{gp.attempts} attempt(s)"]
    if gp.recomputed_steps:
        notes.append(f"{gp.recomputed_steps} step(s) recomputed")
    if gp.hung_attempts:
        notes.append(f"{gp.hung_attempts} hung attempt(s)")
    if gp.preempted:
        notes.append("preempted (resumable)")
    left.caption(f"productive {gp.productive_s:.2f} s of wall {gp.wall_s:.2f} s; " + ", ".join(notes))
    # One bar of the wall time: productive first, then each lost part (the analyzer's order).
    parts = ["productive", *gp.lost_s]
    bar = pd.DataFrame(
        [
            {
                "part": part,
                "order": i,
                "run": "wall time",
                "s": gp.productive_s if part == "productive" else gp.lost_s[part],
            }
            for i, part in enumerate(parts)
        ]
    )
    spec = {
        "mark": "bar",
        # Streamlit's default autosize ("fit") squeezes the plot and the legend into the given height: with
        # 8 parts the bar shrank to a pixel and the legend was cut after two. fit-x fits the width only, so
        # the height is the bar's and the legend (below it, in rows) adds its own.
        "autosize": {"type": "fit-x", "contains": "padding"},
        "height": 40,
        "encoding": {
            "y": {"field": "run", "type": "nominal", "title": None},
            "x": {"field": "s", "type": "quantitative", "stack": "zero", "title": "seconds of wall time"},
            "color": {
                "field": "part",
                "type": "nominal",
                "title": "part",
                "scale": {"domain": parts},
                "sort": parts,
                "legend": {"orient": "bottom", "columns": 4},
            },
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": [
                {"field": "part", "type": "nominal"},
                {"field": "s", "type": "quantitative", "format": ".2f", "title": "seconds"},
            ],
        },
    }
    with right:
        show_vega(spec, bar, key="goodput")


def shown_ranks(ra: RunAnalysis) -> tuple[list[int], bool]:
    """The ranks a per-rank chart draws: all of them up to FEW_RANKS, else the TOP_K
    slowest (the analyzer's order, slowest first); and whether that is a selection."""
    ids = [r.rank for r in ra.ranks]
    if len(ids) <= FEW_RANKS:
        return ids, False
    slowest = [r.rank for r in ra.stragglers.slowest(TOP_K)]
    return (slowest or ids[:TOP_K]), True


def breakdown_chart(ra: RunAnalysis) -> None:
    chosen, selection = shown_ranks(ra)
    st.subheader(
        f"Step-time breakdown of the {len(chosen)} slowest ranks" if selection else "Step-time breakdown per rank"
    )
    by_rank = {r.rank: r for r in ra.ranks if r.breakdown}
    all_ranks = list(by_rank.values())
    ranks = [by_rank[r] for r in chosen if r in by_rank]
    if not ranks:
        st.info("No ProfilerStep windows in the traces, so no per-step breakdown.")
        return
    parts = list(ranks[0].breakdown)
    # Long form, one row per (rank, part): Vega-Lite stacks the parts of a bar.
    bars = pd.DataFrame(
        [
            {"rank": f"rank {r.rank}", "part": part, "order": i, "ms": r.breakdown.get(part, {}).get("mean_ms")}
            for r in ranks
            for i, part in enumerate(parts)
        ]
    )
    spec = {
        "mark": "bar",
        "encoding": {
            "x": {"field": "rank", "type": "nominal", "title": None, "sort": None, "axis": {"labelAngle": 0}},
            "y": {
                "field": "ms",
                "type": "quantitative",
                "stack": "zero",
                "title": "ms per step (mean over profiled steps)",
            },
            "color": {"field": "part", "type": "nominal", "title": "part", "scale": {"domain": parts}, "sort": parts},
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": [
                {"field": "rank", "type": "nominal"},
                {"field": "part", "type": "nominal"},
                {"field": "ms", "type": "quantitative", "format": ".2f", "title": "ms per step"},
            ],
        },
    }
    show_vega(spec, bars, key="breakdown")
    waits = (
        "; collective_wait is time spent waiting at a collective for a later rank (not compute)"
        if any("collective_wait" in r.breakdown for r in ranks)
        else ""
    )
    picked = (
        (
            f"The {len(ranks)} slowest of {len(ra.ranks):,} ranks (step time over the median across ranks; "
            "the Stragglers page has every rank). "
        )
        if selection
        else ""
    )
    st.caption(
        f"{picked}Parts of the step on the {ranks[0].source} timeline over the profiled windows; they add up to the "
        f"profiled step time ({fmt_ms(ra.step_time.profiled_ms)}), not to the steady-state headline{waits}. "
        "Percent of step time per part" + (", every rank:" if selection else ":")
    )
    if selection:  # one row per rank: a grid scrolls through 1,024 rows, 1,024 columns it does not
        table = pd.DataFrame(
            [{"rank": r.rank, **{p: r.breakdown[p]["pct"] for p in parts if p in r.breakdown}} for r in all_ranks]
        )
        show_table(table.round(2), hide_index=True)
        return
    table = pd.DataFrame(
        {f"rank {r.rank}": {p: r.breakdown[p]["pct"] for p in parts if p in r.breakdown} for r in ranks}
    )
    show_table(table.round(2))


CURVE_METRIC_KEY = "curve_metric"
CURVE_SMOOTH_KEY = "curve_smooth"


IDLE_CAUSES = {"host_wait": "host wait", "kernel_wait": "kernel wait", "other": "other"}


def idle_causes_section(ra: RunAnalysis) -> None:
    """Why the device is idle, per rank: the analyzer's causes (docs/metrics.md, "Why the GPU is idle")."""
    causes = ra.idle_causes()
    causes = causes.loc[causes["span_ms"] > 0]  # CPU-only ranks have the empty figures (no device span)
    if causes.empty:
        return  # CPU traces and run directories without device traces: no device to be idle
    st.subheader("Why the GPU is idle")
    chosen, selection = shown_ranks(ra)
    causes = causes.loc[causes["rank"].isin(chosen)].sort_values("rank")
    order = list(IDLE_CAUSES.values())
    bars = pd.DataFrame(
        [
            {
                "rank": f"rank {row.rank}",
                "cause": label,
                "order": i,
                "ms": getattr(row, f"{key}_ms"),
                "pct": getattr(row, f"{key}_pct"),
            }
            for row in causes.itertuples(index=False)
            for i, (key, label) in enumerate(IDLE_CAUSES.items())
        ]
    )
    spec = {
        "mark": "bar",
        "encoding": {
            "x": {"field": "rank", "type": "nominal", "title": None, "sort": None, "axis": {"labelAngle": 0}},
            "y": {"field": "ms", "type": "quantitative", "stack": "zero", "title": "idle ms (analysis window)"},
            "color": {"field": "cause", "type": "nominal", "title": "cause", "scale": {"domain": order}, "sort": order},
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": [
                {"field": "rank", "type": "nominal"},
                {"field": "cause", "type": "nominal"},
                {"field": "ms", "type": "quantitative", "format": ".2f"},
                {"field": "pct", "type": "quantitative", "format": ".1f", "title": "% of idle"},
            ],
        },
    }
    show_vega(spec, bars, key="idle_causes")
    which = f"the {len(chosen)} slowest of {len(ra.ranks):,} ranks; " if selection else ""
    st.caption(
        plain(
            f"{which}device idle by cause: host wait (the next kernel was launched after the device went idle: the "
            "host is late), kernel wait (a gap under 30 us between kernels), other (queued but waiting on something "
            "else: a dependency, a copy, a sync). Host syncs and launch statistics per rank:"
        )
    )
    cols = {
        "rank": "rank",
        "idle_pct": "idle % of span",
        "syncs_per_step": "host syncs / step",
        "sync_idle_ms": "idle after syncs ms",
        "pageable_htod_per_step": "pageable HtoD / step",
    }
    show_table(causes[[c for c in cols if c in causes]].rename(columns=cols).round(2), hide_index=True)


def memory_section(ra: RunAnalysis) -> None:
    """Peak memory per step and rank (analyzer.metrics.memory; docs/metrics.md, "Memory")."""
    mem = ra.memory
    steps = mem.steps
    if steps.empty:
        return
    st.subheader("Memory per step")
    source = steps["source"].astype(str)
    steps = steps.loc[source == ("metrics" if (source == "metrics").any() else source.iloc[0])]
    chosen, selection = shown_ranks(ra)
    steps = steps.loc[steps["rank"].isin(chosen)].sort_values(["rank", "step"])
    mib = pd.DataFrame(
        {
            "rank": [f"rank {r}" for r in steps["rank"]],
            "step": steps["step"].to_numpy(),
            "peak_allocated_mib": steps["peak_allocated_bytes"].to_numpy(dtype=float) / 2**20,
        }
    )
    spec = {
        "mark": {"type": "line", "point": True, "tooltip": True},
        "encoding": {
            "x": {"field": "step", "type": "quantitative", "axis": {"tickMinStep": 1}},
            "y": {"field": "peak_allocated_mib", "type": "quantitative", "title": "peak MiB", "scale": {"zero": False}},
            "color": {"field": "rank", "type": "nominal", "title": None, "sort": None},
        },
    }
    show_vega(spec, mib, key="memory_steps")
    kinds = ", ".join(sorted(set(steps["kind"].astype(str))))
    peak = mem.peak_allocated_bytes
    which = f"; the {len(chosen)} slowest of {len(ra.ranks):,} ranks" if selection else ""
    st.caption(
        plain(
            f"peak per step ({kinds}; from the {steps['source'].iloc[0]}){which}; the run's peak "
            + (f"{peak / 2**20:,.1f} MiB" if peak is not None else "n/a")
        )
    )


def curve_spec(metric: str, title: str, unit: str) -> dict:
    """Vega-Lite: the metric per step as a line, profiled steps as orange rules,
    warmup steps as grey points (their statistics are left out of the headline)."""
    y = {
        "field": "value",
        "type": "quantitative",
        "title": f"{title} ({unit})" if unit else title,
        "scale": {"zero": False},
    }
    if metric == "mfu":
        y["axis"] = {"format": ".1%"}
    return {
        "title": f"{title} per step",
        "layer": [
            {
                "transform": [{"filter": "datum.profiled"}],
                "mark": {"type": "rule", "color": "orange", "opacity": 0.6, "strokeWidth": 2},
                "encoding": {"x": {"field": "step", "type": "quantitative"}},
            },
            {
                "mark": {"type": "line", "color": "#1f77b4"},
                "encoding": {"x": {"field": "step", "type": "quantitative", "axis": {"tickMinStep": 1}}, "y": y},
            },
            {
                "mark": {"type": "point", "filled": True, "tooltip": True},
                "encoding": {
                    "x": {"field": "step", "type": "quantitative"},
                    "y": {"field": "value", "type": "quantitative"},
                    "color": {
                        "field": "phase",
                        "type": "nominal",
                        "title": None,
                        "scale": {
                            "domain": ["warmup", "steady", "profiled"],
                            "range": ["#999999", "#1f77b4", "orange"],
                        },
                    },
                },
            },
        ],
    }


def curve_frame(table: pd.DataFrame) -> pd.DataFrame:
    """The rows a curve chart draws: step, value and the step's phase for the legend."""
    phase = ["profiled" if p else "warmup" if w else "steady" for w, p in zip(table["warmup"], table["profiled"])]
    return pd.DataFrame(
        {
            "step": table["step"].to_numpy(),
            "value": table["value"].to_numpy(),
            "profiled": table["profiled"].to_numpy(),
            "phase": phase,
        }
    )


def training_curves_section(run: RunEntry) -> None:
    """One chart of the run's per-step training curves (analyzer.curves), a metric
    selector and an optional trailing-mean smoothing window."""
    from analyzer.metrics.curves import METRICS, smooth

    st.subheader("Training curves")
    c = curves(run)
    if not c.metrics:
        st.info(plain(f"No training curves: {next(iter(c.missing.values()), 'no metrics records')}"))
        return
    left, right = st.columns([3, 1])
    metric = left.selectbox("Metric", c.metrics, key=CURVE_METRIC_KEY, format_func=lambda m: METRICS[m][0])
    window = right.number_input(
        "Smoothing window (steps)",
        min_value=1,
        max_value=1000,
        value=1,
        step=1,
        key=CURVE_SMOOTH_KEY,
        help="trailing mean over this many steps; 1 = raw values",
    )
    title, unit, how = METRICS[metric]
    series = smooth(c.series(metric), int(window))
    show_vega(curve_spec(metric, title, unit), curve_frame(series), key="training_curve")
    notes = [f"{how} over ranks per step (docs/dashboard.md, Training curves)"]
    if window > 1:
        notes.append(f"smoothed: trailing mean over {int(window)} steps")
    if c.profiled_steps:
        notes.append(
            "orange: profiled steps " + ", ".join(str(s) for s in c.profiled_steps) + " (run under the profiler)"
        )
    if c.warmup_steps:
        notes.append(f"grey: warmup steps below {c.warmup_steps}")
    absent = [f"{METRICS[m][0]}: {why}" for m, why in c.missing.items()]
    if absent:
        notes.append("not recorded: " + "; ".join(absent))
    st.caption(plain("; ".join(notes)))


def per_step_charts(ra: RunAnalysis) -> None:
    st.subheader("MFU and step time per step")
    left, right = st.columns(2)
    with left:
        mfu_steps = ra.mfu.steps
        if ra.mfu.source != "none" and len(mfu_steps):
            spec = {
                "title": "MFU per step",
                "mark": {"type": "line", "point": True, "tooltip": True},
                "encoding": {
                    "x": {"field": "step", "type": "quantitative", "axis": {"tickMinStep": 1}},
                    "y": {"field": "mfu", "type": "quantitative", "title": "MFU", "axis": {"format": ".0%"}},
                },
            }
            show_vega(spec, mfu_steps[["step", "mfu"]], key="mfu_steps")
            st.caption(plain(ra.mfu.step_time_source or ""))
        else:
            st.info(plain(f"No MFU per step: {ra.mfu.reason or 'unknown'}"))
    with right:
        if ra.metrics is not None and not ra.metrics.empty:
            table, where = ra.metrics, "every step, from the trainer's metrics records"
        else:
            table, where = ra.steps, "ProfilerStep windows in the traces"
        chosen, selection = shown_ranks(ra)
        if selection:  # one line per rank stops being readable long before 1,024 lines
            table = table.loc[table["rank"].isin(chosen)]
            where += f"; the {len(chosen)} slowest of {len(ra.ranks):,} ranks (the Stragglers page has every rank)"
        if len(table):
            rows = table.sort_values(["rank", "step"])
            lines = pd.DataFrame(
                {
                    "rank": [f"rank {r}" for r in rows["rank"]],
                    "step": rows["step"].to_numpy(),
                    "step_time_ms": rows["step_time_ms"].to_numpy(),
                }
            )
            spec = {
                "title": "Step time per step",
                "mark": {"type": "line", "point": True, "tooltip": True},
                "encoding": {
                    "x": {"field": "step", "type": "quantitative", "axis": {"tickMinStep": 1}},
                    "y": {"field": "step_time_ms", "type": "quantitative", "title": "ms"},
                    "color": {"field": "rank", "type": "nominal", "title": None, "sort": None},
                },
            }
            show_vega(spec, lines, key="step_times")
            notes = [where]
            manifest = ra.run_manifest
            if manifest.warmup_steps:
                notes.append(f"steps below {manifest.warmup_steps} are warmup")
            if manifest.profiled_steps:
                notes.append(
                    "profiled steps " + ", ".join(str(s) for s in manifest.profiled_steps) + " run under the profiler"
                )
            st.caption(plain("; ".join(notes)))
        else:
            st.info("No step times recorded.")


def _cell(value: object) -> str:
    """A table cell as text: lists and mappings as JSON, None as empty."""
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return "" if value is None else str(value)


def flat_config(config: dict, prefix: str = "") -> dict[str, str]:
    """The resolved config as dotted keys ("model.n_layers") and text values.

    One table of text rather than Streamlit's JSON viewer, which loads its
    own component in the browser for a collapsed expander.
    """
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_config(value, f"{name}."))
        else:
            out[name] = _cell(value)
    return out


def config_and_hardware(ra: RunAnalysis) -> None:
    st.subheader("Config and hardware")
    if ra.manifest:
        manifest = ra.run_manifest
        git = manifest.git
        facts = {
            "run_id": manifest.run_id,
            "status": manifest.status,
            "start_time": manifest.start_time,
            "end_time": manifest.end_time,
            "git sha": git.sha if git else None,
            "git dirty": git.dirty if git else None,
            "command": " ".join(str(a) for a in manifest.command),
            "world_size": manifest.world_size,
            "backend": manifest.backend,
            "torch_version": manifest.torch_version,
            "params (total)": manifest.params.total if manifest.params else None,
            "FLOPs per token": manifest.model_flops.per_token,
            "tokens per step": manifest.tokens_per_step,
            "steps": manifest.steps,
        }
        hw = manifest.hardware.to_json() if manifest.hardware else {}
        facts.update({f"hardware.{k}": v for k, v in hw.items()})
        peak = manifest.peak_flops.to_json() if manifest.peak_flops else {}
        facts.update({f"peak_flops.{k}": v for k, v in peak.items()})
        facts_table = pd.DataFrame({"field": list(facts), "value": [_cell(v) for v in facts.values()]})
        show_table(facts_table, hide_index=True)
        with st.expander("Resolved config (run.json `config`)"):
            config = flat_config(manifest.config or {})
            show_table(pd.DataFrame({"key": list(config), "value": list(config.values())}), hide_index=True)
    else:
        st.caption("No manifest: a folder of traces. What the traces say about each rank:")
    ranks = pd.DataFrame(
        [
            {
                "rank": r.rank,
                "trace": r.trace,
                "device": r.device_name,
                "timeline": r.source,
                "profiled steps": r.n_steps,
                "device events": r.n_device_events,
            }
            for r in ra.ranks
        ]
    )
    show_table(ranks, hide_index=True)


def suggestions_section(run: RunEntry) -> None:
    """The analyzer's ranked suggestions (docs/suggestions.md)."""
    st.subheader("Suggestions")
    loaded = suggestions(run)
    if loaded.value is None:
        st.error(plain(loaded.error or "suggestions failed"))
        return
    if not loaded.value:
        st.caption("No rule fired for this run (docs/suggestions.md lists the rules and their thresholds).")
        return
    for i, entry in enumerate(loaded.value, 1):
        tag = "diagnosis" if entry["kind"] == "diagnosis" else f"confidence {entry['confidence']}"
        with st.expander(f"{i}. {plain(entry['title'])} ({plain(tag)})", expanded=i == 1):
            st.markdown(f"**Why:** {plain(entry['trigger'])}")
            predicted = entry.get("predicted")
            if predicted:
                step = predicted["step_time_ms"]
                gain = predicted.get("gain")
                st.markdown(
                    f"**Predicted:** step {fmt_ms(step['before'])} → {fmt_ms(step['after'])}"
                    + (f", {100 * gain:+.0f}% throughput" if gain is not None else "")
                    + f" ({plain(predicted['scope'])}). {plain(predicted['method'])}"
                )
            st.markdown(f"**Change:** {plain(entry['change']['advice'])}")
            if entry["change"].get("command"):
                st.code(entry["change"]["command"], language="bash")
            evidence = {k: v for k, v in entry["evidence"].items() if v is not None}
            if evidence:
                show_table(
                    pd.DataFrame({"evidence": list(evidence), "value": [str(v) for v in evidence.values()]}),
                    hide_index=True,
                )
            for note in entry.get("notes") or []:
                st.caption(plain(note))


def downloads(run: RunEntry) -> None:
    """Every raw trace of the run, grouped by profiler window: a download and an "Open in Perfetto UI"
    button each (dashboard/perfetto.py). Either way the file goes only to this browser, and Perfetto
    parses it in its own tab; nothing is uploaded.
    """
    st.subheader("Raw traces")
    windows = trace_windows(run)
    if not windows:
        st.caption("This run has no trace files.")
        return
    n_files = sum(len(files) for files in windows.values())
    st.caption(
        plain(
            f'{n_files:,} trace file(s) in {len(windows)} profiler window(s). "Open in Perfetto UI" opens '
            "https://ui.perfetto.dev in a new tab and hands it the file; or download it, open the Perfetto UI and "
            'choose "Open trace file" (or drop the file on the page). Perfetto reads PyTorch profiler .json and '
            ".json.gz files in the browser and uploads nothing."
        )
    )
    st.link_button("Open the Perfetto UI", PERFETTO_URL)
    root = state.runs_root()
    if n_files > FEW_RANKS:  # one button per file is a page of buttons at 1,024 ranks: pick one file
        window = st.selectbox("Profiler window", list(windows), key="download_window")
        names = [p.name for p in windows[window]]
        name = st.selectbox(f"Trace file ({len(names):,}; type to find one)", names, key="download_pick")
        windows = {window: [windows[window][names.index(name)]]}
    for w, (window, files) in enumerate(windows.items()):
        st.markdown(f"**{plain(window)}**")
        for i, path in enumerate(files):
            try:
                real = safe_file(root, path)
                size = real.stat().st_size
            except (RunLookupError, OSError) as exc:  # removed or re-linked since the listing: say so, keep the page
                st.caption(plain(f"{path.name}: not offered: {exc}"))
                continue
            # traces/step{N}/rank{R}.pt.trace.json.gz: every window's files share names, so the saved
            # name keeps the window's folder.
            stem = f"{path.parent.name}-" if run.kind == "reftrain" and path.parent.name != "traces" else ""
            with st.container(horizontal=True, vertical_alignment="center"):
                st.download_button(
                    f"{plain(path.name)} ({size / 2**20:.1f} MiB)",
                    data=real.read_bytes,
                    file_name=stem + path.name,
                    mime="application/gzip" if path.name.endswith(".gz") else "application/json",
                    on_click="ignore",
                    key=f"download_{w}_{i}",
                )
                open_in_perfetto(
                    real, title=f"{run.name} {stem}{path.name}", file_name=stem + path.name, key=f"perfetto_{w}_{i}"
                )


def render() -> None:
    opened = open_run()
    if opened is None:
        return
    run, ra = opened
    headline(run, ra)
    goodput_section(ra)
    breakdown_chart(ra)
    idle_causes_section(ra)
    training_curves_section(run)
    per_step_charts(ra)
    memory_section(ra)
    suggestions_section(run)
    config_and_hardware(ra)
    downloads(run)


if __name__ == "__main__":
    render()
