"""Invariants over the registries, not over hand-picked members.

* Every suggestion rule (``analyzer.verbs.suggest.engine.RULES``, filled by the
  rule modules as they are imported) returns None on empty facts, and none
  raises: facts with nothing measured, for every kind of input and device,
  and the facts of an analysis of nothing (``api._reduce`` over no rank).
* Every metric (``analyzer.metrics.registry.METRICS``) returns its typed empty
  result on empty tables built with the real schema: an instance of its return
  annotation, no warning on the way, and nothing measured in it (every table
  and array without rows, every number 0 or None) apart from the fields the
  registry names as echoes of a setting or a coordinate, which must be finite.
* Every public function of ``analyzer.metrics.*`` that takes a table is
  registered, so a new metric cannot skip these checks.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import importlib
import inspect
import math
import numbers
import pkgutil
import types
import typing
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import analyzer.metrics
from analyzer.api import RunInputs, _reduce
from analyzer.ingest.formats import RunManifest
from analyzer.ingest.rundir import METRICS_COLUMNS
from analyzer.metrics.registry import EMPTY_INPUTS, METRICS, Metric
from analyzer.metrics.stragglers import find_stragglers
from analyzer.verbs.suggest import run as suggest_run
from analyzer.verbs.suggest.engine import RULES
from analyzer.verbs.suggest.facts import MemoryFacts, RunFacts, run_facts

# ----------------------------------------------------------------------------- suggestion rules


def nothing_measured_facts(kind: str, device: str) -> RunFacts:
    """RunFacts with every required field at its 'unknown' value: None, empty, 0."""
    empty_stragglers = find_stragglers(
        EMPTY_INPUTS["metrics"](), EMPTY_INPUTS["arrivals"](), step_source=None, arrival_source=None
    )
    values: dict[str, Any] = {"kind": kind, "device": device}
    for f in dataclasses.fields(RunFacts):
        if f.name in values or f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        hint = str(f.type)
        if "None" in hint.split("|") or hint.endswith("| None") or hint.endswith("None"):
            values[f.name] = None
        elif hint.startswith("dict"):
            values[f.name] = {}
        elif hint == "int":
            values[f.name] = 0
        elif hint == "str":
            values[f.name] = ""
        elif hint == "MemoryFacts":
            values[f.name] = MemoryFacts(None, None, None, None)
        elif "StragglerResult" in hint:
            values[f.name] = empty_stragglers
        else:
            raise AssertionError(f"RunFacts.{f.name} ({hint}) is new and required: give its empty value here")
    return RunFacts(**values)


def empty_analysis_facts(kind: str) -> RunFacts:
    """The facts of an analysis of nothing: the reduce over no rank, with an empty manifest and no
    metrics records for a reftrain run."""
    reftrain = kind == "reftrain"
    analysis = _reduce(
        RunInputs(
            path=Path("nothing"),
            kind=kind,  # type: ignore[arg-type]
            manifest=RunManifest().to_json() if reftrain else None,
            metrics=pd.DataFrame({c: pd.Series(dtype=t) for c, t in METRICS_COLUMNS.items()}) if reftrain else None,
            records=None,
            parts={},
            peak_flops=None,
            errors=[],
            warnings=[],
        )
    )
    return run_facts(analysis)


EMPTY_FACTS = {
    **{
        f"nothing-{k}-{d}": (lambda k=k, d=d: nothing_measured_facts(k, d))
        for k in ("reftrain", "traces")
        for d in ("cpu", "cuda")
    },
    "empty-analysis-traces": lambda: empty_analysis_facts("traces"),
    "empty-analysis-reftrain": lambda: empty_analysis_facts("reftrain"),
}


def test_rules_are_registered():
    # run imports every rule module; each registers its rules with @rule on import.
    assert suggest_run.RULES is RULES and len(RULES) >= 15


@pytest.mark.parametrize("facts_kind", list(EMPTY_FACTS))
@pytest.mark.parametrize("rule", RULES, ids=[r.__name__ for r in RULES])
def test_no_rule_fires_on_empty_facts(rule, facts_kind):
    facts = EMPTY_FACTS[facts_kind]()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rule(facts) is None


def test_suggest_on_an_empty_analysis_is_empty():
    analysis = _reduce(
        RunInputs(
            path=Path("nothing"),
            kind="traces",
            manifest=None,
            metrics=None,
            records=None,
            parts={},
            peak_flops=None,
            errors=[],
            warnings=[],
        )
    )
    assert suggest_run.suggest(analysis) == []
    assert suggest_run.report_suggestions(analysis) == []


# ----------------------------------------------------------------------------- metrics


def conforms(value: Any, hint: Any) -> bool:
    """Whether ``value`` is an instance of the type ``hint`` describes (unions, Literal, tuples,
    containers and their items, dataclasses; numpy scalars count as Python numbers)."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any or hint is object:
        return True
    if hint is None or hint is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if hint is float:
        return isinstance(value, (float, int, np.floating, np.integer)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(conforms(v, args[0]) for v in value)
        return len(args) == len(value) and all(conforms(v, a) for v, a in zip(value, args))
    if origin in (dict, collections.abc.Mapping):
        return (
            isinstance(value, collections.abc.Mapping)
            and all(conforms(k, args[0]) and conforms(v, args[1]) for k, v in value.items())
            if args
            else isinstance(value, dict)
        )
    if origin in (list, set, frozenset, collections.abc.Sequence):
        return (
            isinstance(value, origin) and all(conforms(v, args[0]) for v in value)
            if args
            else isinstance(value, origin)
        )
    if isinstance(hint, type):
        return isinstance(value, hint)
    return isinstance(value, origin) if isinstance(origin, type) else True


def measured(value: Any, where: str) -> list[str]:
    """The places in ``value`` that hold a measurement: a table or array with rows, a non-zero number."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [m for f in dataclasses.fields(value) for m in measured(getattr(value, f.name), f"{where}.{f.name}")]
    if isinstance(value, pd.DataFrame):
        # A per-rank summary keeps a row for a rank that recorded nothing; it must hold only zeros.
        cells = [v for c in value.columns if c != "rank" for v in value[c].tolist()]
        return [f"{where}: {len(value)} rows"] if any(measured(v, where) for v in cells) else []
    if isinstance(value, (pd.Series, pd.Index, np.ndarray)):
        return [f"{where}: {len(value)} rows"] if len(value) else []
    if isinstance(value, collections.abc.Mapping):
        return [m for k, v in value.items() for m in measured(v, f"{where}[{k!r}]")]
    if isinstance(value, (list, tuple, set, frozenset)):
        return [m for i, v in enumerate(value) for m in measured(v, f"{where}[{i}]")]
    if value is None or isinstance(value, (bool, str)):
        return []  # labels, sources, reasons and flags are not measurements
    if isinstance(value, numbers.Number):
        return [] if value == 0 or value != value else [f"{where}: {value!r}"]
    return [f"{where}: unexpected {type(value).__name__}"]


def not_finite(value: Any, where: str) -> list[str]:
    """Places holding NaN or inf (an echoed setting or coordinate must be a real number)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [m for f in dataclasses.fields(value) for m in not_finite(getattr(value, f.name), f"{where}.{f.name}")]
    if isinstance(value, pd.DataFrame):
        numeric = value.select_dtypes("number").to_numpy(np.float64)
        return (
            [f"{where}: NaN or inf in {sorted(value.columns[~np.isfinite(numeric).all(axis=0)])}"]
            if numeric.size and not np.isfinite(numeric).all()
            else []
        )
    if isinstance(value, (list, tuple)):
        return [m for i, v in enumerate(value) for m in not_finite(v, f"{where}[{i}]")]
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{where}: {value!r}"]
    return []


@pytest.mark.parametrize("m", METRICS, ids=[m.name for m in METRICS])
def test_metric_gives_its_typed_empty_result_on_empty_tables(m: Metric):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a division by zero on empty tables is a defect, not noise
        result = m.on_empty()
    hint = typing.get_type_hints(m.fn)["return"]
    assert conforms(result, hint), f"{m.name} returned {type(result).__name__}, not its annotated {hint}"
    if "<result>" in m.echoes:
        assert not not_finite(result, m.name)
        return
    echoed = [f"{m.name}.{e}" for e in m.echoes]
    found = [p for p in measured(result, m.name) if not any(p.startswith(e) for e in echoed)]
    assert not found, f"{m.name} measured something on empty tables: {found}"
    for e in m.echoes:
        assert not not_finite(getattr(result, e), f"{m.name}.{e}")


def _columns(value: Any, where: str) -> dict[str, list[str]]:
    """The columns of every table in a result, by place."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            k: v
            for f in dataclasses.fields(value)
            for k, v in _columns(getattr(value, f.name), f"{where}.{f.name}").items()
        }
    if isinstance(value, pd.DataFrame):
        return {where: [str(c) for c in value.columns]}
    if isinstance(value, tuple):
        return {k: v for i, x in enumerate(value) for k, v in _columns(x, f"{where}[{i}]").items()}
    return {}


PER_RANK = [
    m for m in METRICS if any(isinstance(EMPTY_INPUTS[k](), (collections.abc.Mapping, list)) for k in m.reads.values())
]


@pytest.mark.parametrize("m", PER_RANK, ids=[m.name for m in PER_RANK])
def test_no_rank_and_an_empty_rank_give_tables_of_the_same_columns(m: Metric):
    """A reduce over ranks returns the same table columns for no rank as for one that recorded nothing."""
    args = {p: EMPTY_INPUTS[k]() for p, k in m.reads.items()}
    none = {p: (type(v)() if isinstance(v, (dict, list)) else v) for p, v in args.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _columns(m.fn(**none, **m.params), m.name) == _columns(m.fn(**args, **m.params), m.name)


def _takes_a_table(fn: Any) -> bool:
    """A parameter is a table (not a function over one, as a decorator such as memo.per_table takes)."""
    return any(
        "DataFrame" in str(p.annotation) and not str(p.annotation).startswith("Callable")
        for p in inspect.signature(fn).parameters.values()
    )


def test_every_metric_over_tables_is_registered():
    registered = {m.fn for m in METRICS}
    missing = []
    for info in pkgutil.iter_modules(analyzer.metrics.__path__):
        module = importlib.import_module(f"analyzer.metrics.{info.name}")
        for name, fn in vars(module).items():
            if (
                inspect.isfunction(fn)
                and fn.__module__ == module.__name__
                and not name.startswith("_")
                and _takes_a_table(fn)
                and fn not in registered
            ):
                missing.append(f"{info.name}.{name}")
    assert not missing, (
        f"register these in analyzer/metrics/registry.py (METRICS, one metric(...) line each): {missing}"
    )


def test_the_invariant_catches_a_measurement_and_a_wrong_type():
    """The checks above can fail: a number on empty tables, a table with rows, NaN in an echo, a wrong type."""
    assert measured({"a": 0, "b": None, "c": "label", "d": pd.DataFrame({"x": []})}, "r") == []
    assert measured({"a": 1.5}, "r") == ["r['a']: 1.5"]
    assert measured(pd.DataFrame({"x": [1]}), "r") == ["r: 1 rows"]
    assert measured(pd.DataFrame({"rank": [3], "x": [0.0], "y": [None]}), "r") == []  # a rank that recorded nothing
    assert not_finite(pd.DataFrame({"f": [0.5, float("nan")]}), "r") == ["r: NaN or inf in ['f']"]
    assert conforms((None, 0), tuple[float | None, int]) and not conforms({}, pd.DataFrame)
    assert not conforms([1, "x"], list[int])
