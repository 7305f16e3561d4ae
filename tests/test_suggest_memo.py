"""Suggest computes an analysis' facts and ranked suggestions once and keeps them beside the analysis
(analyzer/verbs/suggest/memo.py), never inside it: no verb writes into a RunAnalysis."""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path

from analyzer import analyze
from analyzer.verbs.suggest import memo, report_suggestions, suggest
from analyzer.verbs.suggest.facts import run_facts

RUN = Path(__file__).resolve().parent.parent / "traces" / "example-ddp-w2-slow-rank1"


def test_facts_and_suggestions_are_kept_beside_the_analysis_once():
    ra = analyze(RUN, cache=False)
    before = {f.name: getattr(ra, f.name) for f in dataclasses.fields(ra)}
    first = suggest(ra)
    assert first and report_suggestions(ra)  # this run fires rules: the memo holds something
    facts = run_facts(ra)
    # Asked again: the same objects, not a recomputation.
    assert run_facts(ra) is facts and suggest(ra) == first and suggest(ra)[0] is first[0]
    assert memo.memo_of(ra).facts is facts and memo.memo_of(ra).suggestions == tuple(first)
    # Nothing written into the analysis: every field is the object it was, and derived holds no suggest value.
    assert all(getattr(ra, name) is value for name, value in before.items())
    assert not ra.derived
    # A copy is another analysis, with its own memo; each memo goes when its analysis is collected.
    copy = dataclasses.replace(ra)
    assert memo.memo_of(copy).facts is None
    keys = (id(ra), id(copy))
    assert set(keys) <= set(memo._MEMOS)
    del ra, copy
    gc.collect()
    assert not set(keys) & set(memo._MEMOS)
