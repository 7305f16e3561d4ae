"""Run history: the headline figures of every run in a folder, in order, with
the CI gate's verdict between consecutive runs and change points marked.

Order (``by``): ``time`` sorts reftrain runs by the manifest's
``start_time``; ``commit`` does the same, then keeps the latest run of each
git commit (``git.sha``; runs without one are kept), so consecutive points
are consecutive commits as they were run. Per run: MFU (median,
``RunAnalysis.mfu``), step time (``RunAnalysis.step_time``), tokens/s
(``analyzer.metrics.throughput``, median), goodput (``RunAnalysis.goodput()``:
productive step time / wall time over its attempts; None when withheld).
Between a run and the one before it:
``verdict`` is ``analyzer.verbs.check.check(previous, run)`` (pass, regression,
inconclusive), or ``verdict_error`` when the gate cannot judge the pair
(different models, ...). A run is a *change point* when the gate finds a
significant change in either direction: a regression against the previous
run, or the previous run a regression against it (``check(run, previous)``,
an improvement). Folders of traces have no start time or token counts and
are left out (``skipped``, with the reason), as are runs that cannot be read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, Sequence, TypedDict, cast

from analyzer.errors import AnalyzerError
from analyzer.ingest.formats import Git

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis
    from analyzer.execute import Progress

Order = Literal["time", "commit"]
# Told (run number from 1, runs to analyze, run folder name) as each run's analysis starts; returns
# the listener of that run's per-rank map (analyze's ``progress``), or None.
RunProgress = Callable[[int, int, str], "Callable[[Progress], None] | None"]


class HistoryPointDocument(TypedDict):
    """One point of the history document: :class:`HistoryPoint`'s fields."""

    run: str
    start_time: str
    commit: str | None
    dirty: bool | None
    mfu: float | None
    step_time_ms: float | None
    tokens_per_s: float | None
    goodput: float | None
    verdict: str | None
    verdict_error: str | None
    explanation: str | None
    change_point: bool
    direction: Literal["slower", "faster"] | None


class HistoryDocument(TypedDict):
    """``analyzer history --json`` (schema ``analyzer.history/1``): :meth:`History.to_json`."""

    schema: str  # HISTORY_SCHEMA
    by: Order
    points: list[HistoryPointDocument]
    skipped: list[str]  # "folder: why"


HISTORY_SCHEMA = "analyzer.history/1"


@dataclass(frozen=True)
class HistoryPoint:
    run: str
    start_time: str
    commit: str | None
    dirty: bool | None
    mfu: float | None
    step_time_ms: float | None
    tokens_per_s: float | None
    goodput: float | None = None
    verdict: str | None = None  # vs the previous point; None for the first
    verdict_error: str | None = None
    explanation: str | None = None
    change_point: bool = False
    direction: Literal["slower", "faster"] | None = None


@dataclass(frozen=True)
class History:
    by: Order
    points: list[HistoryPoint]
    skipped: list[str] = field(default_factory=list)

    def to_json(self) -> HistoryDocument:
        from dataclasses import asdict

        return HistoryDocument(
            schema=HISTORY_SCHEMA,
            by=self.by,
            points=[cast(HistoryPointDocument, asdict(p)) for p in self.points],
            skipped=list(self.skipped),
        )


def _sha(a: "RunAnalysis") -> str | None:
    """The run's git commit (run.json ``git.sha``), None when it has none."""
    git = a.run_manifest.git
    return git.sha if git is not None else None


def history(
    runs_dir: Path, by: Order = "time", runs: Sequence[Path] | None = None, progress: RunProgress | None = None
) -> History:
    """The history of the reftrain runs directly under ``runs_dir`` (see module doc); ``runs``: the
    run folders to consider instead of every folder there (a caller that vets what it reads);
    ``progress``: told of each run directory as its analysis starts, in name order."""
    from analyzer.api import analyze
    from analyzer.verbs.check import check, explain
    from analyzer.ingest.locate import is_run_dir
    from analyzer.metrics.throughput import throughput

    if by not in ("time", "commit"):
        raise AnalyzerError(f"history: --by must be time or commit, not {by!r}")
    if not runs_dir.is_dir():
        raise AnalyzerError(f"{runs_dir}: not a folder of runs")
    analyzed: list[tuple[str, str, RunAnalysis]] = []
    skipped: list[tuple[Path, str]] = []  # reported in folder order
    folders = runs if runs is not None else [p for p in runs_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
    run_dirs = []
    for path in sorted(folders):
        if is_run_dir(path):
            run_dirs.append(path)
        else:
            skipped.append((path, "not a reftrain run directory (no run.json)"))
    for number, path in enumerate(run_dirs, 1):
        try:
            a = analyze(path, progress=progress(number, len(run_dirs), path.name) if progress else None)
        except AnalyzerError as exc:
            skipped.append((path, str(exc)))
            continue
        start = a.run_manifest.start_time
        if not start:
            skipped.append((path, "run.json has no start_time"))
            continue
        analyzed.append((start, path.name, a))
    analyzed.sort(key=lambda t: (t[0], t[1]))
    if by == "commit":
        latest: dict[str, int] = {}
        for i, (_, _, a) in enumerate(analyzed):
            sha = _sha(a)
            if sha:
                latest[sha] = i
        analyzed = [t for i, t in enumerate(analyzed) if latest.get(_sha(t[2]) or "", i) == i]
    points: list[HistoryPoint] = []
    prev = None
    for start, name, a in analyzed:
        git = a.run_manifest.git or Git()
        gp = a.goodput()
        fields: dict[str, Any] = {"goodput": None if gp is None else gp.goodput}
        if prev is not None:
            try:
                forward = check(prev, a)
                fields.update(verdict=forward.result.verdict, explanation=explain(forward))
                if forward.result.regression:
                    fields.update(change_point=True, direction="slower")
                elif check(a, prev).result.regression:
                    fields.update(change_point=True, direction="faster")
            except AnalyzerError as exc:
                fields.update(verdict_error=str(exc))
        points.append(
            HistoryPoint(
                run=name,
                start_time=start,
                commit=git.sha,
                dirty=git.dirty,
                mfu=a.mfu.median if a.mfu.source != "none" else None,
                step_time_ms=a.step_time.ms,
                tokens_per_s=throughput(a.manifest, a.metrics).median,
                **fields,
            )
        )
        prev = a
    return History(by, points, [f"{path.name}: {why}" for path, why in sorted(skipped)])
