"""What changed between two runs: phase, kernel, rank and MFU deltas.

A pure function over two :class:`~analyzer.api.RunAnalysis` results
(docs/cli.md, "compare"). Every delta is ``cand - base``; tables are sorted
by ``|delta|``, largest first, so the top rows are the largest contributors.

Phases (time per step, ms; **means**, so that the parts' deltas add up to
the step-time delta, which medians do not):

* reftrain run directories with metrics records: the steady-state steps of
  ``metrics/rank*.jsonl`` (``step >= warmup_steps``, not profiled), mean
  over ranks and steps of ``data_wait_ms``, ``forward_ms``,
  ``backward_ms``, ``optimizer_ms``, ``grad_sync_ms`` and ``other`` (step
  time minus those five: logging, the loss all-reduce, Python between
  phases). These steps are not slowed by the profiler and there are more
  of them than traced steps.
* trace folders: the breakdown parts of every (rank, ProfilerStep) row
  (docs/metrics.md, "Step breakdown"), mean over ranks and steps.

Kernels (ms per profiled step): a kernel's (or, on CPU-only traces, a host
op's) total time on a rank over the whole trace divided by that rank's
number of ProfilerStep windows, mean over the ranks; from each run's top
kernels list (50 per rank), where a name absent from one run counts as 0.

Ops and modules (ms per profiled step; docs/metrics.md, "Attribution"):
each run's attribution tables (``RunAnalysis.ops()``, ``.modules()``),
forward and backward kept apart, matched by name (op name, module path) and
direction: a row's time on a rank divided by that rank's number of
ProfilerStep windows, mean over the ranks with attribution tables (a rank
lacking the row counts 0), as for kernels. The time is **device** time
when both runs have device events (each kernel counted to one op, so op
rows add up to the attributed time; a module's time includes its nested
modules), else **host** time (CPU-only traces: inclusive, so nested ops
each carry what they contain). Module rows are listed most specific first:
a module whose change is at least half made of one child module's change
(same direction, same sign) is left out of the list, the child naming the
place better (its figure stays in each run's module tree).

Memory (MiB, 2**20 bytes; docs/metrics.md, "Memory"): each run's peak
(``RunAnalysis.memory``: the max over ranks of each rank's peak; from the
metrics records when the run has them, over the steps outside profiler
windows, else from the traces' profiler memory events), allocated and,
where known, reserved, then each rank's peak allocated. ``memory_growth``
is ``(cand - base) / base`` of the peak allocated (the CI gate's figure,
``check --max-memory-growth``); None when the runs' figures are not of the
same kind (GPU peak allocated against CPU resident set, metrics against
trace).

MFU: the runs' medians (fractions), each the same figure the run shows
everywhere else (``RunAnalysis.mfu.median``: report, runs page). When
reftrain measured both peaks on the same hardware, the candidate's MFU is
also given on the baseline's peak (``cand_on_base_peak``,
:func:`candidate_peak_scale`), side by side with its own, and ``delta =
cand - base`` and ``drop = (base - cand) / base`` (the CI gate's
definition) use that comparable figure.

Step time: ``step_time_median`` is each run's headline step time
(``RunAnalysis.step_time``, docs/metrics.md "Step time"), the same number
as in the run's own report; when one run has steady-state metrics steps
and the other only profiled windows, both sides use their profiled
windows, with a note. ``step_time`` is the **mean** over the phase table's
rows (the phases add up to it), labelled as such wherever it is shown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

import numpy as np
import pandas as pd

from analyzer.metrics.memory import MIB
from analyzer.metrics.mfu import steady_state
from analyzer.jsontext import jsonable, path_text

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis

SCHEMA = "analyzer.compare/1"
METRICS_PHASES = ("data_wait_ms", "forward_ms", "backward_ms", "optimizer_ms", "grad_sync_ms")
# Columns of the steps table that are not breakdown parts.
_STEP_META = ("rank", "step", "start_ns", "end_ns", "step_time_ms", "source", "comm_ms", "mfu")


class DeltaDocument(TypedDict):
    """:meth:`Delta.to_json`: the fields, then ``delta`` and ``delta_pct``."""

    name: str
    base: float | None
    cand: float | None
    kind: str | None
    delta: float
    delta_pct: float | None


class MfuDeltaDocument(TypedDict):
    """:meth:`MfuDelta.to_json`: the fields, then ``cand_comparable``, ``delta`` and ``drop``."""

    base: float | None
    cand: float | None
    base_source: str
    cand_source: str
    cand_on_base_peak: float | None
    base_hfu: float | None
    cand_hfu: float | None
    cand_comparable: float | None
    delta: float | None
    drop: float | None


class ComparisonDocument(TypedDict):
    """``analyzer compare --json`` (schema ``analyzer.compare/1``, :data:`SCHEMA`): :meth:`Comparison.to_json`,
    in this order; ``base`` and ``cand`` are the runs' paths. Units as on :class:`Comparison`."""

    schema: str
    base: str
    cand: str
    step_time_ms: DeltaDocument
    step_time_median_ms: DeltaDocument
    phase_source: str
    phases: list[DeltaDocument]
    kernel_source: str
    kernels: list[DeltaDocument]
    op_source: str
    ops: list[DeltaDocument]
    modules: list[DeltaDocument]
    memory_source: str
    memory: list[DeltaDocument]
    memory_growth: float | None
    ranks: list[DeltaDocument]
    mfu: MfuDeltaDocument
    notes: list[str]


@dataclass(frozen=True)
class Delta:
    """One quantity in both runs; None where a run lacks it (then counted as 0 in ``delta``)."""

    name: str
    base: float | None
    cand: float | None
    kind: str | None = None  # kernels: compute, comm, memcpy, ...; ops and modules: forward, backward; phases: None

    @property
    def delta(self) -> float:
        return (self.cand or 0.0) - (self.base or 0.0)

    @property
    def delta_pct(self) -> float | None:
        """Relative change in percent of the baseline; None when the baseline is 0 or absent."""
        return 100.0 * self.delta / self.base if self.base else None

    def to_json(self) -> DeltaDocument:
        return DeltaDocument(
            name=self.name,
            base=self.base,
            cand=self.cand,
            kind=self.kind,
            delta=self.delta,
            delta_pct=self.delta_pct,
        )


@dataclass(frozen=True)
class MfuDelta:
    """MFU of both runs (fractions 0..1) and where each came from."""

    base: float | None
    cand: float | None  # the candidate's own MFU, as its report and the runs page show it
    base_source: str
    cand_source: str
    cand_on_base_peak: float | None = None  # the candidate on the baseline's measured peak; None when not rescaled
    base_hfu: float | None = None  # each run's HFU (hardware FLOPs: with activation recompute), as its report shows it
    cand_hfu: float | None = None

    @property
    def cand_comparable(self) -> float | None:
        """The candidate figure the deltas use: on the baseline's peak when rescaled, else its own."""
        return self.cand_on_base_peak if self.cand_on_base_peak is not None else self.cand

    @property
    def delta(self) -> float | None:
        cand = self.cand_comparable
        return None if self.base is None or cand is None else cand - self.base

    @property
    def drop(self) -> float | None:
        """``(base - cand) / base``: 0.1 means the candidate's MFU is 10% lower (comparable figure)."""
        cand = self.cand_comparable
        return None if self.base is None or cand is None or self.base == 0 else (self.base - cand) / self.base

    def to_json(self) -> MfuDeltaDocument:
        return MfuDeltaDocument(
            base=self.base,
            cand=self.cand,
            base_source=self.base_source,
            cand_source=self.cand_source,
            cand_on_base_peak=self.cand_on_base_peak,
            base_hfu=self.base_hfu,
            cand_hfu=self.cand_hfu,
            cand_comparable=self.cand_comparable,
            delta=self.delta,
            drop=self.drop,
        )


@dataclass
class Comparison:
    """Result of :func:`compare`; :meth:`to_json` gives schema ``analyzer.compare/1``."""

    base_path: str
    cand_path: str
    step_time: Delta  # mean ms per step, same steps and source as ``phases``
    step_time_median: Delta  # each run's headline step time (RunAnalysis.step_time), ms
    phase_source: str
    phases: list[Delta]  # sorted by |delta| desc; deltas sum to step_time.delta
    kernel_source: str
    kernels: list[Delta]  # ms per profiled step, sorted by |delta| desc
    ranks: list[Delta]  # per-rank median step time (ms), by rank: steady-state metrics steps when both runs have them
    mfu: MfuDelta
    notes: list[str] = field(default_factory=list)
    op_source: str = "none"  # what the op and module times are: device or host time, per profiled step
    ops: list[Delta] = field(default_factory=list)  # ms per profiled step per (op, pass), sorted by |delta| desc
    modules: list[Delta] = field(default_factory=list)  # per (module path, pass), most specific rows, by |delta| desc
    memory_source: str = "none"  # what the memory figures are (kind and source of each run)
    memory: list[Delta] = field(default_factory=list)  # MiB: run peaks (allocated, reserved), then per rank
    memory_growth: float | None = None  # (cand - base) / base of the peak allocated; None when not comparable

    def __repr__(self) -> str:
        # A console shows this; the generated repr printed every delta (several KB). A notebook shows the
        # HTML view instead (analyzer/render/notebook.py). Equality and to_json are the dataclass's.
        def mfu(x: float | None) -> str:
            return "-" if x is None else f"{100 * x:.2f}%"

        def ms(x: float | None) -> str:
            return "-" if x is None else f"{x:.2f} ms"

        sm = self.step_time_median
        top = self.phases[0] if self.phases else None
        return (
            f"<Comparison {self.base_path} -> {self.cand_path}"
            + f"\n  MFU: {mfu(self.mfu.base)} -> {mfu(self.mfu.cand)}"
            + f"\n  step time: {ms(sm.base)} -> {ms(sm.cand)}"
            + ("" if top is None else f"\n  largest phase change: {top.name} {top.delta:+.2f} ms per step")
            + f"\n  {len(self.phases)} phases, {len(self.kernels)} kernels, {len(self.ops)} ops compared>"
        )

    def growing_phases(self, n: int = 3) -> list[Delta]:
        """The ``n`` phases that grew the most (positive delta), largest first."""
        return sorted((d for d in self.phases if d.delta > 0), key=lambda d: -d.delta)[:n]

    def growing_kernels(self, n: int = 3) -> list[Delta]:
        """The ``n`` kernels that grew the most (positive delta), largest first."""
        return sorted((d for d in self.kernels if d.delta > 0), key=lambda d: -d.delta)[:n]

    def growing_ops(self, n: int = 3) -> list[Delta]:
        """The ``n`` (op, pass) rows that grew the most, largest first."""
        return sorted((d for d in self.ops if d.delta > 0), key=lambda d: -d.delta)[:n]

    def growing_modules(self, n: int = 3) -> list[Delta]:
        """The ``n`` (module path, pass) rows that grew the most, largest first (most specific rows only)."""
        return sorted((d for d in self.modules if d.delta > 0), key=lambda d: -d.delta)[:n]

    def to_json(self) -> ComparisonDocument:
        doc = ComparisonDocument(
            schema=SCHEMA,
            base=self.base_path,
            cand=self.cand_path,
            step_time_ms=self.step_time.to_json(),
            step_time_median_ms=self.step_time_median.to_json(),
            phase_source=self.phase_source,
            phases=[d.to_json() for d in self.phases],
            kernel_source=self.kernel_source,
            kernels=[d.to_json() for d in self.kernels],
            op_source=self.op_source,
            ops=[d.to_json() for d in self.ops],
            modules=[d.to_json() for d in self.modules],
            memory_source=self.memory_source,
            memory=[d.to_json() for d in self.memory],
            memory_growth=self.memory_growth,
            ranks=[d.to_json() for d in self.ranks],
            mfu=self.mfu.to_json(),
            notes=list(self.notes),
        )
        # NaN and numpy scalars (from the tables) become plain JSON values; the keys stay those of the type.
        sanitized: ComparisonDocument = jsonable(doc)
        return sanitized


def _by_abs_delta(deltas: list[Delta]) -> list[Delta]:
    return sorted(deltas, key=lambda d: (-abs(d.delta), d.name))


# ----------------------------------------------------------------- phases
def _metrics_phase_table(a: "RunAnalysis") -> pd.DataFrame | None:
    """Steady-state metrics rows with the five phases plus ``other_ms``; None when unusable."""
    metrics = a.metrics
    if metrics is None or metrics.empty or not {"rank", "step", "step_time_ms"} <= set(metrics.columns):
        return None
    manifest = a.run_manifest
    steady = steady_state(metrics, manifest.warmup_steps or 0, manifest.profiled_steps)
    if steady.empty:
        return None
    # A phase the records lack is a column of zeros (the scalar broadcasts).
    cols: dict[str, pd.Series | float] = {"step_time_ms": pd.to_numeric(steady["step_time_ms"], errors="coerce")}
    for phase in METRICS_PHASES:
        cols[phase] = pd.to_numeric(steady[phase], errors="coerce") if phase in steady.columns else 0.0
    table = pd.DataFrame(cols, index=steady.index).fillna(0.0)
    table["other_ms"] = table["step_time_ms"] - table[list(METRICS_PHASES)].sum(axis=1)
    return table


def _trace_phase_table(a: "RunAnalysis") -> pd.DataFrame | None:
    steps = a.steps
    if steps is None or steps.empty:
        return None
    parts = [c for c in steps.columns if c not in _STEP_META and c.endswith("_ms")]
    return steps[["step_time_ms"] + parts].astype(float)


def _phase_tables(base: "RunAnalysis", cand: "RunAnalysis") -> tuple[pd.DataFrame | None, pd.DataFrame | None, str]:
    mb, mc = _metrics_phase_table(base), _metrics_phase_table(cand)
    if mb is not None and mc is not None:
        return (
            mb,
            mc,
            "metrics JSONL, steady-state steps (warmup and profiled steps excluded), mean over ranks and steps",
        )
    tb, tc = _trace_phase_table(base), _trace_phase_table(cand)
    sources = {
        str(s) for a in (base, cand) if a.steps is not None and not a.steps.empty for s in a.steps["source"].unique()
    }
    timeline = " and ".join(sorted(sources)) or "no"
    return tb, tc, f"trace breakdown ({timeline} timeline), ProfilerStep windows, mean over ranks and steps"


def _phase_deltas(tb: pd.DataFrame | None, tc: pd.DataFrame | None) -> tuple[Delta, Delta, list[Delta]]:
    def mean(t: pd.DataFrame | None, col: str) -> float | None:
        return float(t[col].mean()) if t is not None and col in t.columns and len(t) else None

    def median(t: pd.DataFrame | None, col: str) -> float | None:
        return float(t[col].median()) if t is not None and col in t.columns and len(t) else None

    names: list[str] = []
    for t in (tb, tc):
        if t is not None:
            names += [c for c in t.columns if c != "step_time_ms" and c not in names]
    phases = [Delta(n.removesuffix("_ms"), mean(tb, n), mean(tc, n)) for n in names]
    step = Delta("step_time", mean(tb, "step_time_ms"), mean(tc, "step_time_ms"))
    step_median = Delta("step_time_median", median(tb, "step_time_ms"), median(tc, "step_time_ms"))
    return step, step_median, _by_abs_delta(phases)


def _headline_step_times(base: "RunAnalysis", cand: "RunAnalysis") -> tuple[Delta, str | None]:
    """Both runs' headline step times, or both profiled-window ones when the headlines cover different steps."""
    b, c = base.step_time, cand.step_time
    if b.source == c.source or b.ms is None or c.ms is None:
        return Delta("step_time_median", b.ms, c.ms), None
    note = (
        f"step time: the baseline's headline covers {b.label}, the candidate's {c.label}; "
        f"compared over both runs' profiled windows instead"
    )
    return Delta("step_time_median", b.profiled_ms, c.profiled_ms), note


# ----------------------------------------------------------------- kernels
def _kernel_ms_per_step(a: "RunAnalysis") -> pd.DataFrame:
    """name, kind, ms_per_step (mean over ranks), from the top-kernels table."""
    k = a.kernels
    if k is None or k.empty:
        return pd.DataFrame({"name": [], "kind": [], "ms_per_step": []})
    n_steps = a.steps.groupby("rank").size() if a.steps is not None and not a.steps.empty else pd.Series(dtype=float)
    ranks = sorted(int(r) for r in k["rank"].unique())
    frame = k[["rank", "name", "kind", "total_ms"]].copy()
    frame["name"] = frame["name"].astype(str)
    # A trace without ProfilerStep windows counts as one window.
    frame["per_step"] = frame["total_ms"].astype(float) / frame["rank"].map(n_steps).fillna(1).clip(lower=1).astype(
        float
    )
    grouped = frame.groupby("name", sort=False).agg(kind=("kind", "first"), total=("per_step", "sum"))
    grouped["ms_per_step"] = grouped["total"] / len(ranks)  # ranks lacking a kernel contribute 0
    return grouped.reset_index()[["name", "kind", "ms_per_step"]]


def _has_kernels(a: "RunAnalysis") -> bool:
    return a.kernels is not None and not a.kernels.empty


def _kernel_deltas(base: "RunAnalysis", cand: "RunAnalysis", top: int | None) -> tuple[list[Delta], str]:
    kb, kc = _kernel_ms_per_step(base), _kernel_ms_per_step(cand)
    joined = kb.merge(kc, on="name", how="outer", suffixes=("_base", "_cand"))
    deltas = [
        Delta(
            name=name,
            base=float(base_ms) if pd.notna(base_ms) else 0.0,
            cand=float(cand_ms) if pd.notna(cand_ms) else 0.0,
            kind=str(kind_base if pd.notna(kind_base) else kind_cand),
        )
        for name, base_ms, cand_ms, kind_base, kind_cand in zip(
            *(joined[c].tolist() for c in ("name", "ms_per_step_base", "ms_per_step_cand", "kind_base", "kind_cand"))
        )
    ]
    sources = {
        str(s)
        for a in (base, cand)
        if a.kernels is not None and not a.kernels.empty
        for s in a.kernels["source"].unique()
    }
    what = (
        "host ops (inclusive time)"
        if sources == {"host"}
        else "device kernels"
        if sources == {"device"}
        else "kernels and host ops"
    )
    source = f"{what}, ms per profiled step, mean over ranks"
    deltas = _by_abs_delta(deltas)
    return (deltas if top is None else deltas[:top]), source


# ----------------------------------------------------------------- ops and modules
def labelled(d: Delta) -> str:
    """An op or module delta's name, ``backward`` added on backward rows: ``blocks.7/attn backward``.

    Other rows (``kind`` forward) are everything outside autograd nodes:
    the forward pass, and also the optimizer and collectives; they keep
    their bare name."""
    return f"{d.name} backward" if d.kind == "backward" else d.name


def _attribution_clock(a: "RunAnalysis") -> str | None:
    """``device`` when the run's attribution saw device events, ``host`` when only host ops; None without tables."""
    at = a.attribution
    if at is None or at.totals.empty or (at.ops.empty and at.modules.empty):
        return None
    return "device" if float(pd.to_numeric(at.totals["device_ms"], errors="coerce").fillna(0.0).sum()) > 0 else "host"


def _per_step(a: "RunAnalysis", table: pd.DataFrame, key: str, column: str) -> pd.Series:
    """``column`` (ms) per (``key``, pass) per profiled step, mean over the run's ranks with attribution tables."""
    if table.empty:
        return pd.Series(dtype=np.float64)
    n_steps = a.steps.groupby("rank").size() if a.steps is not None and not a.steps.empty else pd.Series(dtype=float)
    ranks = a.attribution.totals["rank"].nunique() if a.attribution is not None else 1
    frame = pd.DataFrame(
        {
            "name": table[key].astype(str).to_numpy(),
            "pass": np.where(table["backward"].astype(bool).to_numpy(), "backward", "forward"),
            # A trace without ProfilerStep windows counts as one window (as for kernels).
            "ms": pd.to_numeric(table[column], errors="coerce").fillna(0.0).to_numpy(np.float64)
            / table["rank"].map(n_steps).fillna(1).clip(lower=1).to_numpy(np.float64),
        }
    )
    return frame.groupby(["name", "pass"], sort=False)["ms"].sum() / max(int(ranks), 1)


def _matched(sb: pd.Series, sc: pd.Series) -> list[Delta]:
    """One Delta per (name, pass) in either run (absent: 0), sorted by |delta|."""
    joined = pd.concat([sb.rename("base"), sc.rename("cand")], axis=1).fillna(0.0)
    return _by_abs_delta(
        [
            Delta(str(name), float(base), float(cand), str(kind))
            for (name, kind), base, cand in zip(joined.index, joined["base"].tolist(), joined["cand"].tolist())
        ]
    )


def most_specific(deltas: list[Delta]) -> list[Delta]:
    """Module deltas without those whose change is at least half one child's (same pass, same sign).

    A child of ``a/b`` is ``a/b/c``. Of ``blocks.7 backward +4.1`` whose
    ``blocks.7/attn backward`` grew +4.0, only the attention row stays; a
    block whose growth is spread over its children and its own kernels
    (no child holding half) stays beside them.
    """
    by_parent: dict[tuple[str, str | None], list[Delta]] = {}
    for d in deltas:
        if "/" in d.name:
            by_parent.setdefault((d.name.rsplit("/", 1)[0], d.kind), []).append(d)
    return [
        d
        for d in deltas
        if not any(
            c.delta * d.delta > 0 and abs(c.delta) >= 0.5 * abs(d.delta) for c in by_parent.get((d.name, d.kind), [])
        )
    ]


def _op_module_deltas(
    base: "RunAnalysis", cand: "RunAnalysis", top: int | None
) -> tuple[list[Delta], list[Delta], str, list[str]]:
    """(ops, modules, source, notes): per-step op and module deltas (module docstring)."""
    clocks = (_attribution_clock(base), _attribution_clock(cand))
    if None in clocks:
        missing = " and ".join(n for n, c in zip(("baseline", "candidate"), clocks) if c is None)
        return [], [], "none", [f"no op or module deltas: the {missing} has no attributed ops (no trace)"]
    notes = []
    clock = "device" if clocks == ("device", "device") else "host"
    if clocks[0] != clocks[1]:
        notes.append("ops and modules compared on host time: one run has device events and the other none")
    column = "device_ms" if clock == "device" else "host_ms"
    what = (
        "device time (kernels counted to their op; modules inclusive of nested modules)"
        if clock == "device"
        else "host time (inclusive: nested ops each carry what they contain)"
    )
    source = f"{what}, ms per profiled step, mean over ranks"
    ops = _matched(_per_step(base, base.ops(), "op", column), _per_step(cand, cand.ops(), "op", column))
    modules = most_specific(
        _matched(_per_step(base, base.modules(), "module", column), _per_step(cand, cand.modules(), "module", column))
    )
    return (ops if top is None else ops[:top]), (modules if top is None else modules[:top]), source, notes


# ----------------------------------------------------------------- memory
def _memory_deltas(base: "RunAnalysis", cand: "RunAnalysis") -> tuple[list[Delta], str, float | None, list[str]]:
    """(deltas in MiB, source, growth of the peak allocated, notes); see the module docstring."""
    mb, mc = base.memory, cand.memory
    if mb.source is None or mc.source is None:
        missing = " and ".join(n for n, m in (("baseline", mb), ("candidate", mc)) if m.source is None)
        return (
            [],
            "none",
            None,
            [f"no memory deltas: the {missing} has no memory figures (metrics records or profiler memory events)"]
            if mb.source or mc.source
            else [],
        )
    same = (mb.source, mb.kind) == (mc.source, mc.kind)
    source = (
        f"{mb.source} ({mb.kind}), MiB, max over ranks"
        if same
        else f"baseline {mb.source} ({mb.kind}), candidate {mc.source} ({mc.kind}), MiB"
    )
    notes = (
        []
        if same
        else [
            f"memory figures of different kinds: baseline {mb.source} {mb.kind}, candidate "
            f"{mc.source} {mc.kind}; no growth computed"
        ]
    )

    def mib(v: float | None) -> float | None:
        return None if v is None or v != v else float(v) / MIB

    deltas = [
        Delta(
            "peak allocated" if mb.kind != "cpu_rss" else "peak RSS",
            mib(mb.peak_allocated_bytes),
            mib(mc.peak_allocated_bytes),
            mb.kind,
        )
    ]
    if mb.peak_reserved_bytes is not None or mc.peak_reserved_bytes is not None:
        deltas.append(Delta("peak reserved", mib(mb.peak_reserved_bytes), mib(mc.peak_reserved_bytes), mb.kind))
    per_rank = [
        {int(r): mib(v) for r, v in zip(m.ranks["rank"].tolist(), m.ranks["peak_allocated_bytes"].tolist())}
        for m in (mb, mc)
    ]
    deltas += [
        Delta(f"rank {r}", per_rank[0].get(r), per_rank[1].get(r), mb.kind)
        for r in sorted(set(per_rank[0]) | set(per_rank[1]))
    ]
    b, c = mb.peak_allocated_bytes, mc.peak_allocated_bytes
    growth = (c - b) / b if same and b and c is not None else None
    return deltas, source, growth, notes


# ----------------------------------------------------------------- MFU
def _measured_peak(a: "RunAnalysis") -> float | None:
    """The run's peak when reftrain measured it on the machine (not a datasheet or an override)."""
    if a.mfu.source == "manifest" and a.mfu.peak_source == "measured":
        return a.mfu.peak_flops_per_s
    return None


def _hardware(a: "RunAnalysis") -> tuple:
    hw = a.run_manifest.hw
    return (hw.device_type, hw.cpu_model, tuple(hw.device_names))


def candidate_peak_scale(base: "RunAnalysis", cand: "RunAnalysis") -> tuple[float, str | None]:
    """Factor that puts the candidate's MFU on the baseline's peak, and a note saying so.

    When reftrain *measured* both runs' peaks (CPU runs, GPUs missing from
    its table) on the same hardware, the two measurements differ by noise
    (tens of percent on a busy CPU), and that difference would be one
    constant factor on every step of the candidate. The candidate's MFU is
    then recomputed with the baseline's peak: ``mfu * cand_peak / base_peak``.
    Otherwise 1.0 and no note.
    """
    bp, cp = _measured_peak(base), _measured_peak(cand)
    if not bp or not cp or bp == cp or _hardware(base) != _hardware(cand):
        return 1.0, None
    note = (
        f"candidate MFU recomputed with the baseline's measured peak ({bp / 1e9:.1f} GFLOP/s; the candidate "
        f"measured {cp / 1e9:.1f}), so that peak-measurement noise is not read as a change"
    )
    return cp / bp, note


# ----------------------------------------------------------------- compare
def compare(base: "RunAnalysis", cand: "RunAnalysis", *, top: int | None = 20) -> Comparison:
    """Deltas from ``base`` to ``cand`` (see the module docstring for definitions).

    ``top`` limits the kernel, op and module lists (None: all rows).
    Never raises on missing data: a side without a table gives empty deltas
    and a note.
    """
    notes: list[str] = []
    tb, tc, phase_source = _phase_tables(base, cand)
    step, _, phases = _phase_deltas(tb, tc)
    step_median, step_note = _headline_step_times(base, cand)
    if step_note:
        notes.append(step_note)
    if tb is None or tc is None:
        notes.append("phases: one run has no steps to compare (" + ("baseline" if tb is None else "candidate") + ")")
    base_sources = set(base.steps["source"].unique()) if base.steps is not None and not base.steps.empty else set()
    cand_sources = set(cand.steps["source"].unique()) if cand.steps is not None and not cand.steps.empty else set()
    if "trace breakdown" in phase_source and base_sources and cand_sources and base_sources != cand_sources:
        notes.append(
            f"the runs' breakdowns come from different timelines ({', '.join(sorted(base_sources))} vs "
            f"{', '.join(sorted(cand_sources))}); their parts do not correspond"
        )
    if _has_kernels(base) and _has_kernels(cand):
        kernels, kernel_source = _kernel_deltas(base, cand, top)
    else:
        missing = " and ".join(n for n, a in (("baseline", base), ("candidate", cand)) if not _has_kernels(a))
        kernels, kernel_source = [], "none"
        notes.append(f"no kernel deltas: the {missing} has no trace")
    ops, modules, op_source, op_notes = _op_module_deltas(base, cand, top)
    notes += op_notes
    memory, memory_source, memory_growth, memory_notes = _memory_deltas(base, cand)
    notes += memory_notes
    # Run directories: steady-state metrics steps on both sides (a run
    # profiled in one and not the other would otherwise compare profiled
    # windows with unprofiled steps); else the ProfilerStep medians.
    steady = all(r.steady_step_time_ms is not None for a in (base, cand) for r in a.ranks)
    base_ranks = {r.rank: r.steady_step_time_ms if steady else r.step_time_ms for r in base.ranks}
    cand_ranks = {r.rank: r.steady_step_time_ms if steady else r.step_time_ms for r in cand.ranks}
    ranks = [
        Delta(f"rank {r}", base_ranks.get(r), cand_ranks.get(r)) for r in sorted(set(base_ranks) | set(cand_ranks))
    ]
    if set(base_ranks) != set(cand_ranks):
        notes.append(f"different ranks: baseline {sorted(base_ranks)}, candidate {sorted(cand_ranks)}")
    scale, scale_note = candidate_peak_scale(base, cand)
    rescaled = None if cand.mfu.median is None or scale == 1.0 else cand.mfu.median * scale
    mfu = MfuDelta(
        base.mfu.median,
        cand.mfu.median,
        base.mfu.source,
        cand.mfu.source,
        rescaled,
        base.mfu.hfu_median,
        cand.mfu.hfu_median,
    )
    if scale_note:
        notes.append(scale_note)
    if base.mfu.source != cand.mfu.source:
        notes.append(f"MFU sources differ (baseline {base.mfu.source}, candidate {cand.mfu.source})")
    return Comparison(
        base_path=path_text(base.path),
        cand_path=path_text(cand.path),
        step_time=step,
        step_time_median=step_median,
        phase_source=phase_source,
        phases=phases,
        kernel_source=kernel_source,
        kernels=kernels,
        ranks=ranks,
        mfu=mfu,
        notes=notes,
        op_source=op_source,
        ops=ops,
        modules=modules,
        memory_source=memory_source,
        memory=memory,
        memory_growth=memory_growth,
    )
