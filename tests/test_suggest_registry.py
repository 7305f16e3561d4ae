"""The suggestion rules are registered once (analyzer/verbs/suggest/engine.py, ``@rule``): the id comes from the
function's name, the part and FLOP need from the registration, and every rule module sits under the import
contract that keeps the engine from importing a rule (pyproject.toml)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from analyzer.metrics.breakdown import DEVICE_PARTS, HOST_PARTS
from analyzer.verbs.suggest import run as suggest_run  # noqa: F401 - imports every rule module, which registers its rules
from analyzer.verbs.suggest.engine import RULES, Change, Suggestion, needs_flops, part_of, parts_of, rule
from tests.test_suggest_rules import facts

REPO = Path(__file__).resolve().parent.parent
SUGGEST = REPO / "analyzer" / "verbs" / "suggest"
CONTRACT = "suggestion rules register themselves: the engine imports no rule"


def _contract() -> dict:
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    found = [c for c in contracts if c["name"].startswith(CONTRACT)]
    assert len(found) == 1, f"no single contract named {CONTRACT!r}"
    return found[0]


def test_every_rule_module_is_under_the_engine_contract():
    contract = _contract()
    assert contract["source_modules"] == ["analyzer.verbs.suggest.engine"]
    modules = {f"analyzer.verbs.suggest.{p.stem}" for p in SUGGEST.glob("rules_*.py")}
    assert len(modules) >= 7, modules
    missing = sorted(modules - set(contract["forbidden_modules"]))
    assert not missing, f"rule modules the engine contract does not name: {missing}"


def test_every_rule_module_registers_a_rule():
    # A rule module with no registered rule would be dead code the contract still names.
    modules = {r.fn.__module__.rsplit(".", 1)[-1] for r in RULES}
    assert modules == {p.stem for p in SUGGEST.glob("rules_*.py")}


def test_rule_ids_come_from_function_names_and_are_unique():
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids)) == 29
    assert all(r.fn.__name__ == f"rule_{r.id}" and r.__name__ == r.fn.__name__ for r in RULES)


def test_registered_parts_are_breakdown_parts():
    parts = {p.removesuffix("_ms") for p in DEVICE_PARTS + HOST_PARTS}
    for r in RULES:
        assert set(r.parts) <= parts, (r.id, r.parts)
    assert part_of("ddp_bucket_size") == "exposed_comm" and parts_of("launch_bound") == ("idle", "exposed_comm")
    assert part_of("mfu_gap") is None and parts_of("mfu_gap") == () and part_of("no_such_rule") is None
    assert {r.id for r in RULES if r.needs_flops} == {
        "mfu_gap",
        "torch_compile",
        "bf16_autocast",
        "tf32",
        "activation_checkpointing",
    }
    assert needs_flops("tf32") and not needs_flops("data_wait") and not needs_flops("no_such_rule")


def test_a_fired_rule_names_itself():
    from tests.test_suggest_rules import config

    s = RULES[[r.id for r in RULES].index("data_wait")](
        facts(config(data__num_workers=0), phases={"data_wait": 100.0}, step_time_ms=200.0)
    )
    assert s is not None and s.rule == "data_wait"


def test_registering_twice_or_a_misnamed_function_is_an_error():
    def rule_data_wait(f):  # the id of a registered rule
        return None

    def data_wait_2(f):
        return Suggestion("t", "x", {}, Change({}, "a"), None, "low")

    n = len(RULES)
    with pytest.raises(ValueError, match="registered twice"):
        rule(part="data")(rule_data_wait)
    with pytest.raises(ValueError, match="starts with 'rule_'"):
        rule()(data_wait_2)
    assert len(RULES) == n
