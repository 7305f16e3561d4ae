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
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence

from analyzer.errors import AnalyzerError
from analyzer.suggest.cli import positive_int

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_UNUSABLE = 2
EXIT_INTERNAL = 3
PROG = "analyzer"


def _say(kind: str, message: str) -> None:
    """One line on stderr: ``analyzer: <kind>: <message>`` (newlines folded)."""
    text = " ".join(str(message).split())
    print(f"{PROG}: {kind}: {text}" if kind else f"{PROG}: {text}", file=sys.stderr)


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


def _analyze(path: Path, args: argparse.Namespace):
    """Analyze one run; report its skipped files and warnings on stderr."""
    from analyzer.api import analyze

    analysis = analyze(path, peak_flops=args.peak_flops, cache=not args.no_cache)
    for error in analysis.errors:
        _say("skipped", error)
    for warning in analysis.warnings:
        _say("warning", warning)
    return analysis


def cmd_report(args: argparse.Namespace) -> int:
    from analyzer import report

    analysis = _analyze(_existing(args.path), args)
    text = report.render_text(analysis, top=args.top)
    if args.json:
        _write_text(args.json, report.dumps_json(report.report_json(analysis)))
    if args.html:
        _write_text(args.html, report.render_html(analysis))
    _print(text)
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    from analyzer import report
    from analyzer.compare import compare

    base = _analyze(_existing(args.base), args)
    cand = _analyze(_existing(args.cand), args)
    comparison = compare(base, cand, top=args.top)
    if args.json:
        _write_text(args.json, report.dumps_json(comparison.to_json()))
    _print(report.render_compare_text(comparison))
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    from analyzer import report
    from analyzer.check import CheckConfig, check

    CheckConfig(max_drop=args.max_mfu_drop, alpha=args.alpha)  # reject bad values before analyzing
    cand = _analyze(_existing(args.cand), args)
    base = _analyze(_existing(args.baseline), args)
    outcome = check(base, cand, max_drop=args.max_mfu_drop, alpha=args.alpha)
    explanation = outcome.explanation
    if args.summary:
        _write_text(args.summary, report.render_check_markdown(outcome, explanation))
    if args.json:
        _write_text(args.json, report.dumps_json(outcome.to_json()))
    _print(report.render_check_text(outcome, explanation))
    return EXIT_REGRESSION if outcome.result.regression else EXIT_OK


def _print(text: str) -> None:
    try:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # `analyzer report X | head`: the reader left; not an error.
        sys.stdout = None  # type: ignore[assignment]


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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``analyzer`` command."""
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a subcommand that is not given --debug keeps the top-level value.
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an unexpected error")
    analysis = argparse.ArgumentParser(add_help=False)
    analysis.add_argument("--peak-flops", type=_positive, metavar="F",
                          help="peak FLOP/s per device for MFU of foreign traces (e.g. 989e12 for H100 bf16 dense)")
    analysis.add_argument("--no-cache", action="store_true",
                          help="parse the traces again and do not write the Parquet cache")
    analysis.add_argument("--top", type=positive_int, default=10, metavar="N", help="rows in the kernel tables (default 10)")

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Analyze PyTorch training runs: reftrain run directories or folders of Kineto traces.",
        epilog="Exit codes: 0 ok, 1 regression (check), 2 unusable input or usage error, 3 internal error. "
        "See docs/cli.md.",
    )
    parser.add_argument("--debug", action="store_true", default=False,
                        help="show the traceback of an unexpected error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("report", parents=[common, analysis], help="tables of one run; JSON and HTML reports",
                       description="Per-rank step time, breakdown, overlap, idle, MFU, stragglers and top kernels of one run.")
    p.add_argument("path", metavar="PATH", help="a reftrain run directory, a folder of traces, or one trace file")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the versioned JSON report (schema analyzer.report/1)")
    p.add_argument("--html", type=Path, metavar="FILE", help="write a self-contained HTML page with charts")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("compare", parents=[common, analysis], help="what changed between two runs",
                       description="Per-phase and per-kernel deltas and the MFU delta, largest contributors first.")
    p.add_argument("base", metavar="BASE", help="baseline run (run directory or trace folder)")
    p.add_argument("cand", metavar="CAND", help="candidate run")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the comparison as JSON (schema analyzer.compare/1)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("check", parents=[common, analysis], help="CI gate: exit 1 when the candidate regressed",
                       description="Compare steady-state steps of a candidate with a baseline; exit 0 within bounds, "
                       "1 on a regression, 2 on unusable input. See docs/ci.md.")
    p.add_argument("cand", metavar="CAND", help="candidate run (run directory or trace folder)")
    p.add_argument("--baseline", required=True, metavar="BASE", help="baseline run")
    p.add_argument("--max-mfu-drop", type=_fraction, default=0.05, metavar="D",
                   help="largest allowed relative drop of the median, (base - cand) / base (default 0.05)")
    p.add_argument("--alpha", type=_fraction, default=0.05,
                   help="significance level of the one-sided Mann-Whitney U test (default 0.05)")
    p.add_argument("--summary", type=Path, metavar="FILE", help="write a Markdown summary (e.g. $GITHUB_STEP_SUMMARY)")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the verdict as JSON (schema analyzer.check/1)")
    p.set_defaults(func=cmd_check)

    from analyzer.suggest.cli import add_suggest_subcommand  # analyzer suggest (docs/suggestions.md)

    add_suggest_subcommand(sub, parents=[common, analysis])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``analyzer`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)  # usage errors: argparse prints usage, exits 2
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except AnalyzerError as exc:
        _say("error", exc)
        return EXIT_UNUSABLE
    except KeyboardInterrupt:
        _say("", "interrupted")
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place that turns a bug into one line
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


if __name__ == "__main__":
    sys.exit(main())
