"""Golden reports: the whole JSON report of a few fixed inputs,
checked in under ``tests/golden/`` and compared whole.

The document is the one ``analyzer report --json`` writes (``analyze`` ->
``report_json`` -> ``dumps_json``), read back; only the fields named in
:data:`VOLATILE` are masked (replaced by ``"<volatile>"``, so the key tree
stays whole), and in the fields named in :data:`INPUT_PATH_IN` the input's
path is replaced by ``<input>``; every other value must match exactly,
floats included, and so must the key order of the text.

When a change to the report is intended, regenerate the goldens with the
one flag (tests/conftest.py; docs/architecture.md, "Golden files")::

    .venv/bin/python -m pytest -q tests/test_golden_reports.py tests/test_public_surface.py --update-goldens

then read the diff of ``tests/golden/`` and commit it with the change. The
shared-sample cases skip (with the reason) where ``../shared/traces`` is
absent, and the flag then leaves their goldens as they were.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from analyzer.api import analyze
from analyzer.jsontext import dumps_json
from analyzer.verbs.report import report_json
from tests.conftest import GOLDEN, REPO, SHARED_TRACES

# name -> (base folder, input under it). The two example runs of the repository, and two
# small real traces from ../shared: a single-GPU CUDA step (alexnet, HTA's critical-path
# sample) and a ROCm one (MI250), so a CUDA and a HIP kernel-naming path are both pinned.
CASES: dict[str, tuple[Path, str]] = {
    "example-ddp-w2": (REPO / "traces", "example-ddp-w2"),
    "example-ddp-w2-slow-rank1": (REPO / "traces", "example-ddp-w2-slow-rank1"),
    "hta-critical-path-alexnet": (SHARED_TRACES, "critical_path/alexnet"),
    "hta-amd-trace-mi250": (SHARED_TRACES, "amd_trace"),
    "example-ddp-w2-critical-path": (REPO / "traces", "example-ddp-w2"),
}
# The cases analyzed with the critical paths (``analyze(..., critical_path=True)``, ``report --critical-path``);
# the others are the default report, which has none (``critical_path: null``).
WITH_CRITICAL_PATH = {"example-ddp-w2-critical-path"}

# What legitimately differs between two reports of the same input by the same code, by
# name: where the input lies (the checkout's location), the analyzer's version and the
# time the report was written. Nothing else is masked; a new volatile field (a cache
# hit, a host name) must be added here by name, deliberately. Each must be present.
VOLATILE: tuple[tuple[str, ...], ...] = (
    ("path",),
    ("generator", "version"),
    ("generator", "created_at"),
)
MASK = "<volatile>"
# Text fields that embed the input's location (``[]``: every item of a list): there only the
# input's path is replaced, by INPUT, and the rest of the text is compared.
INPUT_PATH_IN: tuple[tuple[str, ...], ...] = (
    ("suggestions", "[]", "change", "command"),  # reftrain --config <run>/config.yaml ...
)
INPUT = "<input>"


def report_document(path: Path, critical_path: bool = False) -> dict[str, Any]:
    """The JSON report of ``path`` as the CLI writes it, parsed back (no parse cache)."""
    return json.loads(dumps_json(report_json(analyze(path, cache=False, critical_path=critical_path))))


def masked(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with every :data:`VOLATILE` field replaced by :data:`MASK`, and the input's path
    (the report's ``path``) replaced by :data:`INPUT` in the fields of :data:`INPUT_PATH_IN`."""
    where = doc.get("path")
    for keys in VOLATILE:
        node: Any = doc
        for k in keys[:-1]:
            node = node.get(k) if isinstance(node, dict) else None
        assert isinstance(node, dict) and keys[-1] in node, (
            f"volatile field {'.'.join(keys)} is missing from the report"
        )
        node[keys[-1]] = MASK
    for keys in INPUT_PATH_IN:
        for parent in _nodes(doc, keys[:-1]):
            if isinstance(parent, dict) and isinstance(parent.get(keys[-1]), str) and isinstance(where, str):
                parent[keys[-1]] = parent[keys[-1]].replace(where, INPUT)
    return doc


def _nodes(node: Any, keys: tuple[str, ...]) -> list[Any]:
    """The values at ``keys`` under ``node`` (``[]`` stands for every item of a list)."""
    if not keys:
        return [node]
    head, rest = keys[0], keys[1:]
    if head == "[]":
        return [n for item in node for n in _nodes(item, rest)] if isinstance(node, list) else []
    return _nodes(node[head], rest) if isinstance(node, dict) and head in node else []


def differences(expected: Any, actual: Any, where: str = "$") -> list[str]:
    """Key paths at which two JSON values differ (exact: 1 and 1.0 differ, so do their types)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = [f"{where}.{k}: missing" for k in expected if k not in actual]
        out += [f"{where}.{k}: unexpected (new key)" for k in actual if k not in expected]
        for k in expected:
            if k in actual:
                out += differences(expected[k], actual[k], f"{where}.{k}")
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        out = [] if len(expected) == len(actual) else [f"{where}: {len(expected)} items expected, {len(actual)} found"]
        for i, (e, a) in enumerate(zip(expected, actual)):
            out += differences(e, a, f"{where}[{i}]")
        return out
    if type(expected) is not type(actual) or expected != actual:
        return [f"{where}: expected {expected!r}, found {actual!r}"]
    return []


def golden_path(name: str) -> Path:
    return GOLDEN / f"report-{name}.json"


@pytest.mark.parametrize("name", list(CASES))
def test_report_matches_golden(name: str, update_goldens: bool) -> None:
    base, sub = CASES[name]
    if not base.is_dir():
        pytest.skip(f"{base} is absent (the shared sample traces are only on the project's CI and dev machines)")
    path = base / sub
    doc = masked(report_document(path, critical_path=name in WITH_CRITICAL_PATH))
    text = dumps_json(doc)
    golden = golden_path(name)
    if update_goldens:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
        return
    assert golden.is_file(), f"{golden} is missing: run pytest {Path(__file__).name} --update-goldens"
    expected_text = golden.read_text()
    diffs = differences(json.loads(expected_text), doc)
    assert not diffs, (
        f"the report of {sub} differs from {golden.name} at {len(diffs)} place(s); if intended, rerun with "
        "--update-goldens and commit the diff:\n  " + "\n  ".join(diffs[:25])
    )
    # Same values: the text differs only if the key order changed, which is part of the format.
    assert text == expected_text, f"the report of {sub} has its keys in another order than {golden.name}"


def test_volatile_fields_are_all_that_varies(tmp_path: Path) -> None:
    """One input analyzed in its place and, copied to another folder, three times: without the parse
    cache, writing it and reading it back: the reports are identical once masked, so the masking
    lists are complete and the goldens hold wherever the checkout is and whatever the cache's state."""
    source = REPO / "traces" / "example-ddp-w2-slow-rank1"  # its suggestion's command names the run's config
    path = tmp_path / "run"
    shutil.copytree(source, path, ignore=shutil.ignore_patterns(".analyzer-cache"))
    fresh = masked(report_document(path))
    for _ in ("write the cache", "read it"):
        cached = masked(json.loads(dumps_json(report_json(analyze(path, cache=True)))))
        assert differences(fresh, cached) == []
    assert list((path / "traces").rglob("*.npz")), "the parse cache was not used"
    assert differences(masked(report_document(source)), fresh) == []
    assert any(INPUT in s["change"]["command"] for s in fresh["suggestions"] if s["change"]["command"])


def test_differences_is_exact() -> None:
    """The comparison is whole and exact: a changed float, an int turned float, a new or lost key, a list
    of another length are each reported with their path."""
    base = {"a": 1, "b": [1.5, {"c": None}], "d": "x"}
    assert differences(base, json.loads(json.dumps(base))) == []
    assert differences(base, {**base, "a": 1.0}) == ["$.a: expected 1, found 1.0"]
    assert differences(base, {**base, "b": [1.5000001, {"c": None}]}) == ["$.b[0]: expected 1.5, found 1.5000001"]
    assert differences(base, {**base, "e": 0}) == ["$.e: unexpected (new key)"]
    assert differences(base, {"a": 1, "b": [1.5], "d": "x"}) == ["$.b: 2 items expected, 1 found"]
    with pytest.raises(AssertionError, match="generator.version"):
        masked({"path": "p", "generator": {"created_at": "t"}})
    doc = {
        "path": "/x/run",
        "generator": {"version": "1", "created_at": "t"},
        "suggestions": [{"change": {"command": "reftrain --config /x/run/config.yaml"}}, {"change": {"command": None}}],
    }
    assert masked(doc)["suggestions"][0]["change"]["command"] == "reftrain --config <input>/config.yaml"
