"""Analyzer results for the pages, cached on run path and a digest of its file fingerprint.

Every page asks here; nothing here computes a metric, it only calls the
analyzer (``analyze``, ``load_traces``, ``read_run_dir``, ``timeline``,
``throughput``) and keeps the results. Events are read only for the few
ranks a timeline zooms into (:func:`timeline_window`); everything else,
the timeline's bins included, comes from the analysis, which a many-rank
run opens from its rank summaries (docs/loading.md). The cache key is the run's path plus
:func:`run_key`, a digest of :func:`dashboard.discover.fingerprint` (path, size and mtime of each file),
so an unchanged run is parsed once per server and switching pages is
instant, while a rewritten file is picked up on the next rerun.

Before anything of a run is read, :meth:`RunEntry.refusal` checks that no
path below it links outside RUNS_DIR (dashboard/boundary.py); a refused run
reads as its one-line error, and nothing of it reaches the analyzer.

``st.cache_resource`` (not ``cache_data``) holds the results: they are large
read-only tables that ``cache_data`` would pickle and copy on every hit.
Pages must not mutate them. A failure is cached too (as :class:`Loaded` with
``error``), so a bad run in the runs table is not re-parsed on every rerun.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import streamlit as st

from analyzer.errors import AnalyzerError
from dashboard.discover import RunEntry, fingerprint, trace_files

if TYPE_CHECKING:
    from analyzer.metrics.breakdown import Source

T = TypeVar("T")
log = logging.getLogger(__name__)

# Bounds on what the server keeps: runs analyzed, trace sets, timeline tables.
_MAX_ANALYSES = 32
_MAX_TRACESETS = 4
_MAX_TABLES = 64


@dataclass(frozen=True)
class Loaded(Generic[T]):
    """A cached result, or the one-line reason there is none."""

    value: T | None
    error: str | None = None


def run_key(run: RunEntry) -> str:
    """The cache key of everything read from `run`: a digest of its
    :func:`~dashboard.discover.fingerprint`. Streamlit hashes a cache function's
    arguments on every call; the fingerprint of a 1,024-rank folder is 1,024
    tuples (18 ms to hash, five cached calls a page), its digest 40 characters."""
    return hashlib.sha1(repr(fingerprint(run)).encode()).hexdigest()


def _fail(what: str, exc: BaseException) -> Loaded:
    if isinstance(exc, AnalyzerError):
        return Loaded(None, str(exc))
    # Not an input problem: an analyzer bug. Keep the traceback in the
    # server log and give the page one line, so other runs still show.
    log.exception("%s failed", what)
    return Loaded(None, f"analyzer failed on this run ({type(exc).__name__}: {exc}); see the dashboard server log")


@st.cache_resource(max_entries=_MAX_ANALYSES, show_spinner="Analyzing the run...")
def _analysis(path: str, key: str, critical_path: bool = False) -> Loaded:
    from analyzer.api import analyze

    try:
        return Loaded(analyze(Path(path), critical_path=critical_path))
    except Exception as exc:  # noqa: BLE001 - reported as this run's error, see _fail
        return _fail(f"analyze({path})", exc)


def analysis(run: RunEntry, critical_path: bool = False) -> Loaded:
    """``analyzer.api.analyze`` of a run: a RunAnalysis, or its error; with each profiled
    step's critical path when ``critical_path`` (the Timeline page asks for it)."""
    refused = run.refusal()
    if refused:
        return Loaded(None, refused)
    return _analysis(str(run.path), run_key(run), critical_path)


@st.cache_resource(max_entries=_MAX_ANALYSES, show_spinner=False)
def _run_dir(path: str, key: str) -> Loaded:
    from analyzer.ingest.rundir import read_run_dir

    try:
        return Loaded(read_run_dir(Path(path)))
    except Exception as exc:  # noqa: BLE001 - see _fail
        return _fail(f"read_run_dir({path})", exc)


def run_dir(run: RunEntry) -> Loaded:
    """``analyzer.ingest.rundir.read_run_dir`` of a reftrain run (manifest, metrics, telemetry)."""
    refused = run.refusal()
    if refused:
        return Loaded(None, refused)
    return _run_dir(str(run.path), run_key(run))


@st.cache_resource(max_entries=_MAX_ANALYSES, show_spinner=False)
def _throughput(path: str, key: str) -> Any:
    from analyzer.metrics.throughput import throughput

    loaded = _analysis(path, key)
    ra = loaded.value
    return throughput(ra.manifest if ra else None, ra.metrics if ra else None)


def throughput(run: RunEntry):
    """``analyzer.metrics.throughput.throughput`` of a run (tokens/s, all ranks); its empty result
    for a refused run."""
    if run.refusal():
        from analyzer.metrics.throughput import throughput as empty

        return empty(None, None)
    return _throughput(str(run.path), run_key(run))


def trace_windows(run: RunEntry) -> dict[str, list[Path]]:
    """The run's trace files grouped by profiler window.

    A reftrain run can hold several windows (``rank{R}.step{N}``), far apart
    in time; a timeline shows one window at a time. Keys are ``"step N"``
    (the window's last step) or ``"all traces"`` for a trace folder; none for a refused run.
    """
    from analyzer.ingest.locate import trace_window

    if run.refusal():
        return {}
    windows: dict[str, list[Path]] = {}
    for f in sorted(trace_files(run)):
        w = trace_window(f) if run.kind == "reftrain" else None  # both layouts (docs/rundir.md)
        windows.setdefault(f"step {w}" if w is not None else "all traces", []).append(f)
    return dict(sorted(windows.items(), key=lambda kv: _window_order(kv[0])))


def _window_order(key: str) -> tuple[int, int]:
    return (0, int(key.split()[1])) if key.startswith("step ") else (1, 0)


@st.cache_resource(max_entries=_MAX_TRACESETS, show_spinner="Loading traces...")
def _traces(files: tuple[str, ...], key: str) -> Loaded:
    from analyzer.ingest.load import load_traces

    try:
        return Loaded(load_traces([Path(f) for f in files], cache=True, progress=False))
    except Exception as exc:  # noqa: BLE001 - see _fail
        return _fail(f"load_traces({files[0]}...)", exc)


def traces(run: RunEntry, files: list[Path]) -> Loaded:
    """``analyzer.ingest.load.load_traces`` of some of a run's trace files (one window)."""
    refused = run.refusal()
    if refused:
        return Loaded(None, refused)
    return _traces(tuple(str(f) for f in files), run_key(run))


def window_label(window: int | None) -> str:
    """How the pages name a profiler window: ``"step N"`` (its last step) or ``"all traces"``."""
    return f"step {window}" if window is not None else "all traces"


@st.cache_resource(max_entries=_MAX_TABLES, show_spinner="Binning the timeline...")
def _overview(path: str, key: str, window: int | None, n_bins: int) -> Loaded:
    loaded = _analysis(path, key)
    if loaded.value is None:
        return Loaded(None, loaded.error)
    try:
        return Loaded(loaded.value.timeline_overview(window, n_bins))
    except Exception as exc:  # noqa: BLE001 - see _fail
        return _fail(f"timeline_overview({path}, {window})", exc)


def timeline_overview(run: RunEntry, window: int | None, n_bins: int) -> Loaded:
    """``RunAnalysis.timeline_overview``: one profiler window's rank-by-time occupancy, from the
    rank summaries (no events read), as ``(Overview, notes)``."""
    refused = run.refusal()
    if refused:
        return Loaded(None, refused)
    return _overview(str(run.path), run_key(run), window, n_bins)


@st.cache_data(max_entries=_MAX_TABLES, show_spinner="Selecting events...")
def _window(
    files: tuple[str, ...],
    key: str,
    origins: tuple[tuple[int, int], ...],
    span_ns: tuple[int, int],
    max_events: int,
    source: Source,
) -> Loaded:
    from analyzer.metrics.timeline import select_window

    loaded = _traces(files, key)
    if loaded.value is None:
        return Loaded(None, loaded.error)
    wanted = dict(origins)
    ranks = {r: rt for r, rt in loaded.value.ranks.items() if r in wanted}
    return Loaded(select_window({r: rt.events for r, rt in ranks.items()}, wanted, span_ns, max_events, source))


def timeline_window(run: RunEntry, files: list[Path], ov, span_ns: tuple[int, int], max_events: int) -> Loaded:
    """``analyzer.metrics.timeline.select_window`` over some ranks' trace files of one window
    (only those files are read), aligned as `ov`."""
    refused = run.refusal()
    if refused:
        return Loaded(None, refused)
    origins = tuple(sorted(ov.origins.items()))
    return _window(
        tuple(str(f) for f in files), run_key(run), origins, (int(span_ns[0]), int(span_ns[1])), max_events, ov.source
    )


@dataclass(frozen=True)
class Compared:
    """``analyzer.verbs.compare.compare`` of two runs, plus the CI gate's outcome
    (``analyzer.verbs.check.check``) when the runs are fit for it, else why not."""

    comparison: Any
    gate: Any | None
    gate_error: str | None


@st.cache_resource(max_entries=_MAX_ANALYSES, show_spinner="Comparing...")
def _compared(base_path: str, base_key: str, cand_path: str, cand_key: str) -> Loaded:
    base, cand = _analysis(base_path, base_key), _analysis(cand_path, cand_key)
    if base.value is None or cand.value is None:
        which = "baseline" if base.value is None else "candidate"
        return Loaded(None, f"{which}: {base.error or cand.error}")
    try:
        from analyzer.verbs.check import check
        from analyzer.verbs.compare import compare

        comparison = compare(base.value, cand.value)
        try:
            gate, gate_error = check(base.value, cand.value), None
        except AnalyzerError as exc:
            gate, gate_error = None, str(exc)
        return Loaded(Compared(comparison, gate, gate_error))
    except Exception as exc:  # noqa: BLE001 - see _fail
        return _fail(f"compare({base_path}, {cand_path})", exc)


def compared(base: RunEntry, cand: RunEntry) -> Loaded:
    """Comparison and CI-gate outcome from `base` to `cand` (cached on both runs' files)."""
    refused = base.refusal() or cand.refusal()
    if refused:
        return Loaded(None, refused)
    return _compared(str(base.path), run_key(base), str(cand.path), run_key(cand))


@st.cache_resource(max_entries=_MAX_ANALYSES, show_spinner="Finding suggestions...")
def _suggestions(path: str, key: str) -> Loaded:
    from analyzer.verbs.suggest.run import report_suggestions

    loaded = _analysis(path, key)
    if loaded.value is None:
        return Loaded(None, loaded.error)
    try:
        return Loaded(report_suggestions(loaded.value))
    except Exception as exc:  # noqa: BLE001 - see _fail
        return _fail(f"report_suggestions({path})", exc)


def suggestions(run: RunEntry) -> Loaded:
    """``analyzer.verbs.suggest.report_suggestions``: the ranked suggestion entries of a run."""
    refused = run.refusal()
    if refused:
        return Loaded(None, refused)
    return _suggestions(str(run.path), run_key(run))


@st.cache_resource(max_entries=_MAX_ANALYSES, show_spinner=False)
def _curves(path: str, key: str) -> Any:
    from analyzer.metrics.curves import training_curves

    ra = _analysis(path, key).value
    return training_curves(ra.manifest if ra else None, ra.metrics if ra else None)


def curves(run: RunEntry):
    """``analyzer.metrics.curves.training_curves`` of a run (per-step loss, lr, ..., all ranks); its
    empty result for a refused run."""
    if run.refusal():
        from analyzer.metrics.curves import training_curves

        return training_curves(None, None)
    return _curves(str(run.path), run_key(run))


@st.cache_resource(max_entries=4, show_spinner="Gating consecutive runs...")
def _history(root: str, by: str, paths: tuple[str, ...], key: tuple[str, ...]) -> Loaded:
    from analyzer.verbs.history import history

    try:
        return Loaded(history(Path(root), by, [Path(p) for p in paths]))  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - see _fail
        return _fail(f"history({root})", exc)


def history(root: Path, runs: list[RunEntry], by: str) -> tuple[Loaded, list[str]]:
    """``analyzer.verbs.history.history`` of the runs directly in the runs folder (cached on every
    run's files), and the one-line refusal of each run left out because it links outside the folder."""
    refusals = [r.refusal() for r in runs]
    kept = tuple(r for r, why in zip(runs, refusals) if why is None and "/" not in r.name and r.name != ".")
    return _history(str(root), by, tuple(str(r.path) for r in kept), tuple(run_key(r) for r in kept)), [
        w for w in refusals if w
    ]


@st.cache_resource(max_entries=_MAX_TRACESETS, show_spinner="Marking the critical path...")
def _critical_path_trace(file: str, key: str) -> Loaded:
    from analyzer.verbs.critical_trace import critical_path_trace as overlay

    try:
        return Loaded(overlay(Path(file)))
    except Exception as exc:  # noqa: BLE001 - see _fail
        return _fail(f"critical_path_trace({file})", exc)


def critical_path_trace(run: RunEntry, file: Path) -> Loaded:
    """``analyzer.verbs.critical_trace.critical_path_trace`` of one of a run's trace files: the rank's trace
    with each profiled step's critical path marked (an ``OverlayTrace``), for the Perfetto UI."""
    refused = run.refusal()
    if refused:
        return Loaded(None, refused)
    return _critical_path_trace(str(file), run_key(run))
