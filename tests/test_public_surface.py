"""The public surface, frozen in one checked-in snapshot, so that a change to it
is deliberate: ``tests/golden/public_surface.json`` holds

* ``api``: ``analyzer.__all__``, and for each of its names and each public name
  defined in ``analyzer.api`` the signature (parameter names, kinds and
  defaults; no annotations) of a function, or the fields and public methods
  of a class;
* ``cli``: every flag of the three commands, from their argparse parsers
  (``analyzer`` and each of its subcommands, ``reftrain``, ``dashboard``):
  what it takes (a flag, a value, its choices, how many);
* ``report_keys``: the key tree of the JSON report, from the goldens of the
  two example runs (tests/test_golden_reports.py), lists as ``[]`` with
  their items' keys merged; a rule's own ``evidence`` and ``overrides`` keys
  are cut at ``<per rule>``.

A change to any of these fails here with the place named. When intended,
regenerate with the same flag as the goldens and commit the diff::

    .venv/bin/python -m pytest -q tests/test_public_surface.py --update-goldens
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
from typing import Any

import analyzer
import analyzer.api
from analyzer.ingest.formats import REPORT_TOP_LEVEL
from tests.conftest import GOLDEN
from tests.test_golden_reports import differences, golden_path

SNAPSHOT = GOLDEN / "public_surface.json"
# The goldens whose key tree is frozen: inputs of the repository, so the snapshot does not
# depend on whether ../shared is present.
KEY_TREE_FROM = ("example-ddp-w2", "example-ddp-w2-slow-rank1", "example-ddp-w2-critical-path")
# Dicts keyed by what a rule measures or changes, not by the format: their keys are not frozen.
PER_RULE = (("suggestions", "[]", "evidence"), ("suggestions", "[]", "change", "overrides"))


# ----------------------------------------------------------------------------- API


def signature(fn: Any) -> str:
    """``name(a, *, b=1, **kw)``: parameter names, kinds and defaults, without annotations."""
    params = []
    for p in inspect.signature(fn).parameters.values():
        params.append(p.replace(annotation=inspect.Parameter.empty))
    text = str(inspect.Signature(params))
    return f"{fn.__name__}{text}"


def describe(obj: Any) -> Any:
    if inspect.isclass(obj):
        out: dict[str, Any] = {}
        if dataclasses.is_dataclass(obj):
            out["fields"] = [f.name for f in dataclasses.fields(obj)]
        members = {}
        for name, member in sorted(vars(obj).items()):
            if name.startswith("_") or (dataclasses.is_dataclass(obj) and name in out["fields"]):
                continue
            if isinstance(member, property):
                members[name] = "property"
            elif isinstance(member, (staticmethod, classmethod)):
                members[name] = signature(member.__func__)
            elif inspect.isfunction(member):
                members[name] = signature(member)
        out["methods"] = members
        if issubclass(obj, BaseException):
            out["exception"] = [c.__name__ for c in obj.__mro__[1:] if c is not object]
        return out
    if callable(obj):
        return signature(obj)
    return type(obj).__name__


def api_surface() -> dict[str, Any]:
    names = {name: describe(getattr(analyzer, name)) for name in sorted(analyzer.__all__)}
    api = {
        name: describe(obj)
        for name, obj in sorted(vars(analyzer.api).items())
        if not name.startswith("_") and getattr(obj, "__module__", None) == "analyzer.api"
    }
    return {"analyzer.__all__": sorted(analyzer.__all__), "analyzer": names, "analyzer.api": api}


# ----------------------------------------------------------------------------- CLI


def flags(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Each option and positional of ``parser`` and, recursively, of its subcommands."""
    out: dict[str, Any] = {}
    commands: dict[str, Any] = {}
    for action in parser._actions:  # argparse keeps no public list of a parser's actions
        if isinstance(action, argparse._SubParsersAction):
            commands = {name: flags(sub) for name, sub in sorted(action.choices.items())}
            continue
        if isinstance(action, argparse._HelpAction):
            continue
        takes = "flag" if action.nargs == 0 else "value"
        if action.nargs not in (None, 0):
            takes += f" nargs={action.nargs}"
        if isinstance(action, argparse._AppendAction):
            takes += " repeatable"
        if action.choices is not None:
            takes += " choices=" + "|".join(str(c) for c in action.choices)
        if action.required and action.option_strings:
            takes += " required"
        out[", ".join(action.option_strings) or f"<{action.dest}>"] = takes
    return {"options": out, **({"commands": commands} if commands else {})}


def cli_surface() -> dict[str, Any]:
    from analyzer.cli import build_parser as analyzer_parser
    from dashboard.cli import build_parser as dashboard_parser
    from reftrain.cli import build_parser as reftrain_parser

    return {
        "analyzer": flags(analyzer_parser()),
        "reftrain": flags(reftrain_parser()),
        "dashboard": flags(dashboard_parser()),
    }


# ----------------------------------------------------------------------------- report keys


def key_tree(value: Any, where: tuple[str, ...] = ()) -> Any:
    """The keys of a JSON value: dicts by key, lists as ``{"[]": <their items' merged tree>}``, leaves None."""
    if where in PER_RULE:
        return "<per rule>"
    if isinstance(value, dict):
        return {k: key_tree(v, where + (k,)) for k, v in value.items()}
    if isinstance(value, list):
        merged: Any = None
        for item in value:
            merged = merge(merged, key_tree(item, where + ("[]",)))
        return {"[]": merged}
    return None


def merge(a: Any, b: Any) -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        return {**a, **{k: merge(a.get(k), v) for k, v in b.items()}}
    return a if b is None else b


def report_surface() -> Any:
    tree = None
    for name in KEY_TREE_FROM:
        tree = merge(tree, key_tree(json.loads(golden_path(name).read_text())))
    return tree


# ----------------------------------------------------------------------------- the test


def surface() -> dict[str, Any]:
    return {"api": api_surface(), "cli": cli_surface(), "report_keys": report_surface()}


def test_public_surface_matches_the_snapshot(update_goldens: bool) -> None:
    current = json.loads(json.dumps(surface()))
    if update_goldens:
        SNAPSHOT.write_text(json.dumps(current, indent=1) + "\n")
        return
    assert SNAPSHOT.is_file(), f"{SNAPSHOT} is missing: run pytest {__name__.rsplit('.', 1)[-1]}.py --update-goldens"
    diffs = differences(json.loads(SNAPSHOT.read_text()), current)
    assert not diffs, (
        f"the public surface changed at {len(diffs)} place(s) (API, CLI flags or report keys); if deliberate, "
        "rerun with --update-goldens and commit tests/golden/public_surface.json:\n  " + "\n  ".join(diffs[:25])
    )


def test_report_top_level_is_the_typed_definition() -> None:
    """analyzer.ingest.formats.REPORT_TOP_LEVEL, the report's typed top level, is what the report writes, in order."""
    assert tuple(json.loads(golden_path(KEY_TREE_FROM[0]).read_text())) == REPORT_TOP_LEVEL


def test_the_snapshot_sees_a_new_flag_and_a_new_key() -> None:
    parser = argparse.ArgumentParser(prog="x")
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("report")
    p.add_argument("--top", type=int)
    p.add_argument("--engine", choices=("local", "ray"))
    p.add_argument("path")
    before = flags(parser)
    assert before == {
        "options": {},
        "commands": {
            "report": {"options": {"--top": "value", "--engine": "value choices=local|ray", "<path>": "value"}}
        },
    }
    p.add_argument("--new", action="store_true")
    assert differences(before, flags(parser)) == ["$.commands.report.options.--new: unexpected (new key)"]
    assert key_tree({"a": [{"b": 1}, {"c": {"d": 2}}], "e": []}) == {
        "a": {"[]": {"b": None, "c": {"d": None}}},
        "e": {"[]": None},
    }
