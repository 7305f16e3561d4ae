"""Presenting analyzer results: text tables, JSON, self-contained HTML, Markdown.

Everything here formats results computed elsewhere (analyzer.api,
analyzer.compare, analyzer.check); no metric is computed here. The HTML
page embeds plotly.js inline (no CDN, no network): CI artifacts are opened
offline.
"""
from __future__ import annotations

import html
import math
import re
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import pandas as pd

from analyzer.ingest.formats import Generator, ReportDocument, package_version
from analyzer.jsontext import dumps_json  # noqa: F401 - part of this module's API
from analyzer.jsontext import path_text
from analyzer.verbs.printable import printable
from analyzer.verbs.suggest import report_suggestions, suggestions_text  # docs/suggestions.md

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis
    from analyzer.metrics.mfu import MfuResult
    from analyzer.verbs.check import GateOutcome
    from analyzer.verbs.compare import Comparison, Delta

KERNEL_NAME_WIDTH = 72


# ----------------------------------------------------------------- formatting
def _num(value: Any, fmt: str = ".1f", none: str = "-") -> str:
    if value is None:
        return none
    try:
        x = float(value)
    except (TypeError, ValueError):
        return str(value)
    return none if not math.isfinite(x) else format(x, fmt)


def _pct(fraction: float | None, digits: int = 1) -> str:
    """A fraction (0..1) as a percentage."""
    return _num(None if fraction is None else 100.0 * fraction, f".{digits}f") + ("%" if fraction is not None else "")


def short_kernel_name(name: str, width: int = KERNEL_NAME_WIDTH) -> str:
    """A kernel name a table can show, at most ``width`` characters.

    Drops a leading ``void``, ``(anonymous namespace)::`` and the parameter
    list of a C++ signature (``foo<float>(int, float*)`` becomes
    ``foo<float>``; ``Memcpy HtoD (Pinned -> Device)`` is not a signature
    and stays), then elides the middle so that both the start and the
    distinguishing template arguments at the end remain.
    """
    text = printable(name.strip(), one_line=True)
    if text.startswith("void "):
        text = text[5:]
    text = text.replace("(anonymous namespace)::", "")
    if text.endswith(")"):
        depth = 0
        for i in range(len(text) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(text[i], 0)
            if depth == 0:
                if i > 0 and not text[i - 1].isspace():
                    text = text[:i]
                break
    if len(text) <= width:
        return text
    head = (width - 1) * 3 // 5
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, left: Sequence[int] = ()) -> str:
    """A plain-text table; columns right-aligned except the indices in ``left``; control
    characters and newlines in a cell escaped (:func:`~analyzer.verbs.printable.printable`)."""
    rows = [[printable(str(c), one_line=True) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]

    def line(cells: Sequence[str]) -> str:
        out = [c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(out).rstrip()

    return "\n".join([line(list(headers)), line(["-" * w for w in widths])] + [line(r) for r in rows])


# ----------------------------------------------------------------- report: JSON
def report_json(a: "RunAnalysis") -> ReportDocument:
    """The versioned report: :meth:`RunAnalysis.to_json` plus the suggestions and a ``generator`` block."""
    return ReportDocument(
        **a.to_json(),
        suggestions=report_suggestions(a),
        generator=Generator(
            tool="analyzer",
            version=package_version(),
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        ),
    )


# ----------------------------------------------------------------- report: text
def _kind_text(a: "RunAnalysis") -> str:
    n = len(a.ranks)
    if a.kind == "reftrain":
        m = a.run_manifest
        return f"reftrain run {m.run_id or '?'} ({m.status or '?'}), {n} rank(s)"
    return f"Kineto traces, {n} rank(s)"


def _parts(a: "RunAnalysis") -> list[str]:
    parts: list[str] = []
    for r in a.ranks:
        parts += [p for p in r.breakdown if p not in parts]
    return parts


def top_kernels_table(a: "RunAnalysis", top: int) -> pd.DataFrame:
    """The ``top`` kernels (or host ops) over all ranks: name, kind, count, total_ms, ms per rank, share."""
    k = a.kernels
    if k is None or k.empty:
        return pd.DataFrame(columns=["name", "kind", "count", "total_ms", "ms_per_rank", "share_pct"])
    n_ranks = max(1, k["rank"].nunique())
    frame = k.assign(name=k["name"].astype(str))
    grouped = frame.groupby("name", sort=False).agg(
        kind=("kind", "first"), count=("count", "sum"), total_ms=("total_ms", "sum"), share_pct=("share_pct", "mean")
    )
    grouped["ms_per_rank"] = grouped["total_ms"] / n_ranks
    grouped = grouped.reset_index().sort_values(["total_ms", "name"], ascending=[False, True], kind="stable")
    return grouped.head(top)[["name", "kind", "count", "total_ms", "ms_per_rank", "share_pct"]].reset_index(drop=True)


def _host_ops(a: "RunAnalysis") -> bool:
    """True when the top list holds host ops (CPU-only traces), not device kernels."""
    return a.kernels is not None and not a.kernels.empty and set(a.kernels["source"].astype(str)) == {"host"}


def _mfu_lines(a: "RunAnalysis") -> list[str]:
    m = a.mfu
    if m.source == "none" or m.median is None:
        return [f"MFU: none ({m.reason})"] + _flop_lines(m)
    peak = f"{m.peak_flops_per_s / 1e12:.3g} TFLOP/s" if m.peak_flops_per_s else "?"
    # A lower bound (FLOP coverage under COVERAGE_MIN) says so in the headline, with its coverage.
    bound = f">= {_pct(m.median, 2)} (lower bound: FLOP coverage {_pct(m.flop_coverage, 1)})" if m.lower_bound else _pct(m.median, 2)
    lines = [
        f"MFU: {bound} median over {len(m.steps)} step(s), HFU {_pct(m.hfu_median, 2)}  "
        f"[source: {m.source}]",
        f"  peak {peak} per device ({m.peak_source}: {m.peak_detail})" + (f", dtype {m.dtype}" if m.dtype else ""),
    ]
    if m.flops_source:
        lines.append(f"  model FLOPs: {m.flops_source}")
    if m.step_time_source:
        lines.append(f"  step time: {m.step_time_source}")
    return lines + _flop_lines(m)


def _flop_lines(m: "MfuResult") -> list[str]:
    """FLOPs per device per step, model (MFU) and hardware (HFU), each family's backward, and the notes."""
    lines = []
    if m.flops_per_step is not None:
        hw = m.hardware_flops_per_step if m.hardware_flops_per_step is not None else m.flops_per_step
        lines.append(f"  FLOPs per device per step: model {m.flops_per_step / 1e9:,.4g} GFLOP (MFU), "
                     f"hardware {hw / 1e9:,.4g} GFLOP (HFU, with recompute)")
    if m.backward_families:
        lines.append("  backward per family: " + ", ".join(f"{f} {mode}" for f, mode in m.backward_families.items()))
    return lines + [f"  note: {n}" for n in m.notes]


def _goodput_lines(a: "RunAnalysis") -> list[str]:
    """The run's goodput and where the rest of the wall time went; none for trace folders (no run.json)."""
    gp = a.goodput()  # docs/rundir.md "Restarts and goodput"
    if gp is None:
        return []
    lost = ", ".join(f"{k} {v:.2f}" for k, v in gp.lost_s.items())
    extra = f", {gp.recomputed_steps} step(s) recomputed" if gp.recomputed_steps else ""
    extra += f", {gp.hung_attempts} hung attempt(s)" if gp.hung_attempts else ""
    extra += ", preempted (resumable)" if gp.preempted else ""
    return [f"Goodput: {_pct(gp.goodput, 1)} (productive step time {gp.productive_s:.2f} s of wall "
            f"{gp.wall_s:.2f} s, {gp.attempts} attempt(s){extra}); lost s: {lost}"]


def _straggler_lines(a: "RunAnalysis") -> list[str]:
    s = a.stragglers
    lines = [f"Stragglers: {s.verdict}"]
    if s.per_rank:
        rows = [
            [
                r.rank,
                r.n_steps,
                _num(r.step_time_ms),
                _num(r.step_time_ratio, ".3f"),
                _num(r.lateness_excess_ms, ".2f"),
                _num(r.lateness_z, ".1f"),
                f"{r.last_arrivals}/{r.n_collectives}",
                _num(r.caused_wait_ms, ".1f"),
                "yes" if r.flagged else "",
            ]
            for r in s.per_rank
        ]
        table = format_table(
            ["rank", "steps", "judged step ms", "ratio", "late ms", "late z", "last in", "others waited ms", "flagged"], rows
        )
        lines += ["  " + line for line in table.splitlines()]
        lines += [f"  rank {r.rank}: {r.evidence}" for r in s.per_rank if r.flagged and r.evidence]
        if s.step_source or s.arrival_source:
            lines.append(f"  steps from {s.step_source or '-'}; arrivals from {s.arrival_source or '-'}")
    lines += [f"  note: {n}" for n in s.notes]
    return lines


def step_time_text(a: "RunAnalysis") -> str:
    """The run's headline step time with what it covers, and the other figure beside it (docs/metrics.md)."""
    st = a.step_time
    if st.ms is None:
        return "Step time: none (no steady-state metrics steps and no ProfilerStep windows)"
    text = f"Step time: {_num(st.ms, '.2f')} ms, {st.label}, median over {_n_steps(st)} of the mean over ranks"
    if st.source == "steady_state" and st.profiled_ms is not None:
        text += f"; profiled windows {_num(st.profiled_ms, '.2f')} ms over {st.n_profiled_steps} step(s) (the breakdown's steps)"
    return text


def _n_steps(st) -> str:
    n = st.n_steady_steps if st.source == "steady_state" else st.n_profiled_steps
    return f"{n} step(s)"


def _has_steady(a: "RunAnalysis") -> bool:
    return any(r.steady_step_time_ms is not None for r in a.ranks)


def _rank_step_headers(a: "RunAnalysis") -> list[str]:
    """Per-rank step time columns: steady-state and profiled side by side when the run has both kinds."""
    return ["steady ms", "profiled ms"] if _has_steady(a) else ["profiled ms"]


def _rank_step_cells(a: "RunAnalysis", r) -> list[str]:
    cells = [_num(r.steady_step_time_ms)] if _has_steady(a) else []
    return cells + [_num(r.profiled_step_time_ms)]


TIMELINE_PARTS = ("computation", "exposed_comm", "exposed_memcpy", "idle")
TIMELINE_TITLE = ("Whole-trace GPU timeline (TraceLens's gpu_timeline definition: % of each rank's GPU span, "
                  "first to last device event; the parts sum to 100)")
TIMELINE_NOTE = ("  computation: some compute kernel runs; exposed comm: communication with no compute; exposed memcpy: "
                 "copies/memsets with neither; idle: no device activity, gaps between steps included.")
NO_STEPS_LINE = ("No ProfilerStep windows in the trace(s): no per-step breakdown; the whole-trace GPU timeline above is "
                 "the only breakdown.")
BREAKDOWN_TITLE = ("Step breakdown over the profiled windows (mean ms per step, % of step time; the parts sum to "
                   "the profiled step time; idle counts host time inside a step)")


def _has_timeline(a: "RunAnalysis") -> bool:
    return any(r.gpu_timeline for r in a.ranks)


def _timeline_rows(a: "RunAnalysis") -> list[list[str]]:
    return [[r.rank, _num(r.gpu_span_ms, ".2f"), *(_num(r.gpu_timeline.get(p), ".2f") for p in TIMELINE_PARTS)]
            for r in a.ranks if r.gpu_timeline]


_TIMELINE_HEADERS = ["rank", "GPU span ms", "computation %", "exposed comm %", "exposed memcpy %", "idle %"]


def warning_lines(a: "RunAnalysis") -> list[str]:
    """Every input and window warning, and the FLOP-coverage warning, one line each (also on stderr and in JSON)."""
    lines = [f"skipped: {e}" for e in a.errors] + [str(w) for w in a.warnings]
    m = a.mfu
    if m.lower_bound and m.flop_coverage is not None:
        lines.append(f"MFU from shapes is a lower bound: FLOP coverage {_pct(m.flop_coverage, 1)} of GEMM/attention/conv "
                     f"{_coverage_time(m)}; no suggestion uses it")
    elif m.source == "none" and m.flop_coverage is not None and m.flop_coverage < 1.0:
        lines.append(f"MFU withheld: FLOP coverage {_pct(m.flop_coverage, 1)} of GEMM/attention/conv {_coverage_time(m)}")
    return [" ".join(line.split()) for line in lines]  # one line each, whatever the message held


def _coverage_time(m: "MfuResult") -> str:
    """What the FLOP coverage is a share of: kernel time where kernels link to their ops, else host op time."""
    return "kernel time" if m.attribution == "kernels" else "host op time" if m.attribution == "host-ops" else \
        "kernel and host op time"


def render_text(a: "RunAnalysis", *, top: int = 10) -> str:
    """The readable report of one run (what ``analyzer report`` prints)."""
    out = [f"analyzer report: {path_text(a.path)}", _kind_text(a), "", step_time_text(a), ""]
    warns = warning_lines(a)
    if warns:
        out.append(f"Warnings ({len(warns)})")
        out += [f"  {w}" for w in warns]
        out.append("")
    rows = [
        [
            r.rank,
            r.source or "-",
            r.n_steps,
            *_rank_step_cells(a, r),
            _num(r.compute_pct),
            _num(r.comm_comp_overlap_pct),
            _num(r.exposed_comm_pct),
            _num(r.idle_pct),
            r.device_name or "-",
        ]
        for r in a.ranks
    ]
    out.append("Per rank")
    out.append(
        format_table(
            ["rank", "timeline", "steps", *_rank_step_headers(a), "compute %", "overlap % (HTA)", "exposed comm %",
             "idle % (HTA)", "device"],
            rows,
            left=(1, 8 + _has_steady(a)),
        )
    )
    out += [
        "  steps: profiled windows. steady ms: median over the rank's steady-state metrics steps; "
        "profiled ms: median over its ProfilerStep windows.",
        "  overlap % (HTA): time communication and compute kernels both run / communication time.",
        "  analysis window of overlap, idle and kernel totals: device events launched by the end of the last "
        "ProfilerStep (HTA's); of the breakdown: each ProfilerStep window, clipped to the trace's events.",
        "  exposed comm %: communication not hidden by compute / step time. idle % (HTA): no GPU activity / kernel span.",
        "",
    ]
    if _has_timeline(a):
        out.append(TIMELINE_TITLE)
        out.append(format_table(_TIMELINE_HEADERS, _timeline_rows(a)))
        out.append(TIMELINE_NOTE)
        out.append("")
    parts = _parts(a)
    if not parts and _has_timeline(a):
        out += [NO_STEPS_LINE, ""]
    if parts:
        out.append(BREAKDOWN_TITLE)
        brows = []
        for r in a.ranks:
            cells = [r.rank]
            for p in parts:
                b = r.breakdown.get(p)
                cells.append(f"{_num(b['mean_ms'], '.2f')} ({_num(b['pct'])}%)" if b else "-")
            brows.append(cells)
        out.append(format_table(["rank"] + parts, brows))
        out.append("")
    out += _mfu_lines(a)
    out.append("")
    goodput = _goodput_lines(a)
    if goodput:
        out += goodput + [""]
    memory = memory_lines(a)
    if memory:
        out += memory + [""]
    out += _straggler_lines(a)
    out.append("")
    out.append(suggestions_text(a).rstrip())
    out.append("")
    attribution = attribution_lines(a, top)
    if attribution:
        out += attribution + [""]
    roof = roofline_lines(a, top)
    if roof:
        out += roof + [""]
    idle = idle_lines(a)
    if idle:
        out += idle + [""]
    kernels = top_kernels_table(a, top)
    if not kernels.empty:
        title = "Top host ops (inclusive time)" if _host_ops(a) else "Top kernels"
        out.append(f"{title}, all ranks (ms/rank = total over the analysis window / ranks)")
        krows = [
            [short_kernel_name(k.name), k.kind, k.count, _num(k.total_ms, ".2f"), _num(k.ms_per_rank, ".2f"), _num(k.share_pct)]
            for k in kernels.itertuples(index=False)
        ]
        out.append(format_table(["name", "kind", "count", "total ms", "ms/rank", "share %"], krows, left=(0, 1)))
    return printable("\n".join(out).rstrip() + "\n")


def _mib(v) -> str:
    return "-" if v is None or v != v else f"{v / 2**20:,.1f}"


def memory_lines(a: "RunAnalysis") -> list[str]:
    """Peak memory per rank and the run's peak (docs/metrics.md, "Memory"); [] without memory figures."""
    m = a.memory
    if m.source is None:
        return []
    rss = m.kind == "cpu_rss"
    what = "resident set (RSS) at each step's end" if rss else "peak allocated and reserved bytes"
    steps = ("metrics records, steps outside profiler windows" if m.source == "metrics"
             else "profiler memory events, ProfilerStep windows")
    lines = [f"Memory, {what}, MiB ({steps}; {m.kind})"]
    reserved = m.peak_reserved_bytes is not None  # CUDA only
    rows = [[r.rank, _mib(r.peak_allocated_bytes), "-" if r.peak_allocated_step is None else int(r.peak_allocated_step)]
            + ([_mib(r.peak_reserved_bytes), "-" if r.peak_reserved_step is None else int(r.peak_reserved_step)] if reserved else [])
            + [r.n_steps] for r in m.ranks.itertuples(index=False)]
    headers = ["rank", "peak RSS" if rss else "peak allocated", "at step"] + (["peak reserved", "at step"] if reserved else [])
    lines.append(format_table(headers + ["steps"], rows))
    peak = m.peak_allocated_bytes
    lines.append(f"  run peak (max over ranks): {_mib(peak)} MiB {'RSS' if rss else 'allocated'}"
                 + (f", {_mib(m.peak_reserved_bytes)} MiB reserved" if m.peak_reserved_bytes is not None else ""))
    tp = m.trace_peaks
    if not tp.empty:
        lines.append("  profiler memory events: " + "; ".join(
            f"rank {r.rank} {r.device} {_mib(r.peak_allocated_bytes)} allocated, {_mib(r.peak_reserved_bytes)} reserved "
            f"({r.n_events} events)" for r in tp.itertuples(index=False)))
    return lines


ATTRIBUTION_TOP_KERNELS = 2  # per op in the text report (the JSON keeps analyzer.metrics.attribution.TOP_KERNELS_PER_OP)


def attribution_lines(a: "RunAnalysis", top: int = 10) -> list[str]:
    """Where device time goes, by op, module and annotation (docs/metrics.md, "Attribution"); [] without ops."""
    at = a.attribution
    if at is None or at.ops.empty:
        return []
    t = at.totals
    n_ranks = max(1, len(t))
    device_ms = float(t["device_ms"].sum())
    ops = at.summed("ops")
    by_host = device_ms <= 0  # CPU-only traces: host time is all there is
    out = []
    if by_host:
        out.append("Where the time goes (no device events: host time of ops, modules and annotations, ms per rank)")
    else:
        def pct(col: str) -> str:
            return _pct(float(t[col].sum()) / device_ms)

        out.append(
            f"Where device time goes ({device_ms / n_ranks:.2f} ms per rank of device events in the window): "
            f"attributed to an op {pct('attributed_ms')}, unattributed {pct('unattributed_ms')} "
            f"({int(t['n_unattributed'].sum())} events with no launch call or no op around it); backward "
            f"{pct('backward_ms')}; launched off the main thread {pct('other_thread_ms')}; CUDA-graph replays "
            f"{pct('graph_ms')} (attributed to the graph launch); inside an nn.Module range {pct('module_ms')}")
    ops = ops.sort_values(["host_ms", "op"], ascending=[False, True], kind="stable") if by_host else ops
    kernels = at.summed("op_kernels")
    # Each op's kernels, largest first (ties in table order), gathered in one pass over the table.
    by_op: dict[tuple[str, bool], list[tuple[float, str, int]]] = {}
    for op, bwd, kernel, count, ms in zip(kernels["op"], kernels["backward"], kernels["kernel"], kernels["count"],
                                         kernels["device_ms"]):
        by_op.setdefault((str(op), bool(bwd)), []).append((float(ms), str(kernel), int(count)))
    rows = []
    for r in ops.head(top).itertuples(index=False):
        mine = sorted(by_op.get((str(r.op), bool(r.backward)), []), key=lambda k: -k[0])[:ATTRIBUTION_TOP_KERNELS]
        names = "; ".join(f"{short_kernel_name(k, 40)} x{c}" for _, k, c in mine)
        rows.append([short_kernel_name(r.op, 48), "bwd" if r.backward else "fwd", r.calls // n_ranks,
                     _num(r.device_ms / n_ranks, ".3f"), _num(r.device_inclusive_ms / n_ranks, ".3f"),
                     _num(r.host_ms / n_ranks, ".3f"), _num(r.share_of_step_pct), names or "-"])
    out.append(f"Ops by {'host' if by_host else 'device'} time (per rank; bwd: the backward of that forward op, "
               "from autograd sequence numbers; device ms: kernels counted to the op, incl: launched anywhere under it)")
    out.append(format_table(["op", "dir", "calls", "device ms", "incl ms", "host ms", "% of step", "top kernels"],
                            rows, left=(0, 1, 7)))
    mods = at.summed("modules")
    if not mods.empty:
        shown = mods.loc[mods["depth"] <= 2]
        order = "host_ms" if by_host else "device_ms"
        # Depth-first: each root's subtree in path order; the largest roots first.
        roots = shown.loc[shown["depth"] == 0].sort_values(order, ascending=False)["module"].unique()[:top]
        mrows = []
        for root in roots:
            sub = shown.loc[(shown["module"] == root) | shown["module"].str.startswith(root + "/")]
            for m in sub.itertuples(index=False):
                name = "  " * int(m.depth) + m.module.rsplit("/", 1)[-1]
                mrows.append([name, "bwd" if m.backward else "fwd", m.calls // n_ranks, _num(m.device_ms / n_ranks, ".3f"),
                              _num(m.device_self_ms / n_ranks, ".3f"), _num(m.host_ms / n_ranks, ".3f"), _num(m.share_of_step_pct)])
        out.append("Module tree (nn.Module ranges, depth <= 2, per rank; device ms inclusive of nested modules)")
        out.append(format_table(["module", "dir", "calls", "device ms", "self ms", "host ms", "% of step"], mrows[: 4 * top],
                                left=(0, 1)))
    annos = at.summed("annotations")
    if not annos.empty:
        annos = annos.sort_values(["device_ms", "host_ms"], ascending=False).head(top)
        arows = [[short_kernel_name(r.name, 48), r.calls // n_ranks, _num(r.device_ms / n_ranks, ".3f"),
                  _num(r.host_ms / n_ranks, ".3f"), _num(r.gpu_ms / n_ranks, ".3f") if r.gpu_calls else "-"]
                 for r in annos.itertuples(index=False)]
        out.append("User annotations (per rank; device ms: kernels launched under them; GPU ms: their GPU-side "
                   "copies, HTA's user annotation breakdown)")
        out.append(format_table(["annotation", "calls", "device ms", "host ms", "GPU ms"], arows, left=(0,)))
    return out


def idle_lines(a: "RunAnalysis") -> list[str]:
    """Why the GPU is idle: idle by cause, launch statistics, syncs, pageable copies (docs/metrics.md); [] without GPU."""
    t = a.idle.ranks if a.idle is not None else None
    if t is None or t.empty or not (t["span_ms"] > 0).any():
        return []
    rows = [[r.rank, _num(r.idle_pct), _num(r.host_wait_pct), _num(r.kernel_wait_pct), _num(r.other_pct), r.n_launches,
             _num(r.cpu_duration_us_p50), _num(r.launch_delay_us_p50), _num(r.gpu_duration_us_p50),
             _pct(r.short_share), _num(r.syncs_per_step), _num(r.sync_idle_ms / r.n_steps if r.n_steps else None, ".2f"),
             _num(r.pageable_htod_per_step)]
            for r in t.loc[t["span_ms"] > 0].itertuples(index=False)]
    return ["Why the GPU is idle (HTA's idle breakdown and launch statistics, window as idle % (HTA); per step: "
            "inside the ProfilerStep windows)",
            format_table(["rank", "idle %", "host wait %", "kernel wait %", "other %", "launches", "launch us",
                          "delay us", "kernel us", "short %", "syncs/step", "idle after sync ms/step",
                          "pageable HtoD/step"], rows),
            "  host wait: the next kernel was not launched yet; kernel wait: gaps under 30 us between launched kernels; "
            "other: waiting on something else (another stream, a collective). Cause shares are of the idle time.",
            "  launch/delay/kernel us: medians of the launch call, of kernel start - call end, of the kernel; short: "
            "kernels shorter than their launch call (HTA's). syncs: stream/device/event syncs, blocking copies, .item()."]


def roofline_lines(a: "RunAnalysis", top: int = 10) -> list[str]:
    """Per-op efficiency against the roofline (docs/metrics.md, "Roofline"); [] when no op could be modeled."""
    r = a.roofline()
    if r.ops.empty:
        return []
    ops = r.ops.sort_values(["device_ms", "op"], ascending=[False, True], kind="stable").head(top)

    def tera(x: Any) -> str:  # per second, in T (_num says "-" for a missing or NaN rate)
        return _num(None if x is None else float(x) / 1e12, ".2f")

    rows = [[o.op, "bwd" if o.backward else "fwd", o.dtype or "-", o.calls, _num(o.device_ms, ".3f"),
             tera(o.achieved_flops_per_s), tera(o.achieved_bytes_per_s), _num(o.flop_per_byte, ".1f"),
             _num(o.ridge_flop_per_byte, ".1f"), o.bound or "-", _num(o.efficiency_pct)]
            for o in ops.itertuples(index=False)]
    hbm = f"HBM {r.hbm_bytes_per_s / 1e12:.2f} TB/s ({r.hbm_source})" if r.hbm_bytes_per_s else "HBM bandwidth unknown"
    cover = (f"{_pct(r.modeled_device_ms / r.shapes_device_ms, 1)} of the device time of ops with shapes"
             if r.shapes_device_ms else "no op shapes")
    out = [f"Roofline per op (all ranks; {r.device_name or 'device unknown'}, {hbm}; modeled: {cover})",
           format_table(["op", "dir", "dtype", "calls", "device ms", "TFLOP/s", "TB/s", "FLOP/B", "ridge",
                         "bound", "eff %"], rows, left=(0, 1, 2, 9)),
           "  eff %: achieved FLOP/s over peak FLOP/s (compute-bound) or TB/s over the HBM bandwidth (memory-bound); "
           "bound: memory below the ridge point (peak FLOP/s / HBM bandwidth) and for elementwise, reduction, "
           "softmax and normalization ops, else compute. Backward of memory-bound ops: not modeled."]
    return out + [f"  note: {n}" for n in r.notes]


# ----------------------------------------------------------------- report: HTML
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1200px;color:#222;padding:0 1rem}
h1{font-size:1.5rem}h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9rem;margin:.5rem 0}td,th{border:1px solid #ddd;padding:.25rem .5rem;text-align:right}
th{background:#f4f4f4}td.l,th.l{text-align:left}td.l{overflow-wrap:anywhere}.note{color:#555;font-size:.85rem}.warn{color:#a40}
.headline{display:flex;gap:2rem;flex-wrap:wrap}.headline div{background:#f7f7f9;padding:.5rem 1rem;border-radius:6px}
.headline b{display:block;font-size:1.4rem}
table.wrap td{white-space:pre-wrap;overflow-wrap:anywhere;max-width:32rem}
"""
# td.l wraps anywhere: a kernel or op name (C++ templates, 120 characters shown) has no spaces to break
# at, and unbroken it widened the Top kernels table of a TraceLens H100 trace to 1,408 px.


def _html_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], left: Sequence[int] = ()) -> str:
    head = "".join(f'<th class="l">{html.escape(h)}</th>' if i in left else f"<th>{html.escape(h)}</th>" for i, h in enumerate(headers))
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="l">{html.escape(str(c))}</td>' if i in left else f"<td>{html.escape(str(c))}</td>" for i, c in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _figure_html(fig) -> str:
    import plotly.io as pio

    fig.update_layout(template="plotly_white", margin=dict(l=60, r=20, t=50, b=50))
    return pio.to_html(
        fig, full_html=False, include_plotlyjs=False, default_height="420px", config={"displaylogo": False, "responsive": True}
    )


def _integer_steps(fig, steps: pd.Series) -> None:
    """Step axes tick on whole steps (plotly would otherwise label 6.2, 6.4, ...)."""
    span = float(steps.max() - steps.min()) if len(steps) else 0.0
    fig.update_xaxes(tickformat="d", dtick=max(1, round(span / 10)))


def _charts(a: "RunAnalysis", top: int) -> dict[str, str]:
    """HTML of each chart the run has data for, by section: breakdown, step_time, mfu, overlap, kernels."""
    import plotly.graph_objects as go

    charts: dict[str, str] = {}
    parts = _parts(a)
    if parts:
        fig = go.Figure()
        labels = [f"rank {r.rank}" for r in a.ranks]
        for p in parts:
            fig.add_bar(name=p, x=labels, y=[(r.breakdown.get(p) or {}).get("mean_ms") for r in a.ranks])
        fig.update_layout(barmode="stack", title="Step breakdown per rank (profiled windows, mean ms per step)",
                          yaxis_title="ms")
        charts["breakdown"] = _figure_html(fig)
    metrics = a.metrics
    if metrics is not None and not metrics.empty and {"rank", "step", "step_time_ms"} <= set(metrics.columns):
        # Run directories: every optimizer step from the metrics records, with
        # the steps that steady-state statistics leave out shaded.
        fig = go.Figure()
        for rank, grp in metrics.sort_values("step").groupby("rank", sort=True):
            fig.add_scatter(name=f"rank {rank}", x=grp["step"], y=grp["step_time_ms"], mode="lines+markers")
        manifest = a.run_manifest
        warmup = manifest.warmup_steps or 0
        if warmup:
            fig.add_vrect(x0=-0.5, x1=warmup - 0.5, fillcolor="grey", opacity=0.15, line_width=0,
                          annotation_text="warmup", annotation_position="top left")
        for step in sorted(set(manifest.profiled_steps)):
            fig.add_vrect(x0=step - 0.5, x1=step + 0.5, fillcolor="orange", opacity=0.15, line_width=0)
        fig.update_layout(title="Step time per optimizer step (metrics records; shaded: warmup, profiled)",
                          xaxis_title="step", yaxis_title="ms")
        _integer_steps(fig, metrics["step"])
        charts["step_time"] = _figure_html(fig)
    elif a.steps is not None and not a.steps.empty:
        fig = go.Figure()
        for rank, grp in a.steps.groupby("rank", sort=True):
            fig.add_scatter(name=f"rank {rank}", x=grp["step"], y=grp["step_time_ms"], mode="lines+markers")
        fig.update_layout(title="Step time per ProfilerStep", xaxis_title="step", yaxis_title="ms")
        _integer_steps(fig, a.steps["step"])
        charts["step_time"] = _figure_html(fig)
    if a.mfu.source != "none" and len(a.mfu.steps):
        fig = go.Figure()
        fig.add_scatter(name="MFU", x=a.mfu.steps["step"], y=100 * a.mfu.steps["mfu"], mode="lines+markers")
        fig.add_scatter(name="HFU (with recompute)", x=a.mfu.steps["step"], y=100 * a.mfu.steps["hfu"],
                        mode="lines+markers")
        fig.update_layout(title=f"MFU and HFU per step ({a.mfu.source})", xaxis_title="step", yaxis_title="% of peak")
        _integer_steps(fig, a.mfu.steps["step"])
        charts["mfu"] = _figure_html(fig)
    if any(r.comm_comp_overlap_pct is not None or r.idle_pct is not None for r in a.ranks):
        fig = go.Figure()
        labels = [f"rank {r.rank}" for r in a.ranks]
        fig.add_bar(name="overlap % (HTA)", x=labels, y=[r.comm_comp_overlap_pct for r in a.ranks])
        fig.add_bar(name="exposed comm % of step", x=labels, y=[r.exposed_comm_pct for r in a.ranks])
        fig.add_bar(name="idle % (HTA)", x=labels, y=[r.idle_pct for r in a.ranks])
        fig.update_layout(barmode="group", title="Overlap and idle per rank", yaxis_title="%")
        charts["overlap"] = _figure_html(fig)
    kernels = top_kernels_table(a, top)
    if not kernels.empty:
        fig = go.Figure(
            go.Bar(
                x=kernels["ms_per_rank"][::-1],
                # Numbered: two kernels can shorten to the same text, and plotly
                # would stack bars that share a category label.
                y=[f"{i + 1}. {short_kernel_name(n, 60)}" for i, n in enumerate(kernels["name"])][::-1],
                orientation="h",
                hovertext=list(kernels["name"][::-1]),
            )
        )
        what = "host ops (inclusive" if _host_ops(a) else "kernels ("
        fig.update_layout(title=f"Top {what} ms per rank over the trace)", xaxis_title="ms", margin=dict(l=400))
        charts["kernels"] = _figure_html(fig)
    return charts


def html_page(title: str, body: str) -> str:
    """A complete HTML document with plotly.js inlined once (works offline)."""
    from plotly.offline import get_plotlyjs

    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
        f"<script type=\"text/javascript\">{get_plotlyjs()}</script></head>"
        f"<body>{body}</body></html>\n"
    )


def _stragglers_html(a: "RunAnalysis") -> str:
    """The straggler verdict, the per-rank table and the evidence as HTML (the text report's lines, as a table)."""
    s = a.stragglers
    out = [f"<p>{html.escape(s.verdict)}</p>"]
    if s.per_rank:
        out.append(_html_table(
            ["rank", "steps", "judged step ms", "ratio", "late ms", "late z", "last in", "others waited ms", "flagged"],
            [[r.rank, r.n_steps, _num(r.step_time_ms), _num(r.step_time_ratio, ".3f"), _num(r.lateness_excess_ms, ".2f"),
              _num(r.lateness_z, ".1f"), f"{r.last_arrivals}/{r.n_collectives}", _num(r.caused_wait_ms, ".1f"),
              "yes" if r.flagged else ""] for r in s.per_rank]))
        out += [f"<p>rank {r.rank}: {html.escape(r.evidence)}</p>" for r in s.per_rank if r.flagged and r.evidence]
        if s.step_source or s.arrival_source:
            out.append(f'<p class="note">steps from {html.escape(s.step_source or "-")}; '
                       f'arrivals from {html.escape(s.arrival_source or "-")}</p>')
    out += [f'<p class="note">note: {html.escape(n)}</p>' for n in s.notes]
    return "".join(out)


def _suggestions_html(a: "RunAnalysis") -> str:
    """The ranked suggestions as one table (rule, finding, change, prediction, confidence)."""
    from analyzer.verbs.suggest.facts import run_facts
    from analyzer.verbs.suggest.render import prediction_text
    from analyzer.verbs.suggest.run import suggest

    suggestions = suggest(a)
    if not suggestions:
        return '<p>none: no rule fired (docs/suggestions.md lists the rules and their thresholds)</p>'
    facts = run_facts(a)
    rows = []
    for i, sg in enumerate(suggestions, 1):
        change = " ".join(sg.change.set_args())
        command = sg.change.command(facts.config_path, facts.world_size) if sg.change.overrides else None
        what = (f"{change}\nrun: {command}" if command else change) if change else sg.change.advice
        rows.append([i, sg.rule, f"{sg.title}: {sg.trigger}", what, prediction_text(sg),
                     "diagnosis" if sg.kind == "diagnosis" else sg.confidence])
    return ('<p class="note">ranked by predicted gain; docs/suggestions.md</p>'
            + _html_table(["#", "rule", "finding", "change or advice", "predicted", "confidence"], rows,
                          left=(1, 2, 3, 4)).replace("<table>", '<table class="wrap">', 1))


def _attribution_html(a: "RunAnalysis", top: int) -> str:
    """The text report's attribution section as HTML tables (ops, modules, annotations); '' without ops."""
    at = a.attribution
    if at is None or at.ops.empty:
        return ""
    lines = attribution_lines(a, top)
    n_ranks = max(1, len(at.totals))
    ops = at.summed("ops").head(top)
    body = [f'<h2>Where device time goes</h2><p class="note">{html.escape(lines[0])}. Definitions: docs/metrics.md, '
            '"Attribution".</p>']
    body.append(_html_table(
        ["op", "dir", "calls", "device ms", "incl ms", "host ms", "% of step"],
        [[short_kernel_name(r.op, 80), "bwd" if r.backward else "fwd", r.calls // n_ranks, _num(r.device_ms / n_ranks, ".3f"),
          _num(r.device_inclusive_ms / n_ranks, ".3f"), _num(r.host_ms / n_ranks, ".3f"), _num(r.share_of_step_pct)]
         for r in ops.itertuples(index=False)], left=(0, 1)))
    mods = at.summed("modules")
    if not mods.empty:
        mods = mods.loc[mods["depth"] <= 2].sort_values(["device_ms", "host_ms"], ascending=False).head(4 * top)
        body.append("<h3>Modules (inclusive, per rank)</h3>" + _html_table(
            ["module", "dir", "calls", "device ms", "self ms", "host ms"],
            [[m.module, "bwd" if m.backward else "fwd", m.calls // n_ranks, _num(m.device_ms / n_ranks, ".3f"),
              _num(m.device_self_ms / n_ranks, ".3f"), _num(m.host_ms / n_ranks, ".3f")] for m in mods.itertuples(index=False)],
            left=(0, 1)))
    return "".join(body)


def render_html(a: "RunAnalysis", *, top: int = 15) -> str:
    """A self-contained HTML report of one run: headline, tables and plotly charts."""
    m = a.mfu
    mfu_text = _pct(m.median, 2) if m.source != "none" else "none"
    hfu_text = _pct(m.hfu_median, 2) if m.source != "none" else "none"
    st = a.step_time
    step_text = f"{_num(st.ms, '.2f')} ms" if st.ms is not None else "-"
    step_note = st.label + (f"; profiled windows {_num(st.profiled_ms, '.2f')} ms"
                            if st.source == "steady_state" and st.profiled_ms is not None else "")
    flagged = ", ".join(str(r) for r in a.stragglers.ranks) or "none"
    body = [
        f"<h1>analyzer report</h1><p class=\"note\">{html.escape(path_text(a.path))}<br>{html.escape(_kind_text(a))}"
        f" &middot; generated {datetime.now(timezone.utc).isoformat(timespec='seconds')} by analyzer {package_version()}</p>",
        '<div class="headline">'
        f"<div>MFU<b>{html.escape(mfu_text)}</b>{html.escape(m.source)}</div>"
        f"<div>HFU<b>{html.escape(hfu_text)}</b>with recompute</div>"
        f"<div>step time<b>{html.escape(step_text)}</b>{html.escape(step_note)}</div>"
        f"<div>stragglers<b>{html.escape(flagged)}</b></div></div>",
    ]
    warns = warning_lines(a)
    if warns:
        items = [f'<li class="warn">{html.escape(w)}</li>' if w.startswith("skipped: ") else f"<li>{html.escape(w)}</li>"
                 for w in warns]
        body.append(f"<h2>Input problems and warnings</h2><ul>{''.join(items)}</ul>")
    rows = [
        [r.rank, r.source or "-", r.n_steps, *_rank_step_cells(a, r), _num(r.compute_pct), _num(r.comm_comp_overlap_pct),
         _num(r.exposed_comm_pct), _num(r.idle_pct), r.device_name or "-"]
        for r in a.ranks
    ]
    body.append("<h2>Per rank</h2>" + _html_table(
        ["rank", "timeline", "steps", *_rank_step_headers(a), "compute %", "overlap % (HTA)", "exposed comm %",
         "idle % (HTA)", "device"],
        rows, left=(1, 8 + _has_steady(a))))
    body.append(
        f'<p class="note">{html.escape(step_time_text(a))}. steady ms: median over the rank\'s steady-state metrics '
        "steps; profiled ms: median over its ProfilerStep windows (the steps of the breakdown, overlap and idle). "
        "overlap % (HTA): time in which communication and compute kernels both run, over communication "
        "time. exposed comm %: communication not hidden by compute, over step time. idle % (HTA): time with no GPU "
        "activity over the span of device events. Definitions: docs/metrics.md.</p>"
    )
    charts = _charts(a, top)
    from analyzer.metrics.curves import report_html as curves_html  # issue 15: per-step training curves
    body.append(curves_html(a.manifest, a.metrics))
    if _has_timeline(a):
        body.append("<h2>Whole-trace GPU timeline</h2>" + f'<p class="note">{html.escape(TIMELINE_TITLE)}. '
                    f"{html.escape(TIMELINE_NOTE.strip())}</p>" + _html_table(_TIMELINE_HEADERS, _timeline_rows(a)))
        if not _parts(a):
            body.append(f'<p class="note">{html.escape(NO_STEPS_LINE)}</p>')
    for key, title in (("breakdown", "Step breakdown"), ("overlap", "Overlap and idle"), ("step_time", "Step time")):
        if key in charts:
            extra = f'<p class="note">{html.escape(BREAKDOWN_TITLE)}</p>' if key == "breakdown" else ""
            body.append(f"<h2>{title}</h2>{extra}{charts[key]}")
    body.append("<h2>MFU</h2>" + "".join(f"<p>{html.escape(line.strip())}</p>" for line in _mfu_lines(a)) + charts.get("mfu", ""))
    goodput = _goodput_lines(a)
    if goodput:
        body.append("<h2>Goodput</h2>" + "".join(f"<p>{html.escape(line)}</p>" for line in goodput))
    body.append("<h2>Stragglers</h2>" + _stragglers_html(a))
    body.append("<h2>Suggestions</h2>" + _suggestions_html(a))
    body.append(_attribution_html(a, top))
    kernels = top_kernels_table(a, top)
    if not kernels.empty:
        title = "Top host ops" if _host_ops(a) else "Top kernels"
        body.append(f"<h2>{title}</h2>" + charts.get("kernels", "") + _html_table(
            ["#", "name", "kind", "count", "total ms", "ms/rank", "share %"],
            [[i + 1, short_kernel_name(k.name, 120), k.kind, k.count, _num(k.total_ms, ".2f"), _num(k.ms_per_rank, ".2f"), _num(k.share_pct)]
             for i, k in enumerate(kernels.itertuples(index=False))],
            left=(1, 2)))
    return html_page(f"analyzer report: {path_text(a.path)}", "\n".join(body))


# ----------------------------------------------------------------- compare
def _delta_rows(deltas: Sequence["Delta"], fmt: str = ".2f", kernel: bool = False) -> list[list[str]]:
    rows = []
    for d in deltas:
        name = short_kernel_name(d.name) if kernel else d.name
        pct = "new" if d.delta_pct is None and d.delta else _num(d.delta_pct, "+.1f")
        row = [name] + ([d.kind or "-"] if kernel else []) + [_num(d.base, fmt), _num(d.cand, fmt), _num(d.delta, "+" + fmt), pct]
        rows.append(row)
    return rows


def _growth_text(c: "Comparison") -> str:
    return f"; growth of the peak {_num(100 * c.memory_growth, '+.1f')}%" if c.memory_growth is not None else ""


def render_compare_text(c: "Comparison", *, top: int = 10) -> str:
    """What ``analyzer compare`` prints: MFU, step time, phases, kernels, ops, modules, ranks; largest first."""
    out = [f"analyzer compare\n  base: {c.base_path}\n  cand: {c.cand_path}", ""]
    m = c.mfu
    if m.base is not None and m.cand is not None:
        # Each run's own MFU first (the figure of its report and the runs page), then the comparable one.
        rescaled = (f"; candidate on the baseline's measured peak {_pct(m.cand_on_base_peak, 2)}, which the change uses"
                    if m.cand_on_base_peak is not None else "")
        out.append(
            f"MFU: {_pct(m.base, 2)} -> {_pct(m.cand, 2)} ({100 * m.delta:+.2f} points, drop {m.drop:+.1%}{rescaled})"
            f"  [{m.base_source} / {m.cand_source}]"
        )
    else:
        out.append(f"MFU: {_pct(m.base, 2) if m.base is not None else 'none'} -> {_pct(m.cand, 2) if m.cand is not None else 'none'}")
    if m.base_hfu is not None or m.cand_hfu is not None:
        out.append(f"HFU (with recompute): {_pct(m.base_hfu, 2) if m.base_hfu is not None else 'none'} -> "
                   f"{_pct(m.cand_hfu, 2) if m.cand_hfu is not None else 'none'}")
    st, sm = c.step_time, c.step_time_median
    out.append(
        f"Step time: {_num(sm.base, '.2f')} -> {_num(sm.cand, '.2f')} ms ({_num(sm.delta, '+.2f')} ms, "
        f"{_num(sm.delta_pct, '+.1f')}%; each run's headline step time); mean over the phase rows "
        f"{_num(st.base, '.2f')} -> {_num(st.cand, '.2f')} ms ({_num(st.delta, '+.2f')} ms, the phases add up to it)"
    )
    out.append("")
    if c.phases:
        out.append(f"Phases, largest change first ({c.phase_source})")
        out.append(format_table(["phase", "base ms", "cand ms", "delta ms", "delta %"], _delta_rows(c.phases), left=(0,)))
        out.append("")
    if c.kernels:
        out.append(f"Kernels, largest change first ({c.kernel_source})")
        out.append(
            format_table(["name", "kind", "base ms", "cand ms", "delta ms", "delta %"], _delta_rows(c.kernels[:top], ".3f", kernel=True), left=(0, 1))
        )
        out.append("")
    for title, deltas, what in (("Ops", c.ops, "op"), ("Modules", c.modules, "module")):
        if deltas:
            out.append(f"{title}, largest change first ({c.op_source})")
            out.append(format_table([what, "pass", "base ms", "cand ms", "delta ms", "delta %"],
                                    _delta_rows(deltas[:top], ".3f", kernel=True), left=(0, 1)))
            out.append("")
    if c.memory:
        out.append(f"Peak memory ({c.memory_source}){_growth_text(c)}")
        out.append(format_table(["", "base MiB", "cand MiB", "delta MiB", "delta %"], _delta_rows(c.memory, ".1f"), left=(0,)))
        out.append("")
    if c.ranks:
        out.append("Per-rank median step time")
        out.append(format_table(["rank", "base ms", "cand ms", "delta ms", "delta %"], _delta_rows(c.ranks), left=(0,)))
    out += [f"note: {n}" for n in c.notes]
    return printable("\n".join(out).rstrip() + "\n")


# ----------------------------------------------------------------- check
def render_check_text(outcome: "GateOutcome", explanation: str) -> str:
    """What ``analyzer check`` prints: the verdict line, then the explanation paragraph."""
    r = outcome.result
    lines = [f"analyzer check: {outcome.verdict_label}", "", explanation, ""]
    lines.append(f"baseline:  {r.base_source}")
    lines.append(f"candidate: {r.cand_source}")
    lines += [f"note: {n}" for n in r.notes]
    return printable("\n".join(lines).rstrip() + "\n")


def _md_escape(text: str) -> str:
    return re.sub(r"([\\`*_{}\[\]<>|#])", r"\\\1", text)


def render_check_markdown(outcome: "GateOutcome", explanation: str, *, top: int = 5) -> str:
    """A Markdown summary for a CI job summary (e.g. ``$GITHUB_STEP_SUMMARY``)."""
    r, c = outcome.result, outcome.comparison
    icon = {"regression": ":x:", "inconclusive": ":warning:"}.get(outcome.verdict, ":white_check_mark:")
    verdict = {"regression": "regression", "inconclusive": "inconclusive, too noisy"}.get(outcome.verdict, "within bounds")
    fmt = (lambda v: f"{100 * v:.2f}%") if r.metric == "mfu" else (lambda v: f"{v:,.3f}")
    lines = [
        f"## {icon} analyzer check: {verdict}",
        "",
        _md_escape(explanation),
        "",
        "| | baseline | candidate | change |",
        "|---|---:|---:|---:|",
        f"| {r.statistic_label} | {fmt(r.base_value)} | {fmt(r.cand_value)} | {-r.drop:+.1%} |",
    ]
    st = c.step_time
    if st.base is not None and st.cand is not None:
        lines.append(f"| mean step time | {st.base:.1f} ms | {st.cand:.1f} ms | {_num(st.delta_pct, '+.1f')}% |")
    g = outcome.goodput
    if g is not None:
        base = f"{g.base_goodput:.1%}" if g.base_goodput is not None else "n/a"
        lines.append(f"| goodput (floor {g.min_goodput:.1%}) | {base} | {g.goodput:.1%} | "
                     f"{'below the floor' if g.failed else 'ok'} |")
    mg = outcome.memory
    if mg is not None:
        lines.append(f"| peak memory, MiB (allowed {mg.max_growth:+.1%}) | {mg.base_bytes / 2**20:,.1f} | "
                     f"{mg.cand_bytes / 2**20:,.1f} | {mg.growth:+.1%}{', over' if mg.failed else ''} |")
    lines += [
        f"| steady-state steps | {r.n_base} | {r.n_cand} | |",
        "",
        f"Gate: regression when the {_md_escape(r.statistic_label)} drops by more than {r.max_drop:.1%}, the one-sided "
        f"Mann-Whitney U test gives p < {r.alpha} (here p = {r.p_value:.3g}) **and** the drop exceeds the runs' own "
        f"noise (here {r.noise:.1%}); inconclusive when that noise exceeds {r.max_drop:.1%}.",
    ]
    if c.phases:
        lines += ["", f"**Phases** ({_md_escape(c.phase_source)})", "", "| phase | base ms | cand ms | delta ms | delta % |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {_md_escape(row[0])} | " + " | ".join(row[1:]) + " |" for row in _delta_rows(c.phases[:top])]
    if c.kernels:
        lines += ["", f"**Kernels** ({_md_escape(c.kernel_source)})", "", "| kernel | kind | base ms | cand ms | delta ms | delta % |",
                  "|---|---|---:|---:|---:|---:|"]
        lines += [f"| `{row[0].replace('`', '')}` | " + " | ".join(row[1:]) + " |" for row in _delta_rows(c.kernels[:top], ".3f", kernel=True)]
    for title, deltas, what in (("Ops", c.ops, "op"), ("Modules", c.modules, "module")):
        if deltas:
            lines += ["", f"**{title}** ({_md_escape(c.op_source)})", "", f"| {what} | pass | base ms | cand ms | delta ms | delta % |",
                      "|---|---|---:|---:|---:|---:|"]
            lines += [f"| `{row[0].replace('`', '')}` | " + " | ".join(row[1:]) + " |" for row in _delta_rows(deltas[:top], ".3f", kernel=True)]
    if c.memory:
        lines += ["", f"**Peak memory** ({_md_escape(c.memory_source + _growth_text(c))})", "",
                  "| | base MiB | cand MiB | delta MiB | delta % |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {_md_escape(row[0])} | " + " | ".join(row[1:]) + " |" for row in _delta_rows(c.memory, ".1f")]
    return printable("\n".join(lines) + "\n")
