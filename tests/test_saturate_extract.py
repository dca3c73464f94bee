"""The saturation driver (budgets, stop reasons, match counts, type-conflict check) and greedy
extraction (cheapest term under a cost model, deterministic, error when nothing can run)."""

from __future__ import annotations

import math

import pytest

from egraph_rules import saturate
from egraph_rules.ir import SCHEMA, T, Term, comp, numel, ta, tensor_type, tp, ts
from egraph_rules.rules import Rule, rewrite, shared_rewrite
from egraph_rules.saturate import PLANNER_SWITCH, Budget, EGraphError, Saturator, uses_of
from extraction.alternatives import k_cheapest
from extraction.greedy import ExtractionError, GraphView, computations, extract_greedy, fixpoint, greedy_choice
from frontend.layers import build_model
from liftsat.api import SharedEGraph
from liftsat.rulesets import rules_for
from liftsat.targets import get_target

N = 4
TARGET = get_target("brainwave", N)
F32 = ts("f32")


def V(n: int) -> Term:
    return ta(F32, n)


def relu_term(n: int) -> Term:
    return T("App", comp(T("ToOutput", V(n)), T("VVRelu", V(n))), T("Var", "x", V(n)))


def saturated(term: Term, rules=None, budget=Budget()):
    sat = Saturator(rules_for([TARGET]) if rules is None else rules)
    sat.add("root", term)
    stats = sat.run(budget)
    return sat.serialize({"root": term}, stats)


class Size:
    def node(self, op, args, child_costs):
        return 1 + sum(child_costs)

    def scalar(self, cost):
        return cost


class Never:
    def node(self, op, args, child_costs):
        return math.inf

    def scalar(self, cost):
        return cost


def test_saturates_and_counts_matches():
    graph = saturated(relu_term(3 * N))
    stats = graph.stats
    assert stats.saturated and stats.stop_reason == "saturated"
    assert stats.matches_per_rule.get(f"unary-split/{N}", 0) >= 1
    assert stats.matches_per_rule.get("hw:bw.v_relu", 0) >= 1
    assert 0 < stats.eclasses <= stats.enodes
    assert graph.roots["root"] in graph.classes


@pytest.mark.parametrize("budget, reason", [
    (Budget(nodes=5), "node limit"),
    (Budget(iterations=1), "iteration limit (1)"),
    (Budget(seconds=-1.0), "time limit"),
])
def test_budgets_stop_saturation(budget, reason):
    stats = saturated(relu_term(3 * N), budget=budget).stats
    assert not stats.saturated
    assert stats.stop_reason.startswith(reason)


def test_a_step_past_the_node_limit_is_kept_unless_past_its_undo_factor():
    """Linear(8, 8) grows 219 -> 311 e-nodes in its sixth step. With a limit of 300 that step is
    kept (311 is within twice the limit). With `undo_past=1` it is undone, and the e-graph is
    the one five steps built (replayed from the snapshot at 174 e-nodes)."""
    term = build_model(["Linear(8, 8)"], (1, 8), values=False).term
    assert saturated(term, budget=Budget(nodes=300)).stats.stop_reason == "node limit (311 > 300)"
    limited, five = saturated(term, budget=Budget(nodes=300, undo_past=1)), saturated(term, budget=Budget(iterations=5))
    assert limited.stats.stop_reason == "node limit (the next step grew 219 e-nodes to 311 > 1 x 300; undone)"
    assert not limited.stats.saturated
    assert (limited.stats.enodes, limited.stats.eclasses, limited.stats.iterations) == (219, five.stats.eclasses, 5)
    assert five.stats.enodes == 219
    assert limited.stats.matches_per_rule == five.stats.matches_per_rule
    model = TARGET.cost_model()
    assert extract_greedy(limited, limited.roots["root"], model).term == extract_greedy(five, five.roots["root"], model).term


def test_steps_that_took_the_replay_seconds_get_a_snapshot_so_an_undo_replays_none(monkeypatch):
    """Linear(8, 8)'s undone sixth step goes back to the snapshot at 174 e-nodes and replays the
    step after it. Once the steps since a snapshot take `REPLAY_SECONDS` (here: any), the next
    step gets a snapshot of its own, so the undo replays nothing, and the e-graph is the same."""
    term = build_model(["Linear(8, 8)"], (1, 8), values=False).term
    replayed: list[int] = []
    replay = Saturator._replay
    monkeypatch.setattr(Saturator, "_replay", lambda self, steps: (replayed.append(steps), replay(self, steps)))
    budget = Budget(nodes=300, undo_past=1)
    default = saturated(term, budget=budget)
    monkeypatch.setattr(saturate, "REPLAY_SECONDS", 0.0)
    eager = saturated(term, budget=budget)
    assert replayed == [1, 0]
    assert eager.stats.stop_reason == default.stats.stop_reason
    assert (eager.stats.enodes, eager.stats.eclasses, eager.stats.iterations) == (
        default.stats.enodes, default.stats.eclasses, default.stats.iterations)
    model = TARGET.cost_model()
    assert extract_greedy(eager, eager.roots["root"], model).term == extract_greedy(default, default.roots["root"], model).term


def test_leaving_an_extension_restores_the_egraph_after_an_undone_step():
    sat = Saturator(rules_for([TARGET]))
    sat.add("root", build_model(["Linear(8, 8)"], (1, 8), values=False).term)
    sat.run(Budget(iterations=2))
    before = (sat.size(), sat.snapshots)
    with sat.extended([]):
        assert sat.run(Budget(nodes=300, undo_past=1)).stop_reason.endswith("undone)")
        assert sat.snapshots > before[1] + 1
    assert (sat.size(), sat.snapshots) == before
    for _ in range(sat.snapshots):  # egglog's own stack holds exactly the snapshots counted
        sat._run("(pop)")
    with pytest.raises(EGraphError):
        sat._run("(pop)")


@pytest.mark.skipif(not PLANNER_SWITCH, reason="this egglog has one query planner (egglog 14 has two)")
def test_saturation_without_tree_plans_reaches_the_same_egraph():
    """liftsat turns egglog 14's tree-decomposed query plans off for speed; the rules must match
    and build exactly what they do with them."""
    term = build_model(["GRUCell(16, 16)"], (1, 16), values=False).term
    a, b = (SharedEGraph(term, Budget(seconds=600), tree_plans).saturate(TARGET) for tree_plans in (True, False))
    figures = [(g.stats.enodes, g.stats.eclasses, g.stats.iterations, g.stats.stop_reason, g.stats.matches_per_rule)
               for g in (a, b)]
    assert figures[0] == figures[1]
    assert extract_greedy(a, a.roots["root"], TARGET.cost_model()).term == extract_greedy(b, b.roots["root"], TARGET.cost_model()).term


def test_type_conflict_is_reported():
    bad = Rule("retype", "algorithmic", ("(rewrite (VVRelu (TA s n)) (VVRelu (TA s (+ n 1))) :ruleset algorithmic)",),
               "none", "equates functions of different input types", lambda rng: T("VVRelu", V(2)))
    with pytest.raises(EGraphError, match="type conflict"):
        saturated(relu_term(2), rules=[bad], budget=Budget(iterations=2))


def test_a_shared_rewrite_adds_what_the_plain_rewrite_adds():
    """shared_rewrite binds each repeated sub-term of the right-hand side once by a let (relu(x)
    + relu(x) with relu and its pair type used twice); the e-graph it builds is the plain
    rewrite's."""
    lhs, rhs = "(VVTanh (TA s n))", ("(Comp (VVAdd (TP (TA s n) (TA s n))) "
                                     "(Fork (VVRelu (TA s n)) (VVRelu (TA s n))))")
    text = shared_rewrite(lhs, rhs, "algorithmic", ["(> n 2)"])
    assert "(let shared0__ (TA s n)) (let shared1__ (VVRelu shared0__))" in text
    assert "(union lhs__ (Comp (VVAdd (TP shared0__ shared0__)) (Fork shared1__ shared1__)))" in text
    doubled = comp(T("VVAdd", tp(V(8), V(8))), T("Fork", T("VVRelu", V(8)), T("VVRelu", V(8))))
    graphs = []
    for form in (text, rewrite(lhs, rhs, "algorithmic", ["(> n 2)"])):
        sat = Saturator([Rule("double-relu", "algorithmic", (form,), "n > 2", "", lambda rng: None)])
        term = T("App", T("VVTanh", V(8)), T("Var", "x", V(8)))
        sat.add("root", term)
        graph = sat.serialize({"root": term, "doubled": T("App", doubled, T("Var", "x", V(8)))},
                              sat.run(Budget(iterations=3)))
        assert graph.roots["root"] == graph.roots["doubled"]
        graphs.append((len(graph.nodes), len(graph.classes)))
    assert graphs[0] == graphs[1]


def test_malformed_rule_is_an_egraph_error():
    broken = Rule("broken", "algorithmic", ("(rewrite (VVRelu t) :ruleset algorithmic)",), "none", "", lambda r: None)
    with pytest.raises(EGraphError):
        Saturator([broken])


def test_extraction_picks_device_ops():
    graph = saturated(relu_term(3 * N))
    best = extract_greedy(graph, graph.roots["root"], TARGET.cost_model())
    ops = {t.op for t in best.term.walk()}
    assert "Dev" in ops and "VVRelu" not in ops
    assert best.cycles < math.inf and best.cycles == TARGET.cost_model().scalar(best.cost)


def test_extraction_is_deterministic_and_smallest_under_size():
    graph = saturated(relu_term(3 * N))
    a = extract_greedy(graph, graph.roots["root"], Size())
    b = extract_greedy(graph, graph.roots["root"], Size())
    assert a.term == b.term
    assert a.term == relu_term(3 * N)  # the input term is the smallest of its class


def test_extraction_without_a_runnable_program():
    graph = saturated(relu_term(N), rules=[])
    with pytest.raises(ExtractionError):
        extract_greedy(graph, graph.roots["root"], TARGET.cost_model())
    with pytest.raises(ExtractionError):
        extract_greedy(graph, graph.roots["root"], Never())


def test_cost_model_prefers_pinned_weights():
    w = T("Var", "W", tensor_type("f32", (N, N)))
    layer = T("LinearNB", w, V(N))
    graph = saturated(T("App", comp(T("ToOutput", V(N)), layer), T("Var", "x", V(N))))
    best = extract_greedy(graph, graph.roots["root"], TARGET.cost_model())
    consts = [t for t in best.term.walk() if t.op == "Const"]
    assert consts and any(s.op == "ToChip" for c in consts for s in c.walk())


def test_pairs_and_constants_keep_their_types():
    t = tp(V(N), V(N))
    term = T("App", comp(T("ToOutput", V(N)), T("VVAdd", t)), T("Pair", T("Var", "a", V(N)), T("Var", "b", V(N))))
    graph = saturated(term)
    best = extract_greedy(graph, graph.roots["root"], TARGET.cost_model())
    assert any(s.op == "Dev" and s.args[0] == "bw.vv_add" for s in best.term.walk())


class Placed(Size):
    """Size, with one 64-byte on-chip memory `m`."""

    def fits(self, space, t):
        return space != "m" or numel(t) * 4 <= 64


def _overflow_graph():
    """A program leaving a 32-element value in `m` (small), and one that fits (large), equal."""
    x = T("Var", "x", V(32))
    small = T("App", comp(T("ToOutput", V(32)), T("ToChip", "m", V(32))), x)
    large = T("App", comp(T("ToOutput", V(32)), T("VVRelu", V(32)), T("VVRelu", V(32))), x)
    same = Rule("same", "algorithmic", (f"(rewrite {small.sexpr} {large.sexpr} :ruleset algorithmic)",), "none", "")
    sat = Saturator([same])
    sat.add("root", small)
    return sat.serialize({"root": small}, sat.run(Budget())), small, large


def test_classes_overflowing_their_memory_are_left_out():
    """The smaller program leaves a 32-element value in a 16-element memory `m`: extraction must
    pass it over for the larger one that fits, and take it when nothing limits memories."""
    graph, small, large = _overflow_graph()
    assert extract_greedy(graph, graph.roots["root"], Size()).term == small
    assert extract_greedy(graph, graph.roots["root"], Placed()).term == large


class Moves:
    """Every program as fast (no cycles); its work is how many values it moves on chip."""

    def node(self, op, args, child_costs):
        return (0.0, (op == "ToChip") + sum(c[1] for c in child_costs))

    def scalar(self, cost):
        return cost[0]

    def work(self, cost):
        return cost[1]


def test_ties_in_cycles_go_to_the_lesser_work():
    """Of two programs predicted as fast, greedy extraction takes the one of lesser `work` (here:
    moving fewer values on chip), though the other is the smaller term (which size alone would
    take), and the alternatives come in that order too."""
    graph, small, large = _overflow_graph()
    root = graph.roots["root"]
    assert extract_greedy(graph, root, Size()).term == small
    assert extract_greedy(graph, root, Moves()).term == large
    assert [e.term for e in k_cheapest(graph, root, Moves(), 2)] == [large, small]


def test_smallest_is_a_smallest_term_of_its_class():
    """GraphView.smallest, which looks only below its e-class, finds terms as small as greedy
    extraction by size over the whole e-graph, each a term of its class."""
    graph = saturated(relu_term(3 * N))
    view = GraphView(graph)
    sizes = greedy_choice(graph, Size(), view)
    assert view.smallest(graph.roots["root"]) == relu_term(3 * N)
    for cls, (size, *_) in sizes.items():
        term = view.smallest(cls)
        assert graph.class_of(term) == cls
        assert sum(1 for t in term.walk() if SCHEMA[t.op][0] in ("F", "E")) == size


def test_only_enodes_whose_children_can_have_a_value_are_decoded():
    """An e-node one of whose child classes has no e-node that can be costed is left out: the
    class overflowing `m` has none, so neither has the composition storing its value, and the
    small program's application of it is left out too; every other F/E e-node is in."""
    graph, small, _ = _overflow_graph()
    view = GraphView(graph)
    every = computations(graph, view, Size())
    placed = computations(graph, view, Placed())
    dead = {graph.class_of(T("ToChip", "m", V(32))), graph.class_of(small.args[0])}
    assert {c.eclass for c in every} >= dead
    assert [c for c in every if c.eclass not in dead and not dead & set(c.kids)] == placed
    for work in (every, placed):
        assert {k for c in work for k in c.kids} <= {c.eclass for c in work}


def test_fixpoint_visits_an_enode_once_its_children_have_values():
    """No visit finds a child class without a value; every e-class gets one."""
    graph, _, _ = _overflow_graph()
    work = computations(graph, GraphView(graph), Size())
    best: dict[str, int] = {}
    visits: list[str] = []

    def improve(c):
        assert all(k in best for k in c.kids)
        visits.append(c.nid)
        size = 1 + sum(best[k] for k in c.kids)
        if best.get(c.eclass, math.inf) <= size:
            return False
        best[c.eclass] = size
        return True

    fixpoint(work, improve)
    assert set(best) == {c.eclass for c in work}
    assert len(visits) < 2 * len(work)


def test_greedy_prices_cheapest_first_an_enode_about_once_to_a_fixpoint():
    """Greedy extraction takes the cheapest candidate first, so on a recurrent cell's e-graph
    (cycles through its compositions and Forks) an e-node is priced about once (in node-id
    order, these 3 k e-nodes were priced 18.5 k times), and it reaches a fixpoint: no e-node
    priced with its children's choices beats its class's, and each class's cost is its chosen
    e-node's priced with its children's (no choice is left with a stale cost)."""
    target = get_target("vta", 16)
    model = target.cost_model()
    graph = SharedEGraph(build_model(["GRUCell(64, 64)"], (1, 64), values=False).term).saturate(target)
    priced: list[str] = []

    class Counting:
        def __getattr__(self, name):
            return getattr(model, name)

        def combiner(self, op, args, nkids):
            cost_of = model.combiner(op, args, nkids)
            return lambda kids: priced.append(op) or cost_of(kids)

    view = GraphView(graph)
    best = greedy_choice(graph, Counting(), view)
    work = computations(graph, view, model)
    assert len(work) > 3000 and len(priced) < 1.2 * len(work)
    for c in work:
        kids = [best[k] for k in c.kids]
        cost = model.node(c.op, c.args, [k.cost for k in kids])
        assert (model.scalar(cost), model.work(cost), 1 + sum(k.size for k in kids), c.nid) >= best[c.eclass][:4]
        if best[c.eclass].nid == c.nid:
            assert cost == best[c.eclass].cost


def test_functions_index_every_fe_enode_and_its_uses():
    """`SaturatedGraph.functions`, built once with the serialized e-graph, lists every F/E e-node
    in node-id order with its operator and its F/E children as `GraphView.kids` picks them; an
    e-class's users are exactly the e-nodes with it among their children, and each e-node waits
    for as many distinct child classes as it has."""
    graph, _, _ = _overflow_graph()
    view, index = GraphView(graph), graph.functions
    fe = sorted(nid for nid, n in graph.nodes.items() if SCHEMA.get(n["op"], ("Ty",))[0] in ("F", "E"))
    assert index.ids == fe
    assert index.ops == [graph.nodes[nid]["op"] for nid in fe]
    assert index.kids == [view.kids(nid) for nid in fe]
    assert index.classes == [graph.nodes[nid]["eclass"] for nid in fe]
    for cls in {k for ks in index.kids for k in ks}:
        assert index.uses.users[cls] == [n for n, ks in enumerate(index.kids) if cls in ks]
    assert index.uses.distinct == [len(set(ks)) for ks in index.kids]


def test_uses_count_a_repeated_child_once():
    """An e-node with the same class twice among its children (Zip of a value with itself) is
    one user of it and waits for one class."""
    uses = uses_of([(), ("a",), ("a", "a"), ("a", "b"), ("b", "a", "b")])
    assert uses.users == {"a": [1, 2, 3, 4], "b": [3, 4]}
    assert uses.distinct == [0, 1, 1, 2, 2]


@pytest.mark.parametrize("fill", [-math.inf, 1e20, -1e-7, 2.5])
def test_pad_fill_values_survive_the_egraph(fill):
    """A PadWith's f64 fill goes into egglog and comes back out of the serialized e-graph the same
    (egglog prints 1e+20 as 1e20 and -1e-07 as -1e-7): the root is found, the program keeps it."""
    pad = T("PadWith", 1, 2, fill, V(N - 3))
    term = T("App", comp(T("ToOutput", V(N)), T("VVRelu", V(N)), pad), T("Var", "x", V(N - 3)))
    graph = saturated(term)
    best = extract_greedy(graph, graph.roots["root"], TARGET.cost_model())
    assert pad in list(best.term.walk())
