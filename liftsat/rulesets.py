"""Which rules saturate for which targets: the DSL lowering, shared by every target, and what
each target's programs grow with afterwards (Lift's structural rules, tiles and bands sized to
its native size and memories, and its hardware rules)."""

from __future__ import annotations

from egraph_rules.algorithmic_rules import common_algorithmic_rules, staging_rules, tiling_rules
from egraph_rules.dsl_rules import band_rules, dsl_rules
from egraph_rules.hardware_rules import hardware_rules
from egraph_rules.rules import Rule
from hwmodels.target import Target


def shared_rules() -> list[Rule]:
    """The rules saturated once for every target: layers lowered to Lift patterns. The
    structural rules are target-independent too, but they subsume e-nodes (compose-assoc, the
    identities) that a target's rules must still match, so they run with each target's own:
    run first on their own, they took AlexNet conv2 on snowflake from 7.4 M to 56.4 M cycles."""
    return dsl_rules()


def memory_guards(target: Target) -> tuple[int, int]:
    """(resident, pinnable): how many result elements the target holds on chip at once, and how
    many weight elements its matrix unit reads where they are pinned (the guards of its band and
    weight-stationary rules). Weights pinned in a staging memory are moved on to the matrix unit
    at every use (the systolic mesh is preloaded from the scratchpad), so only the memory the
    matrix operand is read from counts; without a matrix op, the largest memory."""
    read = {o.op.operand_spaces[0] for o in target.ops if o.op.meaning.op in ("MVMul", "MMMul")}
    spaces = [m for s, m in target.memories.items() if s in read] or list(target.memories.values())
    return target.result_capacity // 4, max(m.capacity for m in spaces) // 4


def target_rules(target: Target, staged: bool = True) -> list[Rule]:
    """The rules a target's programs grow with after the shared phase: Lift's structural,
    movement and im2col rules, bands and tiles sized to its memories and native size, loads
    through its staging memories split in two (unless not `staged`), and its hardware rules."""
    resident, pinnable = memory_guards(target)
    stages = target.staging if staged else {}
    return (common_algorithmic_rules() + band_rules(resident, pinnable)
            + tiling_rules((target.native_dim,), resident, pinnable) + staging_rules(stages, target.native_dim)
            + hardware_rules(target.device_ops(), target.native_dim))


def rules_for(targets: list[Target]) -> list[Rule]:
    """The shared rules and each target's own (for the rule catalogue)."""
    merged: dict[str, Rule] = {r.name: r for r in shared_rules()}
    for t in targets:
        for r in target_rules(t):
            merged[r.name] = merged[r.name].union(r) if r.name in merged else r
    return list(merged.values())
