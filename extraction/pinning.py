"""A budget for the constants a program pins on chip.

A pinned constant (a weight loaded once at setup) stays on chip the whole program, so buffers
cannot share its memory. When a program's pinned weights do not fit together, the largest that
fit a share of each memory stay pinned and the others are read where they are used: a
first-fit-decreasing knapsack over bytes. Constants are named by their e-class, found by
matching the program's term against the e-graph.
"""

from __future__ import annotations

from dataclasses import dataclass

from egraph_rules.ir import SCHEMA, Term, nbytes
from egraph_rules.saturate import SaturatedGraph
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
    view = GraphView(graph)
    found: dict[tuple[str, Term], bool] = {}

    def holds(cls: str, t: Term) -> bool:
        key = (cls, t)
        if key not in found:
            found[key] = any(_matches(view, nid, t, holds) for nid in graph.classes[cls])
        return found[key]

    if not holds(root, term):
        raise ValueError("the program is not a term of the root e-class")
    pins = {Pin(cls, space, nbytes(t)) for (cls, sub), ok in found.items() if ok and sub.op == "Const"
            for space, t in view.placed(cls)}
    return sorted(pins, key=lambda p: (p.eclass, p.space))


def _matches(view: GraphView, nid: str, t: Term, holds) -> bool:
    """Whether e-node nid is the head of t, with each F/E child class holding t's argument."""
    node = view.graph.nodes[nid]
    if node["op"] != t.op:
        return False
    for sort, child, arg in zip(SCHEMA[t.op][1], node["children"], t.args):
        if sort in ("F", "E"):
            if not holds(child, arg):
                return False
        elif view.const(child) != arg:
            return False
    return True


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
