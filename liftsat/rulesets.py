"""Which rules saturate for which targets: the rules every target shares, and each target's own
(tiles and bands sized to its native size and memories, and its hardware rules)."""

from __future__ import annotations

from egraph_rules.algorithmic_rules import common_algorithmic_rules, tiling_rules
from egraph_rules.dsl_rules import band_rules, dsl_rules
from egraph_rules.hardware_rules import hardware_rules
from egraph_rules.rules import Rule
from hwmodels.target import Target


def common_rules() -> list[Rule]:
    """The rules every target shares: layers to Lift patterns, structure, movement, im2col."""
    return dsl_rules() + common_algorithmic_rules()


def memory_guards(target: Target) -> tuple[int, int]:
    """(resident, pinnable): how many result elements, and how many weight elements, the target
    holds on chip at once (the guards of its band and weight-stationary rules)."""
    return target.result_capacity // 4, max(m.capacity for m in target.memories.values()) // 4


def target_rules(target: Target) -> list[Rule]:
    """A target's own rules: bands and tiles sized to its memories and native size, and its
    hardware rules."""
    resident, pinnable = memory_guards(target)
    return (band_rules(resident, pinnable) + tiling_rules((target.native_dim,), resident, pinnable)
            + hardware_rules(target.device_ops(), target.native_dim))


def rules_for(targets: list[Target]) -> list[Rule]:
    """The common rules and each target's own (for the rule catalogue)."""
    merged: dict[str, Rule] = {r.name: r for r in common_rules()}
    for t in targets:
        for r in target_rules(t):
            merged[r.name] = merged[r.name].union(r) if r.name in merged else r
    return list(merged.values())
