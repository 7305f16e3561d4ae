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
modules of the same name; reach the modules' other names with
``from analyzer.compare import Comparison``.

The names are imported on first use, not here: ``analyzer`` commands start
parsing traces before pandas (about 1 s to import) is loaded, and
``analyzer report`` answers from its result cache without it.
"""
from __future__ import annotations

import importlib
import sys
import types

from analyzer.errors import AnalyzerError, TraceError

_LAZY = {
    "analyze": "analyzer.api",
    "RunAnalysis": "analyzer.api",
    "check": "analyzer.check",
    "GateOutcome": "analyzer.check",
    "compare": "analyzer.compare",
    "Comparison": "analyzer.compare",
}

__all__ = ["analyze", "compare", "check", "RunAnalysis", "Comparison", "GateOutcome", "AnalyzerError", "TraceError"]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'analyzer' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def _function_of(module: str) -> property:
    """``analyzer.<module>`` reads as the function of that name.

    Importing the submodule ``analyzer.compare`` sets the package attribute
    ``compare`` to the module; a property on the package's class is a data
    descriptor, which attribute lookup prefers to the module's ``__dict__``,
    so the function still wins (and the import system's assignment is
    ignored: the module stays reachable through ``sys.modules``).
    """
    name = module.rsplit(".", 1)[1]
    return property(lambda self: getattr(importlib.import_module(module), name), lambda self, value: None)


class _Package(types.ModuleType):
    compare = _function_of("analyzer.compare")
    check = _function_of("analyzer.check")


sys.modules[__name__].__class__ = _Package
