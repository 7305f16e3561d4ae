"""Suggestions on traces this project did not produce.

For every trace file under the shared traces folder (each file read as its
own run): the device/host breakdown's parts (share of the step), the top three
suggestions with their predicted gains and the part each addresses, and
whether the first ``change`` suggestion addresses the largest part a rule can
act on. Reads traces only: not timing-sensitive, safe on a busy machine.

    .venv/bin/python bench/bench_suggest_wild.py [--traces ../shared/traces] [--markdown]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# The part of the step each rule acts on, and the parts no rule removes: the engine's tables (one definition).
from analyzer.verbs.suggest.engine import part_of, parts_of


def _files(root: Path) -> list[Path]:
    return sorted(
        p for p in root.rglob("*") if p.is_file() and (p.name.endswith(".json") or p.name.endswith(".json.gz"))
    )


def row(path: Path) -> dict:
    from analyzer import analyze
    from analyzer.verbs.suggest import suggest
    from analyzer.verbs.suggest.facts import run_facts

    try:
        run = analyze(path)
        facts = run_facts(run)
        sugg = suggest(run)
    except Exception as exc:  # noqa: BLE001 - a bench row, not a crash: the analyzer's one-line error is the result
        return {"trace": path, "error": str(exc).splitlines()[0].removeprefix(f"{path}: ")[:100]}
    from analyzer.verbs.suggest.run import largest_actionable

    shares = {k: v for k, v in (facts.shares or {}).items() if v}
    top_part = largest_actionable(facts)
    largest = top_part[0] if top_part else None
    top = [(s.rule, s.kind, s.gain, part_of(s.rule) or "-", s.confidence) for s in sugg[:3]]
    first = sugg[0] if sugg else None
    # The first suggestion addresses the largest actionable part, or its first note says why not (run.first_note).
    ok = (
        None
        if first is None or largest is None
        else (
            "yes"
            if largest in parts_of(first.rule)
            else "why not: " + first.notes[0].split(": ", 1)[1]
            if first.notes and first.notes[0].startswith("ranked first although")
            else f"no (largest: {largest})"
        )
    )
    comm = facts.comm_diagnosis.verdict if facts.comm_diagnosis is not None else "-"
    return {
        "trace": path,
        "source": facts.shares_source,
        "shares": shares,
        "largest": largest,
        "top": top,
        "first_ok": ok,
        "comm": comm,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "traces")
    ap.add_argument("--markdown", action="store_true", help="print the docs/suggestions.md table")
    args = ap.parse_args(argv)
    if not args.traces.is_dir():
        print(f"error: {args.traces}: no such folder (the shared traces)", file=sys.stderr)
        return 2
    if args.markdown:
        print(
            "| trace | breakdown (% of step) | comm verdict | top 3 (gain, part, confidence) | first addresses largest actionable part |"
        )
        print("|---|---|---|---|---|")
    for p in _files(args.traces):
        r = row(p)
        name = str(p.relative_to(args.traces))
        if "error" in r:
            print(f"| {name} | error: {r['error']} | | | |" if args.markdown else f"{name}: error: {r['error']}")
            continue
        parts = ", ".join(f"{k} {v:.0%}" for k, v in sorted(r["shares"].items(), key=lambda kv: -kv[1])) or "-"
        top = (
            "; ".join(
                f"{rule}{' (diagnosis)' if kind == 'diagnosis' else ''} +{g:.0%} -> {part}, {conf}"
                for rule, kind, g, part, conf in r["top"]
            )
            or "-"
        )
        ok = r["first_ok"] or "n/a"
        print(
            f"| {name} | {parts} | {r['comm']} | {top} | {ok} |"
            if args.markdown
            else f"{name}\n  parts: {parts}\n  comm: {r['comm']}\n  top: {top}\n  first on largest part: {ok}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
