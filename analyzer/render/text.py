"""Plain text: what the CLI prints for ``report``, ``compare``, ``check``, ``history`` and ``suggest``.

Every function draws a result computed elsewhere (analyzer.api, analyzer.verbs)
with the formatters of :mod:`analyzer.render.format`; none computes a metric.
Names from trace files pass through :func:`~analyzer.verbs.printable.printable`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

from analyzer.jsontext import path_text
from analyzer.render import critical_path as cp_rows
from analyzer.render.format import (
    delta_rows,
    growth_text,
    mib,
    num,
    pct,
    points_change,
    prediction_text,
    coverage_text,
    evidence_value,
    short_kernel_name,
)
from analyzer.render.rows import (
    AnnotationRow,
    IdleRow,
    KernelRow,
    MemoryRankRow,
    ModuleRow,
    OpRow,
    RooflineOpRow,
    TracePeakRow,
    table_rows,
)
from analyzer.verbs.printable import printable
from analyzer.verbs.report import top_kernels_table

if TYPE_CHECKING:
    from analyzer.api import RankSummary, RunAnalysis
    from analyzer.metrics.attribution import RunAttribution
    from analyzer.metrics.mfu import MfuResult
    from analyzer.metrics.step_time import StepTime
    from analyzer.verbs.check import GateOutcome
    from analyzer.verbs.compare import Comparison
    from analyzer.verbs.history import History
    from analyzer.verbs.suggest.engine import Suggestion


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


def kind_text(a: "RunAnalysis") -> str:
    n = len(a.ranks)
    if a.kind == "reftrain":
        m = a.run_manifest
        return f"reftrain run {m.run_id or '?'} ({m.status or '?'}), {n} rank(s)"
    return f"Kineto traces, {n} rank(s)"


def breakdown_parts(a: "RunAnalysis") -> list[str]:
    parts: list[str] = []
    for r in a.ranks:
        parts += [p for p in r.breakdown if p not in parts]
    return parts


def host_ops(a: "RunAnalysis") -> bool:
    """True when the top list holds host ops (CPU-only traces), not device kernels."""
    return a.kernels is not None and not a.kernels.empty and set(a.kernels["source"].astype(str)) == {"host"}


def mfu_lines(a: "RunAnalysis") -> list[str]:
    m = a.mfu
    if m.source == "none" or m.median is None:
        return [f"MFU: none ({m.reason})"] + flop_lines(m)
    peak = f"{m.peak_flops_per_s / 1e12:.3g} TFLOP/s" if m.peak_flops_per_s else "?"
    # A lower bound (FLOP coverage under COVERAGE_MIN) says so in the headline, with its coverage.
    bound = (
        f">= {pct(m.median, 2)} (lower bound: FLOP coverage {pct(m.flop_coverage, 1)})"
        if m.lower_bound
        else pct(m.median, 2)
    )
    lines = [
        f"MFU: {bound} median over {len(m.steps)} step(s), HFU {pct(m.hfu_median, 2)}  [source: {m.source}]",
        f"  peak {peak} per device ({m.peak_source}: {m.peak_detail})" + (f", dtype {m.dtype}" if m.dtype else ""),
    ]
    if m.flops_source:
        lines.append(f"  model FLOPs: {m.flops_source}")
    if m.step_time_source:
        lines.append(f"  step time: {m.step_time_source}")
    return lines + flop_lines(m)


def flop_lines(m: "MfuResult") -> list[str]:
    """FLOPs per device per step, model (MFU) and hardware (HFU), each family's backward, and the notes."""
    lines = []
    if m.flops_per_step is not None:
        hw = m.hardware_flops_per_step if m.hardware_flops_per_step is not None else m.flops_per_step
        lines.append(
            f"  FLOPs per device per step: model {m.flops_per_step / 1e9:,.4g} GFLOP (MFU), "
            f"hardware {hw / 1e9:,.4g} GFLOP (HFU, with recompute)"
        )
    if m.backward_families:
        lines.append("  backward per family: " + ", ".join(f"{f} {mode}" for f, mode in m.backward_families.items()))
    return lines + [f"  note: {n}" for n in m.notes]


def goodput_lines(a: "RunAnalysis") -> list[str]:
    """The run's goodput and where the rest of the wall time went; none for trace folders (no run.json)."""
    gp = a.goodput()  # docs/rundir.md "Restarts and goodput"
    if gp is None:
        return []
    lost = ", ".join(f"{k} {v:.2f}" for k, v in gp.lost_s.items())
    extra = f", {gp.recomputed_steps} step(s) recomputed" if gp.recomputed_steps else ""
    extra += f", {gp.hung_attempts} hung attempt(s)" if gp.hung_attempts else ""
    extra += ", preempted (resumable)" if gp.preempted else ""
    return [
        f"Goodput: {pct(gp.goodput, 1)} (productive step time {gp.productive_s:.2f} s of wall "
        f"{gp.wall_s:.2f} s, {gp.attempts} attempt(s){extra}); lost s: {lost}"
    ]


def straggler_lines(a: "RunAnalysis") -> list[str]:
    s = a.stragglers
    lines = [f"Stragglers: {s.verdict}"]
    if s.per_rank:
        rows = [
            [
                r.rank,
                r.n_steps,
                num(r.step_time_ms),
                num(r.step_time_ratio, ".3f"),
                num(r.lateness_excess_ms, ".2f"),
                num(r.lateness_z, ".1f"),
                f"{r.last_arrivals}/{r.n_collectives}",
                num(r.caused_wait_ms, ".1f"),
                "yes" if r.flagged else "",
            ]
            for r in s.per_rank
        ]
        table = format_table(
            ["rank", "steps", "judged step ms", "ratio", "late ms", "late z", "last in", "others waited ms", "flagged"],
            rows,
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
    text = f"Step time: {num(st.ms, '.2f')} ms, {st.label}, median over {_n_steps(st)} of the mean over ranks"
    if st.source == "steady_state" and st.profiled_ms is not None:
        text += f"; profiled windows {num(st.profiled_ms, '.2f')} ms over {st.n_profiled_steps} step(s) (the breakdown's steps)"
    return text


def _n_steps(st: "StepTime") -> str:
    n = st.n_steady_steps if st.source == "steady_state" else st.n_profiled_steps
    return f"{n} step(s)"


def has_steady(a: "RunAnalysis") -> bool:
    return any(r.steady_step_time_ms is not None for r in a.ranks)


def rank_step_headers(a: "RunAnalysis") -> list[str]:
    """Per-rank step time columns: steady-state and profiled side by side when the run has both kinds."""
    return ["steady ms", "profiled ms"] if has_steady(a) else ["profiled ms"]


def rank_step_cells(a: "RunAnalysis", r: "RankSummary") -> list[str]:
    cells = [num(r.steady_step_time_ms)] if has_steady(a) else []
    return cells + [num(r.profiled_step_time_ms)]


def rank_rows(a: "RunAnalysis") -> list[list[object]]:
    """The per-rank table's rows, as the text and HTML reports show them."""
    return [
        [
            r.rank,
            r.source or "-",
            r.n_steps,
            *rank_step_cells(a, r),
            num(r.compute_pct),
            num(r.comm_comp_overlap_pct),
            num(r.exposed_comm_pct),
            num(r.idle_pct),
            r.device_name or "-",
        ]
        for r in a.ranks
    ]


TIMELINE_PARTS = ("computation", "exposed_comm", "exposed_memcpy", "idle")
TIMELINE_TITLE = (
    "Whole-trace GPU timeline (TraceLens's gpu_timeline definition: % of each rank's GPU span, "
    "first to last device event; the parts sum to 100)"
)
TIMELINE_NOTE = (
    "  computation: some compute kernel runs; exposed comm: communication with no compute; exposed memcpy: "
    "copies/memsets with neither; idle: no device activity, gaps between steps included."
)
NO_STEPS_LINE = (
    "No ProfilerStep windows in the trace(s): no per-step breakdown; the whole-trace GPU timeline above is "
    "the only breakdown."
)
BREAKDOWN_TITLE = (
    "Step breakdown over the profiled windows (mean ms per step, % of step time; the parts sum to "
    "the profiled step time; idle counts host time inside a step)"
)


def has_timeline(a: "RunAnalysis") -> bool:
    return any(r.gpu_timeline for r in a.ranks)


def timeline_rows(a: "RunAnalysis") -> list[list[object]]:
    return [
        [r.rank, num(r.gpu_span_ms, ".2f"), *(num(r.gpu_timeline.get(p), ".2f") for p in TIMELINE_PARTS)]
        for r in a.ranks
        if r.gpu_timeline
    ]


TIMELINE_HEADERS = ["rank", "GPU span ms", "computation %", "exposed comm %", "exposed memcpy %", "idle %"]


def warning_lines(a: "RunAnalysis") -> list[str]:
    """Every input and window warning, and the FLOP-coverage warning, one line each (also on stderr and in JSON)."""
    lines = [f"skipped: {e}" for e in a.errors] + [str(w) for w in a.warnings]
    m = a.mfu
    if m.lower_bound and m.flop_coverage is not None:
        lines.append(
            f"MFU from shapes is a lower bound: FLOP coverage {pct(m.flop_coverage, 1)} of GEMM/attention/conv "
            f"{_coverage_time(m)}; no suggestion uses it"
        )
    elif m.source == "none" and m.flop_coverage is not None and m.flop_coverage < 1.0:
        lines.append(
            f"MFU withheld: FLOP coverage {pct(m.flop_coverage, 1)} of GEMM/attention/conv {_coverage_time(m)}"
        )
    return [" ".join(line.split()) for line in lines]  # one line each, whatever the message held


def _coverage_time(m: "MfuResult") -> str:
    """What the FLOP coverage is a share of: kernel time where kernels link to their ops, else host op time."""
    return (
        "kernel time"
        if m.attribution == "kernels"
        else "host op time"
        if m.attribution == "host-ops"
        else "kernel and host op time"
    )


def report_text(a: "RunAnalysis", *, top: int = 10) -> str:
    """The readable report of one run (what ``analyzer report`` prints)."""
    out = [f"analyzer report: {path_text(a.path)}", kind_text(a), "", step_time_text(a), ""]
    warns = warning_lines(a)
    if warns:
        out.append(f"Warnings ({len(warns)})")
        out += [f"  {w}" for w in warns]
        out.append("")
    rows = rank_rows(a)
    out.append("Per rank")
    out.append(
        format_table(
            [
                "rank",
                "timeline",
                "steps",
                *rank_step_headers(a),
                "compute %",
                "overlap % (HTA)",
                "exposed comm %",
                "idle % (HTA)",
                "device",
            ],
            rows,
            left=(1, 8 + has_steady(a)),
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
    if has_timeline(a):
        out.append(TIMELINE_TITLE)
        out.append(format_table(TIMELINE_HEADERS, timeline_rows(a)))
        out.append(TIMELINE_NOTE)
        out.append("")
    parts = breakdown_parts(a)
    if not parts and has_timeline(a):
        out += [NO_STEPS_LINE, ""]
    if parts:
        out.append(BREAKDOWN_TITLE)
        brows = []
        for r in a.ranks:
            cells: list[object] = [r.rank]
            for p in parts:
                b = r.breakdown.get(p)
                cells.append(f"{num(b['mean_ms'], '.2f')} ({num(b['pct'])}%)" if b else "-")
            brows.append(cells)
        out.append(format_table(["rank"] + parts, brows))
        out.append("")
    out += mfu_lines(a)
    out.append("")
    goodput = goodput_lines(a)
    if goodput:
        out += goodput + [""]
    memory = memory_lines(a)
    if memory:
        out += memory + [""]
    out += straggler_lines(a)
    out.append("")
    out.append(report_suggestions_text(a).rstrip())
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
    critical = critical_path_lines(a)
    if critical:
        out += critical + [""]
    kernels = top_kernels_table(a, top)
    if not kernels.empty:
        title = "Top host ops (inclusive time)" if host_ops(a) else "Top kernels"
        out.append(f"{title}, all ranks (ms/rank = total over the analysis window / ranks)")
        krows = [
            [
                short_kernel_name(k.name),
                k.kind,
                k.count,
                num(k.total_ms, ".2f"),
                num(k.ms_per_rank, ".2f"),
                num(k.share_pct),
            ]
            for k in table_rows(kernels, KernelRow)
        ]
        out.append(format_table(["name", "kind", "count", "total ms", "ms/rank", "share %"], krows, left=(0, 1)))
    return printable("\n".join(out).rstrip() + "\n")


def memory_lines(a: "RunAnalysis") -> list[str]:
    """Peak memory per rank and the run's peak (docs/metrics.md, "Memory"); [] without memory figures."""
    m = a.memory
    if m.source is None:
        return []
    rss = m.kind == "cpu_rss"
    what = "resident set (RSS) at each step's end" if rss else "peak allocated and reserved bytes"
    steps = (
        "metrics records, steps outside profiler windows"
        if m.source == "metrics"
        else "profiler memory events, ProfilerStep windows"
    )
    lines = [f"Memory, {what}, MiB ({steps}; {m.kind})"]
    reserved = m.peak_reserved_bytes is not None  # CUDA only
    rows = [
        [r.rank, mib(r.peak_allocated_bytes), "-" if r.peak_allocated_step is None else int(r.peak_allocated_step)]
        + (
            [mib(r.peak_reserved_bytes), "-" if r.peak_reserved_step is None else int(r.peak_reserved_step)]
            if reserved
            else []
        )
        + [r.n_steps]
        for r in table_rows(m.ranks, MemoryRankRow)
    ]
    headers = ["rank", "peak RSS" if rss else "peak allocated", "at step"] + (
        ["peak reserved", "at step"] if reserved else []
    )
    lines.append(format_table(headers + ["steps"], rows))
    peak = m.peak_allocated_bytes
    lines.append(
        f"  run peak (max over ranks): {mib(peak)} MiB {'RSS' if rss else 'allocated'}"
        + (f", {mib(m.peak_reserved_bytes)} MiB reserved" if m.peak_reserved_bytes is not None else "")
    )
    tp = m.trace_peaks
    if not tp.empty:
        lines.append(
            "  profiler memory events: "
            + "; ".join(
                f"rank {r.rank} {r.device} {mib(r.peak_allocated_bytes)} allocated, {mib(r.peak_reserved_bytes)} reserved "
                f"({r.n_events} events)"
                for r in table_rows(tp, TracePeakRow)
            )
        )
    return lines


ATTRIBUTION_TOP_KERNELS = (
    2  # per op in the text report (the JSON keeps analyzer.metrics.attribution.TOP_KERNELS_PER_OP)
)


def attribution_lines(a: "RunAnalysis", top: int = 10) -> list[str]:
    """Where device time goes, by op, module and annotation (docs/metrics.md, "Attribution"); [] without ops."""
    at = a.attribution
    if at is None or at.ops.empty:
        return []
    n_ranks = max(1, len(at.totals))
    by_host = float(at.totals["device_ms"].sum()) <= 0  # CPU-only traces: host time is all there is
    return (
        [_attribution_headline(at, n_ranks)]
        + _op_lines(at, n_ranks, by_host, top)
        + _module_lines(at, n_ranks, by_host, top)
        + _annotation_lines(at, n_ranks, top)
    )


def _attribution_headline(at: "RunAttribution", n_ranks: int) -> str:
    """How much of the device time the attribution places, and where it could not."""
    t = at.totals
    device_ms = float(t["device_ms"].sum())
    if device_ms <= 0:
        return "Where the time goes (no device events: host time of ops, modules and annotations, ms per rank)"

    def share(col: str) -> str:
        return pct(float(t[col].sum()) / device_ms)

    return (
        f"Where device time goes ({device_ms / n_ranks:.2f} ms per rank of device events in the window): "
        f"attributed to an op {share('attributed_ms')}, unattributed {share('unattributed_ms')} "
        f"({int(t['n_unattributed'].sum())} events with no launch call or no op around it); backward "
        f"{share('backward_ms')}; launched off the main thread {share('other_thread_ms')}; CUDA-graph replays "
        f"{share('graph_ms')} (attributed to the graph launch); inside an nn.Module range {share('module_ms')}"
    )


def _op_lines(at: "RunAttribution", n_ranks: int, by_host: bool, top: int) -> list[str]:
    """The ``top`` ops by device (or host) time per rank, each with its largest kernels."""
    ops = at.summed("ops")
    ops = ops.sort_values(["host_ms", "op"], ascending=[False, True], kind="stable") if by_host else ops
    kernels = at.summed("op_kernels")
    # Each op's kernels, largest first (ties in table order), gathered in one pass over the table.
    by_op: dict[tuple[str, bool], list[tuple[float, str, int]]] = {}
    for op, bwd, kernel, count, ms in zip(
        kernels["op"], kernels["backward"], kernels["kernel"], kernels["count"], kernels["device_ms"]
    ):
        by_op.setdefault((str(op), bool(bwd)), []).append((float(ms), str(kernel), int(count)))
    rows = []
    for r in table_rows(ops.head(top), OpRow):
        mine = sorted(by_op.get((str(r.op), bool(r.backward)), []), key=lambda k: -k[0])[:ATTRIBUTION_TOP_KERNELS]
        names = "; ".join(f"{short_kernel_name(k, 40)} x{c}" for _, k, c in mine)
        rows.append(
            [
                short_kernel_name(r.op, 48),
                "bwd" if r.backward else "fwd",
                r.calls // n_ranks,
                num(r.device_ms / n_ranks, ".3f"),
                num(r.device_inclusive_ms / n_ranks, ".3f"),
                num(r.host_ms / n_ranks, ".3f"),
                num(r.share_of_step_pct),
                names or "-",
            ]
        )
    return [
        f"Ops by {'host' if by_host else 'device'} time (per rank; bwd: the backward of that forward op, "
        "from autograd sequence numbers; device ms: kernels counted to the op, incl: launched anywhere under it)",
        format_table(
            ["op", "dir", "calls", "device ms", "incl ms", "host ms", "% of step", "top kernels"], rows, left=(0, 1, 7)
        ),
    ]


def _module_lines(at: "RunAttribution", n_ranks: int, by_host: bool, top: int) -> list[str]:
    """The nn.Module tree to depth 2, per rank; [] without module ranges."""
    mods = at.summed("modules")
    if mods.empty:
        return []
    shown = mods.loc[mods["depth"] <= 2]
    order = "host_ms" if by_host else "device_ms"
    # Depth-first: each root's subtree in path order; the largest roots first.
    roots = shown.loc[shown["depth"] == 0].sort_values(order, ascending=False)["module"].unique()[:top]
    mrows = []
    for root in roots:
        sub = shown.loc[(shown["module"] == root) | shown["module"].str.startswith(root + "/")]
        for m in table_rows(sub, ModuleRow):
            name = "  " * int(m.depth) + m.module.rsplit("/", 1)[-1]
            mrows.append(
                [
                    name,
                    "bwd" if m.backward else "fwd",
                    m.calls // n_ranks,
                    num(m.device_ms / n_ranks, ".3f"),
                    num(m.device_self_ms / n_ranks, ".3f"),
                    num(m.host_ms / n_ranks, ".3f"),
                    num(m.share_of_step_pct),
                ]
            )
    return [
        "Module tree (nn.Module ranges, depth <= 2, per rank; device ms inclusive of nested modules)",
        format_table(
            ["module", "dir", "calls", "device ms", "self ms", "host ms", "% of step"],
            mrows[: 4 * top],
            left=(0, 1),
        ),
    ]


def _annotation_lines(at: "RunAttribution", n_ranks: int, top: int) -> list[str]:
    """The ``top`` user annotations by device time, per rank; [] without annotations."""
    annos = at.summed("annotations")
    if annos.empty:
        return []
    annos = annos.sort_values(["device_ms", "host_ms"], ascending=False).head(top)
    arows = [
        [
            short_kernel_name(r.name, 48),
            r.calls // n_ranks,
            num(r.device_ms / n_ranks, ".3f"),
            num(r.host_ms / n_ranks, ".3f"),
            num(r.gpu_ms / n_ranks, ".3f") if r.gpu_calls else "-",
        ]
        for r in table_rows(annos, AnnotationRow)
    ]
    return [
        "User annotations (per rank; device ms: kernels launched under them; GPU ms: their GPU-side "
        "copies, HTA's user annotation breakdown)",
        format_table(["annotation", "calls", "device ms", "host ms", "GPU ms"], arows, left=(0,)),
    ]


def idle_lines(a: "RunAnalysis") -> list[str]:
    """Why the GPU is idle: idle by cause, launch statistics, syncs, pageable copies (docs/metrics.md); [] without GPU."""
    t = a.idle.ranks if a.idle is not None else None
    if t is None or t.empty or not (t["span_ms"] > 0).any():
        return []
    rows = [
        [
            r.rank,
            num(r.idle_pct),
            num(r.host_wait_pct),
            num(r.kernel_wait_pct),
            num(r.other_pct),
            r.n_launches,
            num(r.cpu_duration_us_p50),
            num(r.launch_delay_us_p50),
            num(r.gpu_duration_us_p50),
            pct(r.short_share),
            num(r.syncs_per_step),
            num(r.sync_idle_ms / r.n_steps if r.n_steps else None, ".2f"),
            num(r.pageable_htod_per_step),
        ]
        for r in table_rows(t.loc[t["span_ms"] > 0], IdleRow)
    ]
    return [
        "Why the GPU is idle (HTA's idle breakdown and launch statistics, window as idle % (HTA); per step: "
        "inside the ProfilerStep windows)",
        format_table(
            [
                "rank",
                "idle %",
                "host wait %",
                "kernel wait %",
                "other %",
                "launches",
                "launch us",
                "delay us",
                "kernel us",
                "short %",
                "syncs/step",
                "idle after sync ms/step",
                "pageable HtoD/step",
            ],
            rows,
        ),
        "  host wait: the next kernel was not launched yet; kernel wait: gaps under 30 us between launched kernels; "
        "other: waiting on something else (another stream, a collective). Cause shares are of the idle time.",
        "  launch/delay/kernel us: medians of the launch call, of kernel start - call end, of the kernel; short: "
        "kernels shorter than their launch call (HTA's). syncs: stream/device/event syncs, blocking copies, .item().",
    ]


def critical_path_lines(a: "RunAnalysis") -> list[str]:
    """The critical path per profiled step: its breakdown and top ops (analyzer.render.critical_path); [] without."""
    if not cp_rows.all_paths(a):
        return []
    out = [cp_rows.TITLE, format_table(cp_rows.HEADERS, cp_rows.breakdown_rows(a)), cp_rows.LEGEND]
    out += [line for line in (cp_rows.shown_note(a), cp_rows.OPS_NOTE) if line]
    for p in cp_rows.shown_paths(a):
        out.append(f"  rank {p.rank}, step {p.step} ({num(p.length_ms, '.2f')} ms, {p.n_ops} ops on the path)")
        table = format_table(cp_rows.OPS_HEADERS, cp_rows.ops_rows(p, 60), left=(0, 1, 2))
        out += ["    " + line for line in table.splitlines()]
    return out


def roofline_lines(a: "RunAnalysis", top: int = 10) -> list[str]:
    """Per-op efficiency against the roofline (docs/metrics.md, "Roofline"); [] when no op could be modeled."""
    r = a.roofline()
    if r.ops.empty:
        return []
    ops = r.ops.sort_values(["device_ms", "op"], ascending=[False, True], kind="stable").head(top)

    def tera(x: Any) -> str:  # per second, in T (_num says "-" for a missing or NaN rate)
        return num(None if x is None else float(x) / 1e12, ".2f")

    rows = [
        [
            o.op,
            "bwd" if o.backward else "fwd",
            o.dtype or "-",
            o.calls,
            num(o.device_ms, ".3f"),
            tera(o.achieved_flops_per_s),
            tera(o.achieved_bytes_per_s),
            num(o.flop_per_byte, ".1f"),
            num(o.ridge_flop_per_byte, ".1f"),
            o.bound or "-",
            num(o.efficiency_pct),
        ]
        for o in table_rows(ops, RooflineOpRow)
    ]
    hbm = f"HBM {r.hbm_bytes_per_s / 1e12:.2f} TB/s ({r.hbm_source})" if r.hbm_bytes_per_s else "HBM bandwidth unknown"
    cover = (
        f"{pct(r.modeled_device_ms / r.shapes_device_ms, 1)} of the device time of ops with shapes"
        if r.shapes_device_ms
        else "no op shapes"
    )
    out = [
        f"Roofline per op (all ranks; {r.device_name or 'device unknown'}, {hbm}; modeled: {cover})",
        format_table(
            ["op", "dir", "dtype", "calls", "device ms", "TFLOP/s", "TB/s", "FLOP/B", "ridge", "bound", "eff %"],
            rows,
            left=(0, 1, 2, 9),
        ),
        "  eff %: achieved FLOP/s over peak FLOP/s (compute-bound) or TB/s over the HBM bandwidth (memory-bound); "
        "bound: memory below the ridge point (peak FLOP/s / HBM bandwidth) and for elementwise, reduction, "
        "softmax and normalization ops, else compute. Backward of memory-bound ops: not modeled.",
    ]
    return out + [f"  note: {n}" for n in r.notes]


def compare_text(c: "Comparison", *, top: int = 10) -> str:
    """What ``analyzer compare`` prints: MFU, step time, phases, kernels, ops, modules, ranks; largest first."""
    out = [f"analyzer compare\n  base: {c.base_path}\n  cand: {c.cand_path}", ""]
    m = c.mfu
    if m.base is not None and m.cand is not None:
        # Each run's own MFU first (the figure of its report and the runs page), then the comparable one.
        rescaled = (
            f"; candidate on the baseline's measured peak {pct(m.cand_on_base_peak, 2)}, which the change uses"
            if m.cand_on_base_peak is not None
            else ""
        )
        out.append(
            f"MFU: {pct(m.base, 2)} -> {pct(m.cand, 2)} ({points_change(m.base, m.cand)} points, drop {m.drop:+.1%}{rescaled})"
            f"  [{m.base_source} / {m.cand_source}]"
        )
    else:
        out.append(
            f"MFU: {pct(m.base, 2) if m.base is not None else 'none'} -> {pct(m.cand, 2) if m.cand is not None else 'none'}"
        )
    if m.base_hfu is not None or m.cand_hfu is not None:
        out.append(
            f"HFU (with recompute): {pct(m.base_hfu, 2) if m.base_hfu is not None else 'none'} -> "
            f"{pct(m.cand_hfu, 2) if m.cand_hfu is not None else 'none'}"
        )
    st, sm = c.step_time, c.step_time_median
    out.append(
        f"Step time: {num(sm.base, '.2f')} -> {num(sm.cand, '.2f')} ms ({num(sm.delta, '+.2f')} ms, "
        f"{num(sm.delta_pct, '+.1f')}%; each run's headline step time); mean over the phase rows "
        f"{num(st.base, '.2f')} -> {num(st.cand, '.2f')} ms ({num(st.delta, '+.2f')} ms, the phases add up to it)"
    )
    out.append("")
    if c.phases:
        out.append(f"Phases, largest change first ({c.phase_source})")
        out.append(
            format_table(["phase", "base ms", "cand ms", "delta ms", "delta %"], delta_rows(c.phases), left=(0,))
        )
        out.append("")
    if c.kernels:
        out.append(f"Kernels, largest change first ({c.kernel_source})")
        out.append(
            format_table(
                ["name", "kind", "base ms", "cand ms", "delta ms", "delta %"],
                delta_rows(c.kernels[:top], ".3f", kernel=True),
                left=(0, 1),
            )
        )
        out.append("")
    for title, deltas, what in (("Ops", c.ops, "op"), ("Modules", c.modules, "module")):
        if deltas:
            out.append(f"{title}, largest change first ({c.op_source})")
            out.append(
                format_table(
                    [what, "pass", "base ms", "cand ms", "delta ms", "delta %"],
                    delta_rows(deltas[:top], ".3f", kernel=True),
                    left=(0, 1),
                )
            )
            out.append("")
    if c.memory:
        out.append(f"Peak memory ({c.memory_source}){growth_text(c)}")
        out.append(
            format_table(["", "base MiB", "cand MiB", "delta MiB", "delta %"], delta_rows(c.memory, ".1f"), left=(0,))
        )
        out.append("")
    if c.ranks:
        out.append("Per-rank median step time")
        out.append(format_table(["rank", "base ms", "cand ms", "delta ms", "delta %"], delta_rows(c.ranks), left=(0,)))
    out += [f"note: {n}" for n in c.notes]
    return printable("\n".join(out).rstrip() + "\n")


def check_text(outcome: "GateOutcome", explanation: str) -> str:
    """What ``analyzer check`` prints: the verdict line, then the explanation paragraph."""
    r = outcome.result
    lines = [f"analyzer check: {outcome.verdict_label}", "", explanation, ""]
    lines.append(f"baseline:  {r.base_source}")
    lines.append(f"candidate: {r.cand_source}")
    lines += [f"note: {n}" for n in r.notes]
    return printable("\n".join(lines).rstrip() + "\n")


def history_text(h: "History") -> str:
    """The table ``analyzer history`` prints."""
    rows = [
        [
            p.start_time,
            p.run,
            (p.commit or "-")[:10] + ("+" if p.dirty else ""),
            num(p.mfu and 100 * p.mfu, ".2f"),
            num(p.step_time_ms, ".1f"),
            num(p.tokens_per_s, ".1f"),
            num(p.goodput and 100 * p.goodput, ".1f"),
            p.verdict or ("-" if p.verdict_error is None else "cannot judge"),
            f"CHANGE ({p.direction})" if p.change_point else "",
        ]
        for p in h.points
    ]
    out = [
        f"Run history ({len(h.points)} run(s), by {h.by}); verdict: the CI gate from the previous run",
        format_table(
            ["start", "run", "commit", "MFU %", "step ms", "tokens/s", "goodput %", "verdict", "change point"],
            rows,
            left=(0, 1, 2, 7, 8),
        ),
    ]
    out += [f"  {p.run}: gate cannot judge: {p.verdict_error}" for p in h.points if p.verdict_error]
    out += [f"  skipped {s}" for s in h.skipped]
    return printable("\n".join(out))


def suggestions_text(
    suggestions: Sequence[Suggestion],
    config_path: str | None = None,
    *,
    nproc: int | None = None,
    evidence: bool = True,
) -> str:
    """Ranked suggestions, one block each: why, evidence, change, command, prediction."""
    if not suggestions:
        return "Suggestions: none: no rule fired (docs/suggestions.md lists the rules and their thresholds)\n"
    out = [
        f"Suggestions ({len(suggestions)}, ranked: on traces exposed comm over 20% first, then changes by predicted gain; "
        "docs/suggestions.md)"
    ]
    for i, s in enumerate(suggestions, 1):
        tag = "diagnosis" if s.kind == "diagnosis" else f"confidence {s.confidence}"
        out.append(f"{i:>2}. [{s.rule}] {s.title}  ({tag})")
        out.append(f"    why: {s.trigger}")
        if evidence:
            ev = ", ".join(
                f"{k} {evidence_value(v)}" for k, v in s.evidence.items() if v is not None and k != "verdict"
            )
            out.append(f"    evidence: {ev}")
            if "verdict" in s.evidence:
                out.append(f"    verdict: {s.evidence['verdict']}")
        if s.change.overrides:
            out.append(f"    change: {' '.join(s.change.set_args())}")
            cmd = s.change.command(config_path, nproc)
            if cmd:
                out.append(f"    run: {cmd}")
        out.append(f"    {'advice' if not s.change.overrides else 'plain PyTorch'}: {s.change.advice}")
        if s.predicted is not None:
            out.append(f"    predicted: {prediction_text(s)}")
            out.append(f"      how ({s.predicted.model}): {s.predicted.method}")
        if s.coverage:
            out.append(f"    coverage: {coverage_text(s.coverage)}")
        for note in s.notes:
            out.append(f"    note: {note}")
    return printable("\n".join(out) + "\n")


def report_suggestions_text(ra: "RunAnalysis") -> str:
    """The suggestions section of the text report: the run's ranked suggestions."""
    from analyzer.verbs.suggest.run import suggest
    from analyzer.verbs.suggest.facts import run_facts

    facts = run_facts(ra)
    return suggestions_text(suggest(ra), facts.config_path, nproc=facts.world_size)
