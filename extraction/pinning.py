"""A budget for the constants a program pins on chip.

A pinned constant (a weight loaded once at setup) stays on chip the whole program, so buffers
cannot share its memory. When a program's pinned weights do not fit together, the largest that
fit a share of each memory stay pinned and the others are read where they are used: a
first-fit-decreasing knapsack over bytes. Constants are named by their e-class, looked up in
the e-graph from the program's term.
"""

from __future__ import annotations

from dataclasses import dataclass

from egraph_rules.ir import Term, nbytes
from egraph_rules.saturate import EGraphError, SaturatedGraph
from extraction.greedy import GraphView


@dataclass(frozen=True)
class Pin:
    """A constant a program pins on chip: its e-class, the memory and its bytes there."""

    eclass: str
    space: str
    nbytes: int


def pinned_constants(graph: SaturatedGraph, root: str, term: Term) -> list[Pin]:
    """The constants `term` (a program of the root e-class) pins on chip, each once, in e-class
    order."""
    try:
        held = graph.class_of(term) == root
    except EGraphError:
        held = False
    if not held:
        raise ValueError("the program is not a term of the root e-class")
    view = GraphView(graph)
    consts = {graph.class_of(t) for t in term.walk() if t.op == "Const"}
    return sorted({Pin(cls, space, nbytes(t)) for cls in consts for space, t in view.placed(cls)},
                  key=lambda p: (p.eclass, p.space))


def over_budget(pins: list[Pin], budget: dict[str, float]) -> frozenset[str]:
    """The e-classes of the constants not to pin so that those pinned fit `budget` bytes per
    memory: the largest first, each kept when it still fits (ties by e-class, deterministic)."""
    left = dict(budget)
    dropped = set()
    for p in sorted(pins, key=lambda p: (-p.nbytes, p.eclass, p.space)):
        if p.nbytes <= left.get(p.space, 0) and p.eclass not in dropped:
            left[p.space] -= p.nbytes
        else:
            dropped.add(p.eclass)
    return frozenset(dropped)
