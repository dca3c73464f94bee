"""Every rewrite rule preserves meaning: each e-node it adds to the rewritten e-class evaluates,
with the reference interpreter, to the same value as the rule's example term.

For each rule (at native dimension 4, so shapes stay tiny) and each of its examples: saturate an
e-graph holding only the example with only that rule (analyses are always included), find the
e-class of the example term, check the rule added something to it, then rebuild every e-node of
that class as a concrete term (children: the smallest term of their class) and compare its value
with the example's value on the same random inputs.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egraph_rules.interpreter import Interpreter, random_value
from egraph_rules.ir import SCHEMA, T, Term, comp, fin, fout, ta, tp, ts, ty
from egraph_rules.rules import Rule
from egraph_rules.saturate import Budget, SaturatedGraph, Saturator
from extraction.greedy import GraphView, extract_greedy
from egraph_rules.algorithmic_rules import algorithmic_rules, fold_map_interchange, staging_rules
from egraph_rules.dsl_rules import band_rules, cell_rules, dsl_rules
from egraph_rules.hardware_rules import hardware_rules
from liftsat.targets import get_target

NATIVE = 4
TARGET = get_target("brainwave", NATIVE)
#: the rules liftsat.api.rules_for gives, with capacity guards small enough for tiny examples
#: (pinnable=1 lets every weight-stationary example fire; fold-map-interchange, guarded the other
#: way, by weights that do fit, gets room for its examples' weights)
RULES = dsl_rules() + band_rules(resident=64, apart=(24, 12)) + cell_rules(256, NATIVE) + [
    r for r in algorithmic_rules((NATIVE,), resident=64, pinnable=1) if r.name != "fold-map-interchange"] + [
    fold_map_interchange(pinnable=1 << 20)] + hardware_rules(TARGET.device_ops(), NATIVE) + staging_rules(
    {"mesh": "stage"}, NATIVE)
RULES_BY_NAME = {r.name: r for r in RULES}
MEANINGS = {op.name: op.meaning for op in TARGET.device_ops()}
BUDGET = Budget(nodes=5000, iterations=3, seconds=10)
PROPERTY = settings(max_examples=int(os.environ.get("LIFTSAT_RULE_EXAMPLES", 8)), deadline=None)
F32 = ts("f32")


class SizeCost:
    """Cost model for extraction: the number of F/E nodes of a term."""

    def node(self, op, args, child_costs):
        return 1 + sum(child_costs)

    def scalar(self, cost):
        return cost


# ---------------------------------------------------------------- helpers


def same_value(a, b) -> bool:
    """Recursive closeness over pairs (tuples), arrays of pairs (lists) and numpy arrays."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        return (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b)
                and all(same_value(x, y) for x, y in zip(a, b)))
    if isinstance(a, list) or isinstance(b, list):
        return (isinstance(a, list) and isinstance(b, list) and len(a) == len(b)
                and all(same_value(x, y) for x, y in zip(a, b)))
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and np.allclose(a, b, rtol=1e-4, atol=1e-4)


def variables(term: Term) -> dict[str, Term]:
    return {t.args[0]: t.args[1] for t in term.walk() if t.op == "Var"}


def node_terms(graph: SaturatedGraph, cls: str) -> list[Term]:
    """Every IR e-node of a class as a concrete term, children replaced by their smallest term."""
    view = GraphView(graph)
    smallest: dict[str, Term] = {}

    def child(c: str, sort: str):
        if sort not in ("F", "E"):
            return view.const(c)
        if c not in smallest:
            smallest[c] = extract_greedy(graph, c, SizeCost()).term
        return smallest[c]

    out = []
    for nid in graph.classes[cls]:
        node = graph.nodes[nid]
        if node["op"] not in SCHEMA:
            continue
        sorts = SCHEMA[node["op"]][1]
        out.append(Term(node["op"], tuple(child(c, s) for c, s in zip(node["children"], sorts))))
    return out


def saturate_one(rule: Rule, example: Term) -> tuple[SaturatedGraph, str, Term]:
    """Saturate the example under only this rule; return the graph, the class of the example
    term and the value term (the example, applied to an input when it is a function)."""
    value_term = T("App", example, T("Var", "in", fin(example))) if example.sort == "F" else example
    roots = {"root": value_term, "example": example}
    ty(value_term)  # the example itself must be well typed
    sat = Saturator([rule])
    sat.add("root", value_term)
    stats = sat.run(BUDGET)
    graph = sat.serialize(roots, stats)
    return graph, graph.roots["example"], value_term


def rewritten_classes(graph: SaturatedGraph) -> list[str]:
    """The F and E e-classes that hold more than one IR e-node: where the rule added equalities."""
    out = []
    for cls, ids in sorted(graph.classes.items()):
        ops = [graph.nodes[i]["op"] for i in ids if graph.nodes[i]["op"] in SCHEMA]
        if len(ops) > 1 and SCHEMA[ops[0]][0] in ("F", "E"):
            out.append(cls)
    return out


def check_rule_example(rule: Rule, example: Term, seed: int) -> None:
    """Every equality the rule added, in any e-class, holds under the reference interpreter."""
    graph, cls, value_term = saturate_one(rule, example)
    classes = rewritten_classes(graph)
    assert classes, f"rule {rule.name} did not fire on its example {example}"
    rng = np.random.default_rng(seed)
    groups = [node_terms(graph, c) for c in classes]
    types = variables(value_term)
    for c in (t for g in groups for t in g):
        for name, t in variables(c).items():
            assert types.setdefault(name, t) == t, f"{name} has two types"
    env = {name: random_value(t, rng) for name, t in sorted(types.items())}
    interp = Interpreter(env, MEANINGS)
    for group in groups:
        first = group[0]
        if first.sort == "F":
            arg = random_value(fin(first), rng)
            run = lambda f: interp.apply(f, arg)  # noqa: E731 - one input shared by the class
        else:
            run = interp.value
        expected = run(first)
        for c in group[1:]:
            want = fin(first) if first.sort == "F" else ty(first)
            got_t = fin(c) if c.sort == "F" else ty(c)
            assert got_t == want, f"rule {rule.name} equated terms of types {want} and {got_t}: {c}"
            if c.sort == "F":
                assert fout(c) == fout(first), f"rule {rule.name} changed an output type: {c}"
            got = run(c)
            assert same_value(got, expected), (
                f"rule {rule.name}: {c}\n  differs from {first}\n  got {got}\n  expected {expected}")


# ---------------------------------------------------------------- every rule, every example


def test_every_rule_has_an_example_and_a_unique_name():
    names = [r.name for r in RULES]
    assert len(names) == len(set(names)), f"duplicate rule names: {sorted(n for n in names if names.count(n) > 1)}"
    assert not [r.name for r in RULES if not r.examples], "rules without an example cannot be property-tested"
    assert {r.level for r in RULES} == {"dsl", "algorithmic", "hardware"}


def test_rules_cover_every_device_op_of_the_target():
    for op in TARGET.device_ops():
        assert f"hw:{op.name}" in RULES_BY_NAME


@pytest.mark.parametrize("name", sorted(RULES_BY_NAME))
@PROPERTY
@given(seed=st.integers(0, 2**32 - 1))
def test_rule_preserves_meaning(name, seed):
    rule = RULES_BY_NAME[name]
    for i, make in enumerate(rule.examples):
        example = make(np.random.default_rng([seed, i]))
        check_rule_example(rule, example, seed)


# ---------------------------------------------------------------- extra examples
#
# Terms written here (not by the rules module) that satisfy a rule's left-hand side and side
# condition, so its soundness is checked even where its own example does not match it.

V = lambda n: ta(F32, n)  # noqa: E731


def _reduce_moving_both_operands(rng):
    n, m = int(rng.integers(1, 5)), int(rng.integers(2, 5))
    p = tp(V(n), V(n))
    # (ToChip . VVAdd) . Fork(ToChip . Fst, ToChip . Snd), left-nested (one stage before the fork;
    # _reduce_at_depth gives the right-nested chains): the operator's output stays in "mem"
    moved_sum = T("Comp", T("ToChip", "mem", V(n)), T("VVAdd", p))
    op = T("Comp", moved_sum,
           T("Fork", comp(T("ToChip", "mem", V(n)), T("Fst", p)), comp(T("ToChip", "mem", V(n)), T("Snd", p))))
    return T("Reduce", op, ta(V(n), m))


def _reduce_at_depth(depth: int):
    """Reduce((ToChip . ... . VVAdd) . Fork(ToChip . Fst, ToChip . Snd)) with `depth` stages
    before the fork: the rule's variants (matched along marked chains) at each depth."""

    def make(rng):
        n, m = int(rng.integers(1, 5)), int(rng.integers(2, 5))
        p = tp(V(n), V(n))
        stages = [T("ToChip", "mem", V(n)), T("VVRelu", V(n)), T("VVTanh", V(n))][:depth - 1] + [T("VVAdd", p)]
        fork = T("Fork", comp(T("ToChip", "mem", V(n)), T("Fst", p)), comp(T("ToChip", "mem", V(n)), T("Snd", p)))
        return T("Reduce", comp(*stages, fork), ta(V(n), m))

    return make


def _slice_of_computed_operand(rng):
    n2 = NATIVE * int(rng.integers(1, 4))
    n = int(rng.integers(1, n2))
    g = comp(T("Slice", 0, n, V(n2)), T("VVRelu", V(n2)))
    h = comp(T("Slice", 0, n, V(n2)), T("VVTanh", V(n2)))
    return comp(T("VVAdd", tp(V(n), V(n))), T("Fork", g, h))


def _mvmul_of_fork(rng):
    n, k = NATIVE * int(rng.integers(1, 3)), NATIVE * int(rng.integers(1, 3))
    t = tp(ta(V(k), n), V(k))
    return comp(T("MVMul", t), T("Fork", T("Fst", t), T("Snd", t)))


def _hoist_at_depth(depth: int, pos: str):
    """Map(p1 . ... . p_depth . Fork(ToChip . view . Fst, Snd)) (or the moved branch second):
    the hoisting rule's variants for 0 to HOIST_DEPTH stages after the move."""

    def make(rng):
        k, rows, m = int(rng.integers(1, 3)), int(rng.integers(1, 3)), int(rng.integers(1, 4))
        n = k * rows
        p = tp(V(n), V(n))
        pick = T(pos, p)
        view = comp(T("Split", k, V(n)), pick)                    # x: re-indexes the element
        moved = comp(T("ToChip", "mem", ta(V(k), rows)), view)
        other = comp(T("Split", k, V(n)), T("Snd" if pos == "Fst" else "Fst", p))
        fork = T("Fork", moved, other) if pos == "Fst" else T("Fork", other, moved)
        pm = tp(ta(V(k), rows), ta(V(k), rows))
        stages = [T("Join", ta(V(k), rows)), T("Map", T("VVAdd", tp(V(k), V(k))), rows), T("Zip", pm)]
        return T("Map", comp(*stages[3 - depth:], fork) if depth else fork, m)

    return make


EXTRA_EXAMPLES = {
    "tochip-hoist-from-reduce": [_reduce_moving_both_operands] + [_reduce_at_depth(d) for d in (2, 3, 4)],
    f"slice-through-binary/{NATIVE}": [_slice_of_computed_operand],
    "move-early:bw.mv_mul": [_mvmul_of_fork],
    "tochip-hoist-from-map": [_hoist_at_depth(d, pos) for d in range(4) for pos in ("Fst", "Snd")],
}


@pytest.mark.parametrize("name", sorted(EXTRA_EXAMPLES))
@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_rule_preserves_meaning_on_extra_examples(name, seed):
    for i, make in enumerate(EXTRA_EXAMPLES[name]):
        example = make(np.random.default_rng([seed, i]))
        check_rule_example(RULES_BY_NAME[name], example, seed)


#: rules with a variant for the middle of a composition chain, Comp(A, Comp(B, rest))
CHAIN_RULES = sorted(r.name for r in RULES if any("rest__" in c for c in r.commands())) + ["tochip-through-view"]


def test_chain_rules_are_found():
    assert {"split-join", "join-split", "tochip-through-zip"} <= set(CHAIN_RULES)


@pytest.mark.parametrize("name", CHAIN_RULES)
@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_rule_preserves_meaning_in_the_middle_of_a_chain(name, seed):
    """The example Comp(A, B) becomes Comp(A, Comp(B, Id)), an Id after the last stage of a
    longer chain Comp(A, Comp(B, C)): only the mid-chain variant matches. (The extra examples
    stand in for a rule's own where those do not match it at all.)"""
    rule = RULES_BY_NAME[name]

    def extended(t: Term) -> Term:
        return T("Comp", t.args[0], extended(t.args[1])) if t.op == "Comp" else T("Comp", t, T("Id", fin(t)))

    for i, make in enumerate(EXTRA_EXAMPLES.get(name, rule.examples)):
        example = make(np.random.default_rng([seed, i]))
        assert example.op == "Comp", f"{name}: example {example} is not a composition"
        check_rule_example(rule, extended(example), seed)


# ---------------------------------------------------------------- the checker itself


def test_checker_catches_an_unsound_rule():
    """A deliberately wrong rule (ReLU = Tanh) must be reported, so passing means something."""
    bad = Rule("bad", "algorithmic", ("(rewrite (VVRelu t) (VVTanh t) :ruleset algorithmic)",), "none",
               "wrong on purpose", lambda rng: T("VVRelu", V(3)))
    with pytest.raises(AssertionError, match="differs from"):
        check_rule_example(bad, bad.examples[0](np.random.default_rng(0)), 0)


def test_checker_catches_a_rule_that_does_not_fire():
    silent = Rule("silent", "algorithmic", ("(rewrite (VVTanh t) (VVRelu t) :ruleset algorithmic)",), "none",
                  "never matches its example", lambda rng: T("VVSigm", V(3)))
    with pytest.raises(AssertionError, match="did not fire"):
        check_rule_example(silent, silent.examples[0](np.random.default_rng(0)), 0)
