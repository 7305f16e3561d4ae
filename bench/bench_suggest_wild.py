"""Suggestions on traces this project did not produce (issue 18 item 4).

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

# The part of the step each rule acts on (rules_health._CONTRIBUTOR_RULES read the other way round).
RULE_PART = {
    "ddp_bucket_size": "exposed_comm", "grad_accumulation": "exposed_comm", "fsdp_reshard": "exposed_comm",
    "comm_compression": "exposed_comm", "overlap_grad_sync": "grad_sync", "gradient_as_bucket_view": "exposed_comm",
    "launch_bound": "idle", "cuda_graphs": "idle", "data_wait": "data", "pin_memory": "exposed_memcpy",
    "exposed_memcpy": "exposed_memcpy", "fused_adamw": "optimizer", "torch_compile": "compute",
    "bf16_autocast": "compute", "tf32": "compute", "micro_batch": "other", "smaller_micro_batch": "other",
    "activation_checkpointing": "compute", "straggler": "exposed_comm", "comm_one_rank": "exposed_comm",
}
# Rules whose what-if also acts on a second part: launch_bound's larger batch fills idle time and spreads the
# fixed (non-batch-scaled) exposed comm over k times the work (rules_compute.rule_launch_bound).
ALSO_PARTS = {"launch_bound": ("exposed_comm",)}
# Parts no rule removes as such (compute is acted on, overlapped comm is already hidden).
NOT_ACTIONABLE = {"overlapped_comm", "collective_wait"}


def parts_of(rule: str) -> tuple[str, ...]:
    """Every breakdown part a rule's what-if acts on (empty for diagnoses without one)."""
    return ((RULE_PART[rule],) if rule in RULE_PART else ()) + ALSO_PARTS.get(rule, ())


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and (p.name.endswith(".json") or p.name.endswith(".json.gz")))


def row(path: Path) -> dict:
    from analyzer import analyze
    from analyzer.verbs.suggest import suggest
    from analyzer.verbs.suggest.facts import run_facts

    try:
        run = analyze(path)
        facts = run_facts(run)
        sugg = suggest(run)
    except Exception as exc:  # noqa: BLE001 - a bench row, not a crash: the analyzer's one-line error is the result
        return {"trace": path, "error": str(exc).splitlines()[0][:100]}
    shares = {k: v for k, v in (facts.shares or {}).items() if v}
    actionable = {k: v for k, v in shares.items() if k not in NOT_ACTIONABLE}
    largest = max(actionable, key=actionable.get) if actionable else None
    top = [(s.rule, s.kind, s.gain, RULE_PART.get(s.rule, "-")) for s in sugg[:3]]
    first_change = next((s for s in sugg if s.kind == "change"), None)
    ok = None if first_change is None or largest is None else largest in parts_of(first_change.rule)
    return {"trace": path, "source": facts.shares_source, "shares": shares, "largest": largest, "top": top, "first_ok": ok}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "traces")
    ap.add_argument("--markdown", action="store_true", help="print the docs/suggestions.md table")
    args = ap.parse_args(argv)
    if not args.traces.is_dir():
        print(f"error: {args.traces}: no such folder (the shared traces)", file=sys.stderr)
        return 2
    if args.markdown:
        print("| trace | breakdown (% of step) | top 3 (gain, part) | first change addresses largest part |")
        print("|---|---|---|---|")
    for p in _files(args.traces):
        r = row(p)
        name = str(p.relative_to(args.traces))
        if "error" in r:
            print(f"| {name} | error: {r['error']} | | |" if args.markdown else f"{name}: error: {r['error']}")
            continue
        parts = ", ".join(f"{k} {v:.0%}" for k, v in sorted(r["shares"].items(), key=lambda kv: -kv[1])) or "-"
        top = "; ".join(f"{rule}{' (diagnosis)' if kind == 'diagnosis' else ''} +{g:.0%} -> {part}" for rule, kind, g, part in r["top"]) or "-"
        ok = {True: "yes", False: f"no (largest: {r['largest']})", None: "n/a"}[r["first_ok"]]
        print(f"| {name} | {parts} | {top} | {ok} |" if args.markdown else f"{name}\n  parts: {parts}\n  top: {top}\n  first change on largest part: {ok}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
