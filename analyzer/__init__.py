"""analyzer: training-performance analysis of PyTorch runs (docs/api.md).

The public API, the same functions the CLI and the dashboard use::

    from analyzer import analyze, compare, check

    base = analyze("runs/base")            # a reftrain run directory or a folder of Kineto traces
    cand = analyze("runs/cand")
    print(cand.mfu.median, cand.mfu.source)
    diff = compare(base, cand)             # phase, kernel and MFU deltas, largest first
    gate = check(base, cand, max_drop=0.05)
    print(gate.result.verdict)             # "pass" or "regression"

``analyzer.compare`` and ``analyzer.check`` are these functions, not the
modules of the same name (imported here first, so the functions win); reach
the modules' other names with ``from analyzer.compare import Comparison``.
"""
from __future__ import annotations

from analyzer.api import RunAnalysis, analyze
from analyzer.check import GateOutcome, check
from analyzer.compare import Comparison, compare
from analyzer.errors import AnalyzerError, TraceError

__all__ = ["analyze", "compare", "check", "RunAnalysis", "Comparison", "GateOutcome", "AnalyzerError", "TraceError"]
