"""`analyzer`: report, compare and check runs from the command line.

Exit codes (docs/cli.md):

* 0: done (``check``: within bounds). Unusable files are reported one line
  each on stderr and the rest is analyzed.
* 1: ``check`` only: the candidate regressed.
* 2: unusable input (nothing could be analyzed, a missing path, runs that
  cannot be compared, too few steady-state steps) or a usage error
  (argparse). One line on stderr says why.
* 3: a bug in the analyzer (an unexpected exception). One line names it and
  suggests ``--debug``, which shows the traceback instead. Kept apart from
  2 so a CI job can tell "fix your input" from "report a bug", and from 1
  so a crash is never read as a regression.
* 4: ``check`` only: inconclusive, the runs are too noisy to tell (their
  own noise exceeds the threshold, or a drop beyond it is not beyond the
  noise). ``--inconclusive pass|fail`` maps it to 0 or 1 instead.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence, TextIO

from analyzer.errors import AnalyzerError
from analyzer.jsontext import dumps_json

if TYPE_CHECKING:
    from analyzer.execute import Progress
    from analyzer.ingest.jobs import ParseJobs

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_UNUSABLE = 2
EXIT_INTERNAL = 3
EXIT_INCONCLUSIVE = 4
PROG = "analyzer"


# --quiet: the command's own, set by main for the length of one command.
_QUIET = contextvars.ContextVar("analyzer_quiet", default=False)
# The stderr lines --quiet keeps: problems (and the interruption), never information such as note: lines.
QUIET_KEEPS = frozenset({"skipped", "warning", "error", "internal error", ""})


def _say(kind: str, message: str) -> None:
    """One line on stderr: ``analyzer: <kind>: <message>`` (analyzer.verbs.printable.say); with
    ``--quiet`` only the kinds in :data:`QUIET_KEEPS`."""
    from analyzer.verbs.printable import say

    if _QUIET.get() and kind not in QUIET_KEEPS:
        return
    say(kind, message, PROG)


def _write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise AnalyzerError(f"cannot write {path}: {exc.strerror or exc}") from None


def _existing(path_text: str) -> Path:
    path = Path(path_text)
    if not path.exists():
        raise AnalyzerError(f"{path}: no such file or directory")
    return path


def start_parsing(
    paths: Sequence[Path], cache: bool, import_parser: bool = False, critical_path: bool = False
) -> ParseJobs | None:
    """Start parsing the traces of ``paths`` that have no cache entry, in
    worker processes (which also write the entries), before the caller
    imports pandas.

    pandas takes about as long to import (~1 s here) as a 50 MB trace takes
    to parse, so the two run side by side. The analysis takes the results
    from the returned jobs (``analyze(..., jobs=)``); a file the analysis
    turns out not to read is parsed for nothing, never wrongly.
    ``import_parser``: import the parser (numpy, msgspec) here first, for
    the forked workers to inherit (:func:`_one_blas_thread` says when).
    ``critical_path``: workers that map a rank also compute its critical paths.
    """
    from analyzer.ingest.cache import TraceCache
    from analyzer.ingest.locate import trace_files_of, trace_window

    store = TraceCache() if cache else None
    todo: dict[Path, Path | None] = {}
    one_file_units = True
    for path in paths:
        files = trace_files_of(path)
        # Several profiler windows of a reftrain run: a rank's unit is its files of every window
        # (analyzer.execute.plan), so a worker cannot map one file on its own.
        one_file_units &= len({trace_window(f) for f in files}) <= 1
        for f in files:
            entry = store.entry_for(f) if store else None
            if entry is None or not entry.exists():
                todo[f] = entry
    if not todo:
        return None
    from analyzer.ingest.jobs import ParseJobs, usable_cpus  # multiprocessing.pool: ~0.05 s, only when there is work

    if import_parser:
        import analyzer.ingest.parse  # noqa: F401  (numpy starts no threads here: _one_blas_thread)

    if one_file_units and map_in_workers(len(todo), usable_cpus()):
        from functools import partial

        from analyzer.engines import parse_and_map

        return ParseJobs(list(todo), entries=todo, task=partial(parse_and_map, critical_path=critical_path))
    return ParseJobs(list(todo), entries=todo)


def map_in_workers(n_files: int, cpus: int) -> bool:
    """Whether the early workers should also summarize each file's rank (analyzer.engines.parse_and_map).

    Each worker that maps imports pandas and the metrics (about 0.35 s of CPU here) once; in
    return the ranks' summaries (about 0.25 s each for a 50 MB trace) run in parallel instead of
    one after the other in this process. That pays when every worker gets at least two files,
    with two or more CPUs; with fewer files this process, importing pandas meanwhile anyway,
    summarizes them sooner itself.
    """
    return cpus >= 2 and n_files >= 2 * cpus


# A plain progress line (stderr not a terminal) at most this often, in seconds.
PLAIN_EVERY_S = 5.0


class ProgressLine:
    """The per-rank map's progress on stderr (docs/cli.md, "Progress"), drawn from the counts
    that :func:`analyzer.execute.execute` reports (:class:`~analyzer.execute.Progress`).

    ``in_place`` (a terminal): one line, rewritten at every count and erased by
    :meth:`close`; else a plain line at most every :data:`PLAIN_EVERY_S` seconds, and one
    when every rank is done. ``clock``: seconds, for the elapsed time and the time left
    (elapsed x files left / files done: the files are the work).
    """

    def __init__(self, label: str, stream: TextIO, in_place: bool, clock: Callable[[], float] = time.monotonic):
        from analyzer.verbs.printable import printable

        self.label, self.stream, self.in_place, self.clock = printable(label, one_line=True), stream, in_place, clock
        self.start = self.last_line = clock()
        self.drawn = False

    def text(self, p: Progress, elapsed_s: float) -> str:
        text = (
            f"{PROG}: {self.label}: {p.ranks_done}/{p.ranks_total} ranks "
            f"({p.files_done}/{p.files_total} trace files), {elapsed_s:.0f} s"
        )
        if 0 < p.files_done < p.files_total:
            text += f", about {elapsed_s * (p.files_total - p.files_done) / p.files_done:.0f} s left"
        return text

    def __call__(self, p: Progress) -> None:
        if p.ranks_total == 0:
            return
        self.draw(lambda elapsed_s: self.text(p, elapsed_s), final=p.ranks_done == p.ranks_total)

    def draw(self, text_at: Callable[[float], str], final: bool) -> None:
        """Show ``text_at(seconds elapsed)``: in place, or as a plain line when ``final`` or due."""
        now = self.clock()
        if self.in_place:
            width = shutil.get_terminal_size().columns - 1  # a longer line would wrap, and \r not go back
            self.stream.write("\r" + text_at(now - self.start)[:width] + "\x1b[K")
            self.drawn = True
        elif final or now - self.last_line >= PLAIN_EVERY_S:
            self.stream.write(text_at(now - self.start) + "\n")
            self.last_line = now
        self.stream.flush()

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\r\x1b[K")  # what follows starts on a clean line
            self.stream.flush()


class RunsProgress:
    """``analyzer history``'s progress: which run of how many is analyzed and, while its per-rank
    map runs, that map's counts (docs/cli.md, "Progress").

    The work is the runs, a run in progress counted by its share of trace files done, so the
    time left is elapsed x (runs - work done) / work done. ``history`` calls the object at each
    run's start (:data:`analyzer.verbs.history.RunProgress`) and gets that run's map listener;
    :meth:`finish` draws the last plain line once every run is analyzed. Drawn by a
    :class:`ProgressLine` (in place or plain, as for one run).
    """

    def __init__(self, label: str, stream: TextIO, in_place: bool, clock: Callable[[], float] = time.monotonic):
        self.line = ProgressLine(label, stream, in_place, clock)
        self.run, self.runs, self.name = 0, 0, ""

    def __call__(self, number: int, total: int, name: str) -> Callable[[Progress], None]:
        from analyzer.verbs.printable import printable

        self.run, self.runs, self.name = number, total, printable(name, one_line=True)
        self.line.draw(lambda elapsed_s: self.runs_text(None, elapsed_s), final=False)
        return self.ranks

    def ranks(self, p: Progress) -> None:
        if p.ranks_total:
            self.line.draw(lambda elapsed_s: self.runs_text(p, elapsed_s), final=False)

    def runs_text(self, p: Progress | None, elapsed_s: float) -> str:
        text = f"{PROG}: {self.line.label}: run {self.run}/{self.runs} ({self.name})"
        done = self.run - 1.0
        if p is not None:
            text += f": {p.ranks_done}/{p.ranks_total} ranks ({p.files_done}/{p.files_total} trace files)"
            done += p.files_done / p.files_total if p.files_total else 0.0
        text += f", {elapsed_s:.0f} s"
        if 0 < done < self.runs:
            text += f", about {elapsed_s * (self.runs - done) / done:.0f} s left"
        return text

    def finish(self) -> None:
        if self.runs:
            self.line.draw(
                lambda elapsed_s: f"{PROG}: {self.line.label}: {self.runs}/{self.runs} runs, {elapsed_s:.0f} s", True
            )

    def close(self) -> None:
        self.line.close()


def _drawn(args: argparse.Namespace) -> bool | None:
    """Whether progress is drawn, and how: None (not at all), True (in place) or False (plain lines).

    Never with ``--quiet``; with ``--progress``; on a terminal unless ``--no-progress``.
    """
    wanted, tty = getattr(args, "progress", None), sys.stderr.isatty()
    if getattr(args, "quiet", False) or not (wanted or (wanted is None and tty)):
        return None
    return tty


@contextlib.contextmanager
def _progress(path: Path, args: argparse.Namespace) -> Iterator[ProgressLine | None]:
    """A :class:`ProgressLine` for analyzing ``path`` when :func:`_drawn` says so; never on
    stdout, so a report or JSON piped from stdout stays clean."""
    how = _drawn(args)
    line = ProgressLine(str(path), sys.stderr, in_place=how) if how is not None else None
    try:
        yield line
    finally:
        if line is not None:
            line.close()


def _analyze(
    path: Path, args: argparse.Namespace, jobs: ParseJobs | None, messages: list[tuple[str, str]] | None = None
):
    """Analyze one run; report its skipped files and warnings on stderr (and in ``messages``)."""
    from analyzer.api import analyze
    from analyzer.verbs.printable import run_messages

    with _progress(path, args) as progress:
        analysis = analyze(
            path,
            peak_flops=args.peak_flops,
            cache=not args.no_cache,
            jobs=jobs,
            engine=args.engine,
            ray_address=args.ray_address,
            progress=progress,
            critical_path=_critical_path(args),
        )
    lines = run_messages(analysis)
    for kind, message in lines:
        _say(kind, message)
    if messages is not None:
        messages += lines
    return analysis


def _critical_path(args: argparse.Namespace) -> bool:
    """Whether the command computes the critical paths: ``report --critical-path``, implied by
    ``--critical-path-trace`` (other commands never do)."""
    return bool(getattr(args, "critical_path", False) or getattr(args, "critical_path_trace", None))


def cmd_report(args: argparse.Namespace) -> int:
    path = _existing(args.path)
    entry = None
    if not args.no_cache:
        # An unchanged run is answered from its previous report, without
        # importing pandas (analyzer/verbs/report_cache.py says what the key covers).
        from analyzer.verbs import report_cache

        options = {
            "command": "report",
            "peak_flops": args.peak_flops,
            "top": args.top,
            "limits": _limit_options(args),
            "critical_path": _critical_path(args),
        }
        entry = report_cache.entry_path(path, options, [o for o in (args.json, args.html) if o])
        fresh = args.html or args.critical_path_trace  # outputs the stored report does not hold
        cached = report_cache.read(entry) if entry is not None and not fresh else None
        if cached is not None:
            for kind, message in cached.messages:
                _say(kind, message)
            if args.json:
                _write_text(args.json, dumps_json(cached.stamped_document()))
            _print(cached.text)
            return EXIT_OK
    with _parsing([path], args) as jobs:
        from analyzer.render import html, text as render_text
        from analyzer.verbs import report

        messages: list[tuple[str, str]] = []
        analysis = _analyze(path, args, jobs, messages)
    text = render_text.report_text(analysis, top=args.top)
    document = report.report_json(analysis)
    if args.json:
        _write_text(args.json, dumps_json(document))
    if args.html:
        _write_text(args.html, html.report_html(analysis))
    _print(text)
    if args.critical_path_trace:  # after the report: a path it cannot mark costs the user no report
        from analyzer.verbs.critical_trace import critical_path_trace, rank_trace_file

        overlay = critical_path_trace(rank_trace_file(analysis, args.critical_path_rank))
        overlay.write(args.critical_path_trace)
        _say(
            "note",
            f"{args.critical_path_trace}: rank {overlay.rank}'s trace ({overlay.source.name}) with the critical path "
            f"of step(s) {', '.join(map(str, overlay.steps))} marked ({overlay.n_marked} events, {overlay.n_flows} "
            "arrows); open it in the Perfetto UI",
        )
    if entry is not None:
        from analyzer.verbs import report_cache

        report_cache.write(entry, report_cache.CachedReport(text=text, messages=messages, document=document))
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    """Write the run's analysis tables (analyzer/verbs/export) as CSV/Parquet files, or into a tracker's run."""
    from analyzer.verbs.export import FORMATS, TARGETS, export_run, write_tables

    fmt, dest = args.to
    if fmt not in TARGETS:  # before the analysis: a typo should not cost a parse
        raise AnalyzerError(f"export: unknown format {fmt!r} (one of {', '.join(TARGETS)})")
    if args.run_id is not None and fmt in FORMATS:
        raise AnalyzerError(f"export: --run-id attaches to a tracker's run (tensorboard, mlflow, wandb), not to {fmt}")
    if fmt == "tensorboard":
        import importlib.util

        from analyzer.verbs.export.tensorboard import EXTRA_LINE, write_tensorboard

        if importlib.util.find_spec("tensorboard") is None:  # before the analysis, as a typo
            raise AnalyzerError(EXTRA_LINE)
    if fmt == "mlflow":
        import importlib.util

        from analyzer.verbs.export.mlflow import EXTRA_LINE as MLFLOW_LINE, write_mlflow

        if importlib.util.find_spec("mlflow") is None:
            raise AnalyzerError(MLFLOW_LINE)
    if fmt == "wandb":
        import importlib.util

        from analyzer.verbs.export.wandb import EXTRA_LINE as WANDB_LINE, write_wandb

        if importlib.util.find_spec("wandb") is None:
            raise AnalyzerError(WANDB_LINE)
    path = _existing(args.path)
    with _parsing([path], args) as jobs:
        analysis = _analyze(path, args, jobs)
    with_report = fmt in ("mlflow", "wandb")
    page = None
    if with_report:
        from analyzer.render.html import report_html

        page = report_html(analysis)
    export = export_run(analysis, top=max(args.top, 50), with_report=with_report, report_html=page)
    for note in export.notes:
        _say("note", note)
    if fmt == "tensorboard":
        _say("note", f"wrote TensorBoard events to {write_tensorboard(export, Path(dest), args.run_id)}")
        return EXIT_OK
    if fmt == "mlflow":
        run_id = write_mlflow(export, dest, args.run_id)
        _say("note", f"logged the analysis into MLflow run {run_id} at {dest}")
        return EXIT_OK
    if fmt == "wandb":
        _say("note", f"wrote the W&B run {write_wandb(export, Path(dest), args.run_id)} (wandb sync uploads it)")
        return EXIT_OK
    written = write_tables(export.tables, fmt, Path(dest))
    _say("note", f"wrote {len(written)} {fmt} table(s) to {dest}: " + ", ".join(p.name for p in written))
    return EXIT_OK


def cmd_history(args: argparse.Namespace) -> int:
    """MFU, step time and tokens/s per run in order, the gate's verdict between neighbours (analyzer/verbs/history.py)."""
    from analyzer.render.html import history_html
    from analyzer.render.text import history_text
    from analyzer.verbs.history import history

    runs_dir = _existing(args.runs_dir)
    how = _drawn(args)
    progress = RunsProgress(str(runs_dir), sys.stderr, in_place=how) if how is not None else None
    try:
        h = history(runs_dir, args.by, progress=progress)
        if progress is not None:
            progress.finish()
    finally:
        if progress is not None:
            progress.close()
    if args.json:
        _write_text(args.json, dumps_json(h.to_json()))
    if args.html:
        _write_text(args.html, history_html(h))
    _print(history_text(h))
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    base_path, cand_path = _existing(args.base), _existing(args.cand)
    with _parsing([base_path, cand_path], args) as jobs:
        from analyzer.render import github, html, text
        from analyzer.verbs.compare import compare

        base = _analyze(base_path, args, jobs)
        cand = _analyze(cand_path, args, jobs)
    comparison = compare(base, cand, top=args.top)
    if args.json:
        _write_text(args.json, dumps_json(comparison.to_json()))
    if args.html:
        _write_text(args.html, html.compare_html(comparison, top=args.top))
    _print(text.compare_text(comparison))
    if github.on_github_actions():
        _print("\n".join(github.compare_annotations(comparison)))
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    cand_path = _existing(args.cand)
    base_paths = [_existing(b) for b in args.baseline]
    with _parsing([cand_path, *base_paths], args) as jobs:
        from analyzer.render import github, html, junit, markdown, text
        from analyzer.verbs.check import CheckConfig, check

        # Reject bad values before analyzing.
        CheckConfig(max_drop=args.max_mfu_drop, alpha=args.alpha, quantile=args.quantile)
        if args.min_goodput is not None and not 0.0 <= args.min_goodput <= 1.0:
            raise AnalyzerError(f"--min-goodput must be between 0 and 1, got {args.min_goodput}")
        if args.max_memory_growth is not None and not args.max_memory_growth >= 0.0:
            raise AnalyzerError(f"--max-memory-growth must be >= 0 (0.05 allows +5%), got {args.max_memory_growth}")
        cand = _analyze(cand_path, args, jobs)
        bases = [_analyze(b, args, jobs) for b in base_paths]
    outcome = check(
        bases,
        cand,
        max_drop=args.max_mfu_drop,
        alpha=args.alpha,
        quantile=args.quantile,
        cpu_time=not args.no_cpu_time,
        machine_speed=not args.no_machine_speed,
        min_goodput=args.min_goodput,
        max_memory_growth=args.max_memory_growth,
    )
    explanation = outcome.explanation
    # $GITHUB_STEP_SUMMARY is appended to (other steps write there too); --summary FILE is written whole,
    # unless it names that same file, which is then appended to once.
    step_summary = github.append_step_summary(outcome)
    if args.summary and (step_summary is None or args.summary.resolve() != step_summary.resolve()):
        _write_text(args.summary, markdown.check_markdown(outcome, explanation))
    if args.json:
        _write_text(args.json, dumps_json(outcome.to_json()))
    if args.html:
        _write_text(args.html, html.check_html(outcome, top=args.top))
    if args.junit:
        _write_text(args.junit, junit.check_junit(outcome, args.inconclusive))
    _print(text.check_text(outcome, explanation))
    if github.on_github_actions():
        _print("\n".join(github.check_annotations(outcome, args.inconclusive)))
    if outcome.regression:
        return EXIT_REGRESSION
    if outcome.inconclusive:
        return {"exit": EXIT_INCONCLUSIVE, "pass": EXIT_OK, "fail": EXIT_REGRESSION}[args.inconclusive]
    return EXIT_OK


def cmd_suggest(args: argparse.Namespace) -> int:
    """Ranked suggestions of one run (docs/suggestions.md); ``--json`` and ``--emit-config`` write files."""
    path = _existing(args.path)
    with _parsing([path], args) as jobs:
        # Imported once the parse workers run: the rules import pandas meanwhile.
        from analyzer.verbs.suggest.emit import emit_config
        from analyzer.verbs.suggest.facts import run_facts
        from analyzer.render.text import suggestions_text
        from analyzer.verbs.suggest.run import suggest, suggest_with_replay, suggestions_document

        analysis = _analyze(path, args, jobs)
    suggestions = suggest_with_replay(analysis, path, cache=not args.no_cache) if args.replay else suggest(analysis)
    facts = run_facts(analysis)
    if args.json:
        _write_text(args.json, dumps_json(suggestions_document(analysis)))
    _print(suggestions_text(suggestions, facts.config_path, nproc=facts.world_size))
    if args.emit_config:
        if args.pick > len(suggestions):
            raise AnalyzerError(f"--pick {args.pick}: only {len(suggestions)} suggestion(s) for {path}")
        chosen = suggestions[args.pick - 1]
        written = emit_config(analysis, chosen, args.emit_config)
        _print(
            f"\nwrote {written} ({chosen.rule} applied); run it: reftrain --nproc {facts.world_size} --config {written}"
        )
    return EXIT_OK


def cmd_whatif(args: argparse.Namespace) -> int:
    """Replay a run's profiled steps with the changes asked for (docs/cli.md, "whatif"); ``--json`` writes a file."""
    path = _existing(args.path)
    from analyzer.verbs.whatif import WhatIfRequest, parse_faster

    request = WhatIfRequest(
        faster=parse_faster(args.faster),
        comm_bandwidth_gbps=args.comm_bandwidth,
        no_launch_overhead=args.no_launch_overhead,
        overlap_comm=args.overlap_comm,
        micro_batch_scale=args.micro_batch_scale,
        accumulate=args.accumulate,
        remove_rank_delay=args.remove_rank_delay,
    )
    if not request.describe():
        raise AnalyzerError(
            "whatif: name a change (--faster, --comm-bandwidth, --no-launch-overhead, --overlap-comm, "
            "--micro-batch-scale, --accumulate, --remove-rank-delay)"
        )
    with _parsing([path], args) as jobs:
        from analyzer.render.whatif import whatif_text
        from analyzer.verbs.whatif import run_traces, whatif

        analysis = _analyze(path, args, jobs)
    # The traces again, from the parse cache the analysis just filled: the graphs need every event.
    traces, _ = run_traces(path, cache=not args.no_cache)  # unusable files: reported by the analysis above
    result = whatif(traces, request, path=str(path), mfu_before=analysis.mfu.median)
    if args.json:
        _write_text(args.json, dumps_json(result.to_json()))
    _print(whatif_text(result))
    return EXIT_OK


@contextlib.contextmanager
def _parsing(paths: Sequence[Path], args: argparse.Namespace) -> Iterator[ParseJobs | None]:
    """:func:`start_parsing`, closed (workers joined) when the block ends."""
    # On Ray the map tasks parse where they run; parsing here first would do their work on this machine.
    jobs = (
        start_parsing(
            paths,
            cache=not args.no_cache,
            import_parser=getattr(args, "import_parser", False),
            critical_path=_critical_path(args),
        )
        if args.engine == "local"
        else None
    )
    try:
        yield jobs
    finally:
        if jobs is not None:
            jobs.close()


def _print(text: str) -> None:
    try:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # `analyzer report X | head`: the reader left; not an error.
        sys.stdout = None


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    return value


def _positive(text: str) -> float:
    value = _fraction(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def positive_int(text: str) -> int:
    """argparse type for counts and 1-based picks (--top, --pick): an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


class _VersionAction(argparse.Action):
    """``--version``: argparse's version action, with the version looked up only when asked
    (:func:`~analyzer.ingest.formats.package_version`; not on every command's parser build)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from analyzer.ingest.formats import package_version

        print(f"{PROG} (trainperf) {package_version()}")  # on stdout, as argparse's own version action
        parser.exit()


def _progress_options() -> argparse.ArgumentParser:
    """Progress and --quiet, of every command that analyzes runs (a parent parser; docs/cli.md, "Progress")."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show the per-rank analysis' progress on stderr (default: only when stderr is a terminal)",
    )
    options.add_argument(
        "--quiet",
        action="store_true",
        help="no progress and no note: lines on stderr; skipped files, warnings and errors are still shown",
    )
    return options


def _analysis_options() -> argparse.ArgumentParser:
    """The options of every command that analyzes runs (a parent parser)."""
    analysis = argparse.ArgumentParser(add_help=False, parents=[_progress_options()])
    analysis.add_argument(
        "--peak-flops",
        type=_positive,
        metavar="F",
        help="peak FLOP/s per device for MFU of foreign traces (e.g. 989e12 for H100 bf16 dense)",
    )
    analysis.add_argument(
        "--no-cache", action="store_true", help="parse the traces again and do not write the parse cache"
    )
    analysis.add_argument(
        "--top", type=positive_int, default=10, metavar="N", help="rows in the kernel tables (default 10)"
    )
    # Where the per-rank map runs (analyzer/engines.py, docs/loading.md "Engines").
    analysis.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="where the per-rank analysis runs: local (this machine's worker pool, default) "
        "or ray (Ray tasks; pip install 'trainperf[ray]')",
    )
    analysis.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="with --engine ray: 'auto' (the cluster this machine belongs to) or "
        "ray://HOST:PORT (Ray Client); default: a local Ray instance with this machine's cores",
    )
    # Bounds on reading one trace file (analyzer/ingest/limits.py, docs/loading.md "Bounds").
    analysis.add_argument(
        "--max-gzip-ratio",
        type=_positive,
        metavar="R",
        help="skip a .gz trace that inflates to more than R times its size (default 64; never below 64 MiB)",
    )
    analysis.add_argument(
        "--max-json-gb", type=_positive, metavar="G", help="skip a trace of more than G GiB of JSON text (default 32)"
    )
    analysis.add_argument(
        "--max-event-mb",
        type=_positive,
        metavar="M",
        help="skip a trace with one event (or other JSON read whole) over M MiB (default 64)",
    )
    return analysis


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``analyzer`` command."""
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a subcommand that is not given --debug keeps the top-level value.
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show the traceback of an unexpected error"
    )
    analysis = _analysis_options()
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Analyze PyTorch training runs: reftrain run directories or folders of Kineto traces.",
        epilog="Exit codes: 0 ok, 1 regression (check), 2 unusable input or usage error, 3 internal error, "
        "4 inconclusive (check). "
        "See docs/cli.md.",
    )
    parser.add_argument("--debug", action="store_true", default=False, help="show the traceback of an unexpected error")
    parser.add_argument("--version", action=_VersionAction, help="show the program's version number and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _report_arguments(
        sub.add_parser(
            "report",
            parents=[common, analysis],
            help="tables of one run; JSON and HTML reports",
            description="Per-rank step time, breakdown, overlap, idle, MFU, stragglers and top kernels of one run.",
        )
    )
    _compare_arguments(
        sub.add_parser(
            "compare",
            parents=[common, analysis],
            help="what changed between two runs",
            description="Per-phase and per-kernel deltas and the MFU delta, largest contributors first.",
        )
    )
    _export_arguments(
        sub.add_parser(
            "export",
            parents=[common, analysis],
            help="the run's tables as CSV/Parquet files, or into TensorBoard, W&B or MLflow",
            description="Write a run's analysis (summary, per rank, training curves, MFU per step, stragglers, "
            "top kernels, ops, modules, roofline, collectives, memory) as one file per table into a folder, or "
            "into a tracker's run with the report attached (docs/export.md).",
        )
    )
    _history_arguments(
        sub.add_parser(
            "history",
            parents=[common, _progress_options()],
            help="headline figures of every run in a folder, in order",
            description="MFU, step time and tokens/s of each reftrain run under RUNS_DIR in order, the "
            "CI gate's verdict between consecutive runs and change points (analyzer/verbs/history.py).",
        )
    )
    _check_arguments(
        sub.add_parser(
            "check",
            parents=[common, analysis],
            help="CI gate: exit 1 when the candidate regressed",
            description="Compare steady-state steps of a candidate with one or more baselines; exit 0 "
            "within bounds, 1 on a regression, 2 on unusable input, 4 when too noisy to tell. See docs/ci.md.",
        )
    )
    _suggest_arguments(
        sub.add_parser(
            "suggest",
            parents=[common, analysis],
            help="ranked config changes with evidence and predicted gain",
            description="Rules over the run's measurements: each suggestion names the change (a reftrain --set "
            "override or plain PyTorch advice), the evidence and the predicted step time and MFU. "
            "See docs/suggestions.md.",
        )
    )
    _whatif_arguments(
        sub.add_parser(
            "whatif",
            parents=[common, analysis],
            help="replay the profiled steps with changed durations: predicted step time, MFU, critical path",
            description="Each rank's profiled step becomes its dependency graph, replayed with the changes "
            "asked for: the predicted step time, MFU and new critical path next to the measured ones. "
            "See docs/cli.md (whatif) and docs/suggestions.md (Replay).",
        )
    )
    return parser


def _report_arguments(p: argparse.ArgumentParser) -> None:
    """``analyzer report``'s own arguments."""
    p.add_argument("path", metavar="PATH", help="a reftrain run directory, a folder of traces, or one trace file")
    p.add_argument(
        "--json", type=Path, metavar="FILE", help="write the versioned JSON report (schema analyzer.report/1)"
    )
    p.add_argument("--html", type=Path, metavar="FILE", help="write a self-contained HTML page with charts")
    p.add_argument(
        "--critical-path",
        action="store_true",
        help="compute each profiled step's critical path (what bounds the step, HTA's categories): a report "
        "section and the JSON's critical_path list; off by default, as it costs about as much CPU as the "
        'rest of the per-rank analysis (docs/metrics.md, "Critical path")',
    )
    p.add_argument(
        "--critical-path-trace",
        type=Path,
        metavar="FILE",
        help="write one rank's trace with each profiled step's critical path marked, for the Perfetto UI "
        "(.json.gz: gzip-compressed; docs/cli.md); implies --critical-path",
    )
    p.add_argument(
        "--critical-path-rank",
        type=int,
        metavar="RANK",
        help="the rank of --critical-path-trace (default: the first rank with a profiled step)",
    )
    p.set_defaults(func=cmd_report)


def _compare_arguments(p: argparse.ArgumentParser) -> None:
    """``analyzer compare``'s own arguments."""
    p.add_argument("base", metavar="BASE", help="baseline run (run directory or trace folder)")
    p.add_argument("cand", metavar="CAND", help="candidate run")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the comparison as JSON (schema analyzer.compare/1)")
    p.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="write a self-contained HTML page (headline, phase chart, deltas; a CI artifact)",
    )
    p.set_defaults(func=cmd_compare)


def _export_arguments(p: argparse.ArgumentParser) -> None:
    """``analyzer export``'s own arguments."""
    p.add_argument("path", help="reftrain run directory or folder of traces")
    p.add_argument(
        "--to",
        nargs=2,
        metavar=("FORMAT", "DIR"),
        required=True,
        help="csv DIR, parquet DIR, tensorboard DIR, wandb DIR (offline) or mlflow URI (extra trackers)",
    )
    p.add_argument(
        "--run-id",
        metavar="RUN_ID",
        help="attach to the live run the trainer logged: its MLflow run id, W&B [[ENTITY/]PROJECT/]ID, "
        "or TensorBoard run folder under DIR (docs/export.md)",
    )
    p.set_defaults(func=cmd_export)


def _history_arguments(p: argparse.ArgumentParser) -> None:
    """``analyzer history``'s own arguments."""
    p.add_argument("runs_dir", metavar="RUNS_DIR", help="folder of reftrain run directories")
    p.add_argument(
        "--by",
        choices=("time", "commit"),
        default="time",
        help="order by start time, or keep the latest run of each commit (default time)",
    )
    p.add_argument("--json", type=Path, metavar="FILE", help="write the history (schema analyzer.history/1)")
    p.add_argument("--html", type=Path, metavar="FILE", help="write a self-contained HTML page (chart and table)")
    p.set_defaults(func=cmd_history)


def _check_arguments(p: argparse.ArgumentParser) -> None:
    """``analyzer check``'s own arguments."""
    p.add_argument("cand", metavar="CAND", help="candidate run (run directory or trace folder)")
    p.add_argument(
        "--baseline",
        required=True,
        action="append",
        metavar="BASE",
        help="baseline run; repeat for several (e.g. the base branch trained twice): pooled, and their "
        "spread counts as noise",
    )
    p.add_argument(
        "--max-mfu-drop",
        type=_fraction,
        default=0.05,
        metavar="D",
        help="largest allowed relative drop, (base - cand) / base (default 0.05)",
    )
    p.add_argument(
        "--alpha",
        type=_fraction,
        default=0.05,
        help="significance level of the one-sided Mann-Whitney U test (default 0.05)",
    )
    p.add_argument(
        "--quantile",
        type=_fraction,
        default=0.25,
        metavar="Q",
        help="quantile of step time compared (default 0.25: the fast steps, least disturbed by "
        "neighbours; 0.5 = median)",
    )
    p.add_argument(
        "--no-cpu-time",
        action="store_true",
        help="CPU runs: do not require CPU time per step to confirm a wall-clock regression",
    )
    p.add_argument(
        "--no-machine-speed",
        action="store_true",
        help="CPU runs with the machine-speed canary (reftrain's or the recorder's): do not withdraw a verdict that the machine's "
        "own speed change explains (docs/ci.md)",
    )
    p.add_argument(
        "--min-goodput",
        type=_fraction,
        default=None,
        metavar="G",
        help="also fail (exit 1) when the candidate's goodput, productive step time / wall time, is "
        "below G (0-1; reftrain run directories only; docs/ci.md)",
    )
    p.add_argument(
        "--max-memory-growth",
        type=_fraction,
        default=None,
        metavar="FRAC",
        help="also fail (exit 1) when the candidate's peak memory (max over ranks) exceeds the "
        "baselines' by more than FRAC (0.05: +5%%; docs/ci.md)",
    )
    p.add_argument(
        "--inconclusive",
        choices=("exit", "pass", "fail"),
        default="exit",
        help="when the runs are too noisy to tell: exit 4 (default), or treat as pass (0) or fail (1)",
    )
    p.add_argument(
        "--summary",
        type=Path,
        metavar="FILE",
        help="write a Markdown summary (on GitHub Actions it is appended to $GITHUB_STEP_SUMMARY anyway)",
    )
    p.add_argument("--json", type=Path, metavar="FILE", help="write the verdict as JSON (schema analyzer.check/2)")
    p.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="write a self-contained HTML page (verdict, statistics, per-step chart, deltas)",
    )
    p.add_argument(
        "--junit", type=Path, metavar="FILE", help="write JUnit XML, one test case per gated metric (docs/ci.md)"
    )
    p.set_defaults(func=cmd_check)


def _suggest_arguments(p: argparse.ArgumentParser) -> None:
    """``analyzer suggest``'s own arguments."""
    from analyzer.verbs.suggest.engine import SCHEMA as SUGGESTIONS_SCHEMA

    p.add_argument("path", metavar="PATH", help="a reftrain run directory, a folder of traces, or one trace file")
    p.add_argument(
        "--json", type=Path, metavar="FILE", help=f"write the suggestions as JSON (schema {SUGGESTIONS_SCHEMA})"
    )
    p.add_argument(
        "--emit-config",
        type=Path,
        metavar="FILE",
        help="write a reftrain config (YAML) with the picked suggestion applied: reftrain --config FILE",
    )
    p.add_argument(
        "--pick", type=positive_int, default=1, metavar="N", help="which suggestion --emit-config applies (1 = top)"
    )
    p.add_argument(
        "--replay",
        action="store_true",
        help="predict with the replay of the profiled steps where it simulates the change (docs/suggestions.md, "
        "Replay); the report's suggestions keep the closed form",
    )
    p.set_defaults(func=cmd_suggest)


def _whatif_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH", help="a reftrain run directory, a folder of traces, or one trace file")
    p.add_argument(
        "--faster",
        action="append",
        default=[],
        metavar="CLASS=K",
        help="kernels of this class K times faster (gemm, attention, convolution, elementwise, reduction, "
        "normalization, communication, memcpy, memset, other); repeatable",
    )
    p.add_argument(
        "--comm-bandwidth",
        type=_positive,
        metavar="GBPS",
        help="collectives at this bus bandwidth (GB/s), alpha-beta with the fixed cost fitted on the trace's own",
    )
    p.add_argument(
        "--no-launch-overhead",
        action="store_true",
        help="launches cost nothing (CUDA graphs): launch delays and launch calls' CPU time removed",
    )
    p.add_argument("--overlap-comm", action="store_true", help="communication hidden behind compute: it blocks nothing")
    p.add_argument(
        "--micro-batch-scale",
        type=_positive,
        metavar="F",
        help="a micro-batch F times larger: compute scales by F, launches and collectives do not",
    )
    p.add_argument(
        "--accumulate",
        type=positive_int,
        metavar="K",
        help="K times the micro-batches per optimizer step: all but the gradient sync and the optimizer repeat",
    )
    p.add_argument(
        "--remove-rank-delay", type=int, metavar="R", help="rank R's delay removed (traces of two or more ranks)"
    )
    p.add_argument("--json", type=Path, metavar="FILE", help="write the result as JSON (schema analyzer.whatif/1)")
    p.set_defaults(func=cmd_whatif)


def _limit_options(args: argparse.Namespace) -> list:
    return [getattr(args, name, None) for name in ("max_gzip_ratio", "max_json_gb", "max_event_mb")]


def _apply_limits(args: argparse.Namespace) -> None:
    """The parse bounds given on the command line, in force for this process
    and its parse workers (before any is started)."""
    given = _limit_options(args)
    if any(v is not None for v in given):
        from analyzer.ingest import limits

        limits.apply(limits.from_options(*given))


def _without_arrow(args: argparse.Namespace) -> None:
    """Keep pyarrow out of this process when the command cannot need it.

    pandas imports pyarrow whenever it is installed (about 50 ms of a
    0.6 s cold report) and then backs every text column with Arrow
    strings, which are slower to build than Python ones for the short
    tables of a rank summary. The analyzer's tables are numpy, categorical
    and object columns, and its figures do not depend on how pandas stores
    text (tests/test_cli_arrow.py compares the reports). A ``None`` entry
    in ``sys.modules`` makes ``import pyarrow`` raise ImportError
    (Python's documented way), so pandas takes its Python string storage.
    Only the console script does this, for a process of its own that ends
    with the command; never when pandas is already imported (a notebook
    or a test calling :func:`main`), for ``export`` (Parquet and the
    trackers' clients use Arrow) or for ``--engine ray`` (Ray's driver
    imports it).
    """
    if args.command == "export" or getattr(args, "engine", "local") != "local":
        return
    if "pandas" in sys.modules or "pyarrow" in sys.modules:
        return
    sys.modules["pyarrow"] = None  # type: ignore[assignment]


def _one_blas_thread(args: argparse.Namespace) -> None:
    """Let this process import the parser before it forks the parse workers.

    Importing numpy starts OpenBLAS's thread pool, and a process with
    threads does not fork its workers (analyzer/ingest/jobs.py): so far each
    worker imported numpy and the parser itself (~50 ms, on the critical
    path of a cold report, and again in every worker). With OpenBLAS held
    to one thread (``OPENBLAS_NUM_THREADS=1``, read at numpy's import)
    numpy starts none, :func:`start_parsing` imports the parser here and the
    forked workers inherit it: a cold report of trace_diff/control took
    0.45 s instead of 0.50. The analysis does no BLAS work that threads
    would speed up (a few least-squares fits of a handful of points). Only
    the console script, for a process of its own that ends with the
    command, and only when numpy is not imported yet; a user's own
    ``OPENBLAS_NUM_THREADS`` is kept (with more than one thread the workers
    import the parser themselves, as before). Not for ``--engine ray``,
    whose tasks parse where they run.
    """
    if getattr(args, "engine", "local") != "local" or "numpy" in sys.modules:
        return
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    args.import_parser = os.environ["OPENBLAS_NUM_THREADS"] == "1"


def main(argv: Sequence[str] | None = None, *, own_process: bool = False) -> int:
    """Entry point of the ``analyzer`` console script; returns the exit code.

    ``own_process``: the caller is :func:`console_main`, whose process ends
    with this command (:func:`_without_arrow`, :func:`_one_blas_thread`).
    """
    parser = build_parser()
    args = parser.parse_args(argv)  # usage errors: argparse prints usage, exits 2
    if getattr(args, "ray_address", None) is not None and args.engine != "ray":
        parser.error("--ray-address needs --engine ray")
    if getattr(args, "quiet", False) and getattr(args, "progress", None):
        parser.error("--quiet shows no progress: leave out --progress")
    if own_process:
        _without_arrow(args)
        _one_blas_thread(args)
    _apply_limits(args)
    func: Callable[[argparse.Namespace], int] = args.func
    quiet = _QUIET.set(getattr(args, "quiet", False))
    try:
        return func(args)
    except AnalyzerError as exc:
        skipped = list(getattr(exc, "skipped", ()))
        if len(skipped) > 1:  # every unusable file, when the error line names only the first
            for line in skipped:
                _say("skipped", line)
        _say("error", str(exc))
        return EXIT_UNUSABLE
    except KeyboardInterrupt:
        _say("", "interrupted")
        return 130
    except Exception as exc:  # the one place that turns a bug into one line
        if args.debug:
            raise
        where = ""
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if tb is not None:
            where = f" at {Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno}"
        _say("internal error", f"{type(exc).__name__}: {exc}{where} (a bug; rerun with --debug for the traceback)")
        return EXIT_INTERNAL
    finally:
        _QUIET.reset(quiet)


def console_main() -> None:
    """The ``analyzer`` console script: :func:`main`, then a quick exit.

    Tearing the interpreter down after an analysis (every pandas object
    freed one by one, then module teardown) took 0.15-0.2 s of a 1.5 s cold
    report of trace_diff/control. Nothing is pending by then: every output
    file is written and closed and the parse workers are joined. So the
    streams are flushed and the process ends with ``os._exit``.
    """
    code = main(own_process=True)
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed pipe: the reader left
            pass
    os._exit(code)


if __name__ == "__main__":
    console_main()
