"""The ``analyzer suggest`` subcommand: ranked suggestions, their JSON, and an emitted reftrain config.

``analyzer suggest PATH [--json FILE] [--emit-config FILE] [--pick N]``.
analyzer/cli.py registers it with :func:`add_suggest_subcommand`; errors
are AnalyzerError (one line, exit 2, printed by analyzer.cli.main).
"""
from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from analyzer.errors import AnalyzerError
from analyzer.verbs.suggest.engine import SCHEMA, Suggestion, suggestions_json


def positive_int(text: str) -> int:
    """argparse type for counts and 1-based picks (--top, --pick): an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def add_suggest_subcommand(sub: "argparse._SubParsersAction", parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.ArgumentParser:
    """Add ``suggest`` to the analyzer's subparsers; ``parents`` carry the shared options (--peak-flops, ...)."""
    p = sub.add_parser(
        "suggest", parents=list(parents), help="ranked config changes with evidence and predicted gain",
        description="Rules over the run's measurements: each suggestion names the change (a reftrain --set override "
                    "or plain PyTorch advice), the evidence and the predicted step time and MFU. See docs/suggestions.md.")
    p.add_argument("path", metavar="PATH", help="a reftrain run directory, a folder of traces, or one trace file")
    p.add_argument("--json", type=Path, metavar="FILE", help=f"write the suggestions as JSON (schema {SCHEMA})")
    p.add_argument("--emit-config", type=Path, metavar="FILE",
                   help="write a reftrain config (YAML) with the picked suggestion applied: reftrain --config FILE")
    p.add_argument("--pick", type=positive_int, default=1, metavar="N", help="which suggestion --emit-config applies (1 = top)")
    p.set_defaults(func=run_suggest)
    return p


def suggestions_document(ra, suggestions: list[Suggestion], config_path: str | None,
                         nproc: int | None = None) -> dict[str, Any]:
    """The ``--json`` document: schema, run identity and ``suggestions[]``."""
    return {
        "schema": SCHEMA,
        "path": [str(p) for p in ra.path] if isinstance(ra.path, list) else str(ra.path),
        "kind": ra.kind,
        "run_id": ra.run_manifest.run_id,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "suggestions": suggestions_json(suggestions, config_path, nproc),
    }


def run_suggest(args: argparse.Namespace) -> int:
    """Analyze PATH, print the ranked suggestions, write --json / --emit-config; returns the exit code (0)."""
    from analyzer.api import analyze
    from analyzer.jsontext import dumps_json
    from analyzer.verbs.printable import run_messages, say
    from analyzer.verbs.suggest.emit import emit_config
    from analyzer.verbs.suggest.facts import run_facts
    from analyzer.verbs.suggest.render import render_text
    from analyzer.verbs.suggest.run import suggest

    path = Path(args.path)
    if not path.exists():
        raise AnalyzerError(f"{path}: no such file or directory")
    ra = analyze(path, peak_flops=getattr(args, "peak_flops", None), cache=not getattr(args, "no_cache", False),
                 jobs=getattr(args, "parse_jobs", None), engine=getattr(args, "engine", "local"),
                 ray_address=getattr(args, "ray_address", None), progress=getattr(args, "progress_line", None))
    for kind, message in run_messages(ra):  # what `analyzer report` says about the same input
        say(kind, message)
    suggestions = suggest(ra)
    facts = run_facts(ra)
    config_path, nproc = facts.config_path, facts.world_size
    if args.json:
        _write(args.json, dumps_json(suggestions_document(ra, suggestions, config_path, nproc)))
    sys.stdout.write(render_text(suggestions, config_path, nproc=nproc))
    sys.stdout.flush()
    if args.emit_config:
        if args.pick > len(suggestions):
            raise AnalyzerError(f"--pick {args.pick}: only {len(suggestions)} suggestion(s) for {path}")
        chosen = suggestions[args.pick - 1]
        written = emit_config(ra, chosen, args.emit_config)
        print(f"\nwrote {written} ({chosen.rule} applied); run it: reftrain --nproc {nproc} --config {written}", flush=True)
    return 0


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise AnalyzerError(f"cannot write {path}: {exc.strerror or exc}") from None
