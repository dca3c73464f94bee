"""The budget for constants pinned on chip: which constants a program pins, and which of them a
budget leaves out."""

from __future__ import annotations

import pytest

from extraction.pinning import Pin, PinnedData, over_budget, pinned_constants
from frontend.layers import build_model
from liftsat.api import SharedEGraph, extract
from liftsat.targets import get_target


def test_over_budget_keeps_the_largest_that_fit_per_memory():
    pins = [Pin("a", "m", 100), Pin("b", "m", 300), Pin("c", "m", 300), Pin("d", "m", 50), Pin("e", "v", 80)]
    # 300 (b, first of the tie by e-class) fits, c does not, a (100) and d (50) fill the rest
    assert over_budget(pins, {"m": 450, "v": 100}) == {"c"}
    assert over_budget(pins, {"m": 450, "v": 79}) == {"c", "e"}
    assert over_budget(pins, {"m": 1000, "v": 100}) == set()
    assert over_budget(pins, {}) == {"a", "b", "c", "d", "e"}  # a memory without budget pins nothing


def test_pinned_constants_are_the_programs_on_chip_constants():
    target = get_target("brainwave", 32)
    model = build_model(["Linear(64, 64)"], (1, 64), values=False)
    graph = SharedEGraph(model.term).saturate(target)
    best, _ = extract(graph, target)
    pins = pinned_constants(graph, graph.roots["root"], best.term)
    # W0 (64 x 64) pinned as four 32 x 32 tiles in the matrix register file, b0 as two vectors
    assert sorted((p.space, p.nbytes) for p in pins) == [("bw.mrf", 64 * 64 * 4), ("bw.vrf", 64 * 4)]
    # unpinning an e-class lets extraction pin the weight in another layout (another e-class);
    # unpinned in turn, it is streamed
    unpinned: set[str] = set()
    for _ in range(10):
        streamed, _ = extract(graph, target, unpinned=frozenset(unpinned))
        mrf = [p for p in pinned_constants(graph, graph.roots["root"], streamed.term) if p.space == "bw.mrf"]
        if not mrf:
            break
        unpinned |= {p.eclass for p in mrf}
    assert not mrf and len(unpinned) >= 2
    # the layouts found one at a time are the layouts of W0's data, which PinnedData finds at once
    first = [p for p in pins if p.space == "bw.mrf"]
    same = PinnedData(graph).same(first)
    assert same == frozenset(unpinned)
    at_once, _ = extract(graph, target, unpinned=same)
    assert at_once.term == streamed.term
    assert [(p.space, p.nbytes) for p in pinned_constants(graph, graph.roots["root"], streamed.term)] == [("bw.vrf", 256)]
    assert streamed.cycles > best.cycles
    # the ILP extractor leaves the same constants unpinned
    exact, _ = extract(graph, target, "ilp", 2.0, unpinned=frozenset(unpinned))
    assert [p.space for p in pinned_constants(graph, graph.roots["root"], exact.term)] == ["bw.vrf"]


def test_a_term_outside_the_root_class_is_refused():
    target = get_target("brainwave", 32)
    graph = SharedEGraph(build_model(["Linear(64, 64)"], (1, 64), values=False).term).saturate(target)
    other = SharedEGraph(build_model(["Linear(32, 32)"], (1, 32), values=False).term).saturate(target)
    best, _ = extract(other, target)
    with pytest.raises(ValueError, match="not a term of the root e-class"):
        pinned_constants(graph, graph.roots["root"], best.term)


def test_pinned_data_tells_slices_of_one_weight_apart():
    """A GRU step pins its biases as slices of two variables (one per gate) and a vector of -1s:
    each slice is other data than the others, and each layout of a slice is the same data as the
    slice."""
    target = get_target("vta")
    graph = SharedEGraph(build_model(["GRUCell(64, 32)"], (1, 64), values=False).term).saturate(target)
    best, _ = extract(graph, target)
    pins = [p for p in pinned_constants(graph, graph.roots["root"], best.term) if p.space == "vta.acc"]
    data = PinnedData(graph)
    assert len(pins) >= 4
    groups = [data.same([p]) for p in pins]
    for p, group in zip(pins, groups):
        assert p.eclass in group
        assert not group & {q.eclass for q in pins if q != p}
    assert any(len(group) > 1 for group in groups)  # some slice has another layout
    value = {cls: v for cls, v in data.placed[(pins[0].space, pins[0].nbytes)]}
    for group in groups:
        assert len({data.data(value[c]) for c in group}) == 1 and None not in {data.data(value[c]) for c in group}
