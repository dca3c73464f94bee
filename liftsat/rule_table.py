"""The rule catalogue users see with `liftsat rules`: every rule with its level, side condition,
meaning and the test that checks it."""

from __future__ import annotations

from egraph_rules.rules import LEVELS, Rule
from hwmodels.target import Target
from liftsat.rulesets import rules_for

PROPERTY_TEST = "tests/test_rules_property.py::test_rule_preserves_meaning"


def covering_test(rule: Rule) -> str:
    """The property test that evaluates both sides of this rule (sizes vary per tile size)."""
    family, _, size = rule.name.partition("/")
    return f"{PROPERTY_TEST}[{family}/*]" if size else f"{PROPERTY_TEST}[{rule.name}]"


def rule_rows(targets: list[Target]) -> list[dict]:
    """One row per rule, in level order: name, level, condition, meaning, test, egglog variants."""
    rules = sorted(rules_for(targets), key=lambda r: (LEVELS.index(r.level), r.name))
    return [
        {"name": r.name, "level": r.level, "condition": r.condition, "meaning": r.doc,
         "test": covering_test(r), "variants": len(r.egglog)}
        for r in rules
    ]
