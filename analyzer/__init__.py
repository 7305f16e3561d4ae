"""analyzer: training-performance analysis of PyTorch runs (docs/api.md).

The public API, the same functions the CLI and the dashboard use::

    from analyzer import analyze, compare, check

    base = analyze("runs/base")            # a reftrain run directory or a folder of Kineto traces
    cand = analyze("runs/cand")
    print(cand.mfu.median, cand.mfu.source)
    diff = compare(base, cand)             # phase, kernel and MFU deltas, largest first
    gate = check(base, cand, max_drop=0.05)
    print(gate.result.verdict)             # "pass" or "regression"

The layers (docs/architecture.md): ``analyzer.ingest`` finds and reads
traces into tables, ``analyzer.metrics`` computes over them,
``analyzer.api`` joins the two, ``analyzer.verbs`` holds one module per
command, ``analyzer.cli`` is the argument layer.

The names are imported on first use (PEP 562), not here: ``analyzer``
commands start parsing traces before pandas (about 1 s to import) is loaded,
and ``analyzer report`` answers from its result cache without it.
"""

from __future__ import annotations

import importlib
import sys

from analyzer.errors import AnalyzerError, TraceError

# The trainperf distribution's version: pyproject.toml reads it from here (tool.setuptools.dynamic).
__version__ = "0.1.0"

_LAZY = {
    "analyze": "analyzer.api",
    "RunAnalysis": "analyzer.api",
    "check": "analyzer.verbs.check",
    "GateOutcome": "analyzer.verbs.check",
    "compare": "analyzer.verbs.compare",
    "Comparison": "analyzer.verbs.compare",
}

__all__ = ["analyze", "compare", "check", "RunAnalysis", "Comparison", "GateOutcome", "AnalyzerError", "TraceError"]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'analyzer' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def _register_notebook_views() -> None:
    """Inside IPython (Jupyter), runs, comparisons and gate verdicts display as HTML summaries:
    analyzer/render/notebook.py registers them with the shell's HTML formatter. Loaded by name like the names
    above, and only when IPython is running, so that importing an analyzer module loads no renderer."""
    if "IPython" in sys.modules:
        importlib.import_module("analyzer.render.notebook").register_in_running_ipython()


_register_notebook_views()
