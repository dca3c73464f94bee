"""Which rules saturate for which targets: the DSL lowering, shared by every target, and what
each target's programs grow with afterwards (Lift's structural rules, tiles and bands sized to
its native size and memories, and its hardware rules)."""

from __future__ import annotations

from typing import NamedTuple

from egraph_rules.algorithmic_rules import common_algorithmic_rules, staging_rules, tiling_rules
from egraph_rules.dsl_rules import band_rules, cell_rules, dsl_rules
from egraph_rules.hardware_rules import hardware_rules
from egraph_rules.rules import Rule
from hwmodels.target import Target


def shared_rules() -> list[Rule]:
    """The rules saturated once for every target: layers lowered to Lift patterns (but GRU and
    LSTM cells, whose lowering depends on the target's memory: `target_dsl_rules`). The
    structural rules are target-independent too, but they subsume e-nodes (compose-assoc, the
    identities) that a target's rules must still match, so they run with each target's own:
    run first on their own, they took AlexNet conv2 on snowflake from 7.4 M to 56.4 M cycles."""
    return dsl_rules()


class MemoryGuards(NamedTuple):
    """What the guards of a target's band, weight-stationary and streamed-reduction rules compare
    with, in elements: `resident`, the results its result memory holds at once; `pinnable`, the
    weights its matrix unit reads where they are pinned; `banded`, a band's rows and results;
    `apart`, where the matrix unit reads a band's rows from another memory than its results go
    to, what a wider band's rows and results may take of each (None: one memory holds both)."""

    resident: int
    pinnable: int
    banded: int
    apart: tuple[int, int] | None


def memory_guards(target: Target) -> MemoryGuards:
    """The target's guard sizes. Weights pinned in a staging memory are moved on to the matrix
    unit at every use (the systolic mesh is preloaded from the scratchpad), so only the memory
    the matrix operand is read from counts (without a matrix op, the largest memory). A band's
    rows share the result memory with its results, unless the matrix unit reads its rows from
    another one (VTA's input buffer, the systolic array's scratchpad): then the result memory
    holds only results and partial products, and counts twice for a band; a wider band's rows
    may then fill three quarters of their memory, its results a quarter of theirs (the products
    and sums beside them need the rest)."""
    mats = [o.op for o in target.ops if o.op.is_matrix]
    read = {op.operand_spaces[0] for op in mats}
    spaces = [m for s, m in target.memories.items() if s in read] or list(target.memories.values())
    resident = target.result_capacity // 4
    rows_apart = bool(mats) and all(op.operand_spaces[1] != op.result_space for op in mats)
    apart = None
    if rows_apart:
        rows = min(target.memories[op.operand_spaces[1]].capacity for op in mats)
        apart = (rows // 4 * 3 // 4, resident // 4)
    return MemoryGuards(resident, max(m.capacity for m in spaces) // 4, resident * (2 if rows_apart else 1), apart)


def target_dsl_rules(target: Target, blocked_cells: bool = False) -> list[Rule]:
    """The DSL rules sized to the target's memories: a batch of rows in bands, GRU and LSTM
    cells lowered over whole gate vectors or, where they fill the result memory (or wherever a
    block size divides the hidden size, when `blocked_cells`), in blocks of hidden units."""
    g = memory_guards(target)
    return band_rules(g.banded, g.apart) + cell_rules(g.resident, target.native_dim, blocked_cells)


def target_tiling_rules(target: Target) -> list[Rule]:
    """The tiling rules at the target's native size with its guards."""
    g = memory_guards(target)
    return tiling_rules((target.native_dim,), g.resident, g.pinnable, g.banded)


def target_rules(target: Target, staged: bool = True, blocked_cells: bool = False) -> list[Rule]:
    """The rules a target's programs grow with after the shared phase: Lift's structural,
    movement and im2col rules, bands and tiles sized to its memories and native size (cells in
    blocks of hidden units wherever they can be, when `blocked_cells`), loads through its staging
    memories split in two (unless not `staged`), and its hardware rules."""
    stages = target.staging if staged else {}
    return (common_algorithmic_rules() + target_dsl_rules(target, blocked_cells)
            + target_tiling_rules(target) + staging_rules(stages, target.native_dim)
            + hardware_rules(target.device_ops(), target.native_dim))


def rules_for(targets: list[Target]) -> list[Rule]:
    """The shared rules and each target's own (for the rule catalogue)."""
    merged: dict[str, Rule] = {r.name: r for r in shared_rules()}
    for t in targets:
        for r in target_rules(t):
            merged[r.name] = merged[r.name].union(r) if r.name in merged else r
    return list(merged.values())
