"""A budget for the constants a program pins on chip.

A pinned constant (a weight loaded once at setup) stays on chip the whole program, so buffers
cannot share its memory. When a program's pinned weights do not fit together, the largest that
fit a share of each memory stay pinned and the others are read where they are used: a
first-fit-decreasing knapsack over bytes. Constants are named by their e-class, looked up in
the e-graph from the program's term; a constant left out is left out in every layout of its
data (`PinnedData`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from egraph_rules.interpreter import relayout
from egraph_rules.ir import IRTypeError, Term, nbytes, numel, shape_of
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


class PinnedData:
    """Which constants of a saturated e-graph pin the same data in the same memory. A weight
    has an e-class per layout (a bias as 2560 elements, or as 160 vectors of 16): a program
    kept from pinning it in one pins it in the next, and found one at a time, the layouts of a
    GRU(2560) step's six biases took VTA ten extractions."""

    def __init__(self, graph: SaturatedGraph):
        self.graph, self.view = graph, GraphView(graph)
        self._data: dict[str, tuple[str, bytes] | None] = {}

    @cached_property
    def placed(self) -> dict[tuple[str, int], list[tuple[str, str]]]:
        """The constants pinned in each memory with each size: their e-classes and the e-classes
        of their values."""
        out: dict[tuple[str, int], list[tuple[str, str]]] = {}
        index = self.graph.functions
        for op, cls, kids in zip(index.ops, index.classes, index.kids):
            if op == "Const":
                for space, t in self.view.placed(cls):
                    out.setdefault((space, nbytes(t)), []).append((cls, kids[0]))
        return out

    def data(self, value: str) -> tuple[str, bytes] | None:
        """The variable (or fill value) an E e-class re-lays out and a digest of which of its
        elements it holds, in any order (None: the value is computed, not only laid out)."""
        if value not in self._data:
            self._data[value] = _elements(self.view.smallest(value))
        return self._data[value]

    def same(self, pins: Iterable[Pin]) -> frozenset[str]:
        """The e-classes of the constants holding the same data as one of `pins` in its memory
        (the pins' own included)."""
        out = set()
        for p in pins:
            group = self.placed.get((p.space, p.nbytes), [])
            mine = {self.data(v) for c, v in group if c == p.eclass} - {None}
            out.add(p.eclass)
            out.update(c for c, v in group if mine and self.data(v) in mine)
        return frozenset(out)


def _elements(e: Term | None) -> tuple[str, bytes] | None:
    """What an E term re-lays out (a variable, or a fill value) and a digest of its elements'
    indices (of the fill value), sorted; None when it is not a re-layout of one of these."""
    layouts = []
    while e is not None and e.op == "App":
        layouts.append(e.args[0])
        e = e.args[1]
    if e is None or e.op not in ("Var", "Fill"):
        return None
    try:
        shape = shape_of(e.args[1])
    except IRTypeError:
        return None  # a pair: pinned as its parts
    if e.op == "Var":
        source, x = e.args[0], np.arange(1.0, numel(e.args[1]) + 1).reshape(shape)
    else:
        source, x = f"fill {e.args[0]}", np.full(shape, float(e.args[0]))
    for f in reversed(layouts):
        x = relayout(f, x)
        if x is None:
            return None
    return source, hashlib.blake2b(np.sort(x, axis=None).tobytes(), digest_size=16).digest()
