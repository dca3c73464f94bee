"""Greedy bottom-up extraction over the serialized e-graph with a target's cost model.

Every e-node of sort F or E gets cost(op, constant arguments, costs of its F/E children); an
e-class costs its cheapest e-node, ties to the lesser `work` (the cycle model's: the DMA unit's
cycles, so of programs as fast the one moving less data), then to the smaller term, then to the
node id. Candidates are taken cheapest first (`greedy_choice`), and an e-node is priced again
whenever a child class improves, until none does. A cost is a vector whose cycles are its
busiest component, so a child's cheaper cycles can raise its parent's and the fixpoint reached
can depend on the order; this one is fixed by the costs and node ids, so extraction is
deterministic. Greedy runs twice, ranking every sub-program as a program and as a loop's body,
and keeps the cheaper whole program (`greedy_best`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple, Protocol

from egraph_rules.ir import SCHEMA, Term, primitive_value, tp
from egraph_rules.saturate import SaturatedGraph, Uses, child_sorts, gc_paused, kids_of, uses_of

INF = math.inf


class CostModel(Protocol):
    """A target's cost model as extraction sees it."""

    def node(self, op: str, args: tuple, child_costs: list[Any]) -> Any:
        """Cost of an e-node: args holds Ty terms, ints and strings in place and None for F/E
        children; child_costs holds the costs of the F/E children in order."""

    def local(self, op: str, args: tuple) -> tuple[float, ...]:
        """The e-node's own cost vector; `node` is local plus the scaled child costs."""

    def scales(self, op: str, args: tuple, nkids: int) -> tuple[float, ...]:
        """How many times each F/E child's cost counts in the e-node's cost."""

    def buffers(self, op: str) -> int | None:
        """How many buffers the loads in the body of a loop e-node get (None: not a loop)."""

    def counted(self, local: tuple[float, ...], m: float, buffers: int | None = None) -> tuple[float, ...]:
        """A `local` cost paid m times (a whole number: a loop's trip count, or 0) in the body of
        a loop whose loads get `buffers` buffers each (None: left to the loop around it); m *
        local unless some of it is paid only on a first run or depends on the buffers."""

    def scalar(self, cost: Any) -> float:
        """Predicted cycles of a cost (INF when the target cannot run it; never negative)."""

    # optional: work(cost) -> float, the tie-break between costs of equal cycles (lower first);
    # a model without it breaks such ties by term size alone
    # optional: combiner(op, args, nkids) -> a function of the child costs giving `node`'s cost,
    # for an e-node visited many times
    # optional: fits(space, t) -> bool, whether a value of type t fits the on-chip memory `space`;
    # a model without it places no limit on what a function leaves on chip
    # optional: fits_pinned(space, t) -> bool, the same for a constant pinned there at setup
    # optional: unpinned, a set of e-class ids of constants that may not be pinned on chip


class ExtractionError(RuntimeError):
    """No finite-cost program exists for the root under this cost model."""


@dataclass
class Extracted:
    """The cheapest term of a root e-class and its cost."""

    term: Term
    cost: Any
    cycles: float


class GraphView:
    """Decodes the constant parts of a serialized e-graph (types, integers, strings)."""

    def __init__(self, graph: SaturatedGraph):
        self.graph = graph
        self._const: dict[str, object] = {}

    def const(self, cls: str) -> object:
        """The value of a Ty, i64, f64 or String e-class."""
        if cls not in self._const:
            node = self.graph.nodes[self.graph.classes[cls][0]]
            op = node["op"]
            if op in SCHEMA:
                self._const[cls] = Term(op, tuple(self.const(c) for c in node["children"]))
            else:
                self._const[cls] = primitive_value(op)
        return self._const[cls]

    def placed(self, cls: str) -> list[tuple[str, Term]]:
        """The on-chip memories a function e-class leaves its value in, with the value's type."""
        out = self.graph.outputs.get(cls)
        return [(space, self.const(out)) for space in self.graph.spaces.get(cls, ())] if out else []

    def kids(self, nid: str) -> tuple[str, ...]:
        """The e-classes of an e-node's F/E children, in order."""
        node = self.graph.nodes[nid]
        return kids_of(node["op"])(node["children"])

    def term(self, nid: str, kids: list[Term]) -> Term:
        """The term of an e-node given the terms chosen for its F/E children."""
        node = self.graph.nodes[nid]
        it = iter(kids)
        return Term(node["op"], tuple(next(it) if k else self.const(c)
                                      for k, c in zip(child_sorts(node["op"])[1], node["children"])))

    def build(self, cls: str, chosen: Mapping[str, str]) -> Term:
        """The term of e-class cls with every e-class taking the e-node `chosen` names for it."""
        nid = chosen[cls]
        return self.term(nid, [self.build(c, chosen) for c in self.kids(nid)])

    def smallest(self, cls: str) -> Term | None:
        """The smallest term of an F or E e-class (ties to the lower node id; None when each of
        its terms would be infinite): a fixpoint over the e-nodes below it only, for looking
        at one value without extracting the whole e-graph."""
        nodes, classes = self.graph.nodes, self.graph.classes
        below, todo, found = {cls}, [cls], {}
        while todo:
            for nid in classes[todo.pop()]:
                if kids_of(nodes[nid]["op"]) is not None:
                    found[nid] = self.kids(nid)
                    fresh = set(found[nid]) - below
                    below |= fresh
                    todo.extend(fresh)
        ids = sorted(found)
        kids = [found[nid] for nid in ids]
        owner = [nodes[nid]["eclass"] for nid in ids]
        size: dict[str, tuple[int, str]] = {}

        def visit(n: int) -> bool:
            cand = (1 + sum([size[k][0] for k in kids[n]]), ids[n])
            if owner[n] in size and cand >= size[owner[n]]:
                return False
            size[owner[n]] = cand
            return True

        _propagate(kids, owner, visit)
        return self.build(cls, {c: s[1] for c, s in size.items()}) if cls in size else None


class Choice(NamedTuple):
    """An e-class's cheapest e-node as greedy extraction ranks it: cycles (of the runs it ranks
    by: `greedy_choice`), then work, then term size, then node id; and its cost."""

    cycles: float
    work: float
    size: int
    nid: str
    cost: Any


class Computation(NamedTuple):
    """An e-node of sort F or E as extraction sees it: constant arguments decoded (None in place
    of F/E children) and its F/E children's e-classes in order (a named tuple: extraction builds
    one per e-node, and a tuple is the cheapest immutable record to build)."""

    nid: str
    op: str
    args: tuple
    kids: tuple[str, ...]
    eclass: str


def computations(graph: SaturatedGraph, view: GraphView, model: CostModel) -> list[Computation]:
    """Every F/E e-node of the graph that can have a value, in node-id order (so what is built
    from it is deterministic): one `admission` lets in whose children's e-classes each hold such
    an e-node. Only the e-nodes reached are decoded: on the systolic array's 93 k e-node graphs,
    most are compositions whose children never get a value."""
    admit = admission(graph, view, model)
    ids, ops, kids, classes = graph.functions.ids, graph.functions.ops, graph.functions.kids, graph.functions.classes
    out: dict[int, Computation] = {}
    valued: set[str] = set()

    def reach(n: int) -> bool:
        args = admit(n)
        if args is None:
            return False
        out[n] = Computation(ids[n], ops[n], args, kids[n], classes[n])
        first = classes[n] not in valued
        valued.add(classes[n])
        return first

    _propagate(kids, classes, reach, graph.functions.uses)
    return [out[n] for n in sorted(out)]


def admission(graph: SaturatedGraph, view: GraphView, model: CostModel) -> Callable[[int], tuple | None]:
    """The constant arguments of the F/E e-node at a position of the graph's index, decoded (None
    in place of F/E children), or None when extraction leaves the e-node out. Left out with
    their e-classes' other e-nodes: those of e-classes whose value would overflow the on-chip
    memory it is left in (an intermediate result codegen could not lay out, which no other cost
    sees); left out alone: constants pinned on chip that the model does not let stay there (too
    large, or `unpinned`), and Folds whose step leaves its state on chip where the two state
    buffers codegen alternates between would overflow (the Fold that keeps its state in DRAM is
    another e-node)."""
    fits = getattr(model, "fits", None)
    pins = getattr(model, "fits_pinned", None)
    unpinned = getattr(model, "unpinned", frozenset())
    overflow: dict[str, bool] = {}
    nodes = graph.nodes
    ids, ops, kids, classes = graph.functions.ids, graph.functions.ops, graph.functions.kids, graph.functions.classes

    def admit(n: int) -> tuple | None:
        op, cls = ops[n], classes[n]
        if fits is not None:
            bad = overflow.get(cls)
            if bad is None:
                bad = overflow[cls] = not all(fits(space, t) for space, t in view.placed(cls))
            if bad:
                return None
            if op == "Fold" and not all(fits(space, tp(t, t)) for space, t in view.placed(kids[n][0])):
                return None
        if op == "Const" and (placed := view.placed(cls)) and (
                cls in unpinned or (pins is not None and not all(pins(space, t) for space, t in placed))):
            return None
        is_kid = child_sorts(op)[1]
        if all(is_kid):
            return (None,) * len(is_kid)
        return tuple([None if k else view.const(c) for k, c in zip(is_kid, nodes[ids[n]]["children"])])

    return admit


def fixpoint(work: list[Computation], improve: Callable[[Computation], bool | float]) -> None:
    """Visit each e-node once its child classes all have a value, then again whenever one of
    them improves, until none does; `improve` updates the node's class from it and says whether
    the class changed: False, or True, or the rank at which the class's users are visited next
    (lower first). Whenever several wait, the first by rank, then in list order, is visited, so
    the result does not depend on timing. The ILP's bounds (the same in any order) visit in list
    order; the alternatives' lists are ranked by the cycles of what changed, cheapest first, as
    greedy extraction takes its candidates (`greedy_choice`)."""
    _propagate([c.kids for c in work], [c.eclass for c in work], lambda n: improve(work[n]))


def _propagate(kids: list[tuple[str, ...]], classes: list[str], visit: Callable[[int], bool | float],
               uses: Uses | None = None) -> None:
    """`fixpoint` over e-nodes given by position: each one's children's e-classes and its own
    (and their `uses`, when indexed already); visit(n) says whether e-node n changed its class
    (False, True, or the rank its class's users are visited at)."""
    uses = uses or uses_of(kids)
    users, missing = uses.users, list(uses.distinct)
    #: the rank each e-node waits at (None: it does not wait)
    queued: list[float | None] = [None if m else 0.0 for m in missing]
    todo = [(0.0, n) for n, m in enumerate(missing) if not m]
    valued: set[str] = set()
    pop, push = heapq.heappop, heapq.heappush
    while todo:
        rank, n = pop(todo)
        if rank != queued[n]:
            continue  # queued again at a lower rank, and visited then
        queued[n] = None
        changed = visit(n)
        if changed is False:
            continue
        rank = 0.0 if changed is True else changed
        cls = classes[n]
        first = cls not in valued
        valued.add(cls)
        for u in users.get(cls, ()):
            if first:
                missing[u] -= 1
            if not missing[u] and (queued[u] is None or rank < queued[u]):
                queued[u] = rank
                push(todo, (rank, u))


def combiner_of(model: CostModel) -> Callable[[str, tuple, int], Callable[[list[Any]], Any]]:
    """`model.combiner` (an e-node's cost as a function of its children's, what does not depend on
    them worked out once), or `model.node` with the e-node bound for a model that has none."""
    return getattr(model, "combiner", None) or (lambda op, args, nkids: partial(model.node, op, args))


def work_of(model: CostModel) -> Callable[[Any], float]:
    """`model.work` (the tie-break between costs of equal cycles), or no tie-break (0) for a model
    that has none."""
    return getattr(model, "work", None) or (lambda cost: 0.0)


class EnodeCosts:
    """Each e-node's cost as a function of its children's (`combiner_of`), decoded
    (`admission`) the first time it is asked for and kept, so greedy's two rankings decode the
    graph once; False for an e-node extraction leaves out."""

    def __init__(self, graph: SaturatedGraph, model: CostModel, view: GraphView):
        self.admit, self.combiner = admission(graph, view, model), combiner_of(model)
        self.ops, self.kids = graph.functions.ops, graph.functions.kids
        self.made: dict[tuple, Callable[[list[Any]], Any]] = {}
        self.costs: list[Callable[[list[Any]], Any] | bool | None] = [None] * len(self.ops)

    def __call__(self, n: int) -> Callable[[list[Any]], Any] | bool:
        cost_of = self.costs[n]
        if cost_of is None:
            args = self.admit(n)
            if args is None:
                cost_of = self.costs[n] = False
            else:
                key = (self.ops[n], args)
                cost_of = self.costs[n] = self.made.get(key) or self.made.setdefault(
                    key, self.combiner(self.ops[n], args, len(self.kids[n])))
        return cost_of


def greedy_choice(graph: SaturatedGraph, model: CostModel, view: GraphView, runs: float = 1.0,
                  enode_costs: EnodeCosts | None = None) -> dict[str, Choice]:
    """For every e-class with a finite-cost term, its `Choice`, each sub-program ranked by the
    cycles of `runs` runs of it (`CostModel.counted`): with one, as a program; with more, as the
    body of a loop, whose every run pays what is paid per run (its loads' steady waits, its
    stores' overlapped rows) and only one what is paid once (a load's cold start, a store's
    whole drain), which a program that loops over images or rows mostly is.

    Cheapest first, as Dijkstra's shortest paths (in Knuth's generalization to grammars): an e-node
    is priced once all its child classes have a cost, the cheapest priced candidate (cycles, then
    work, then term size, then node id) is taken next, and an e-class's users are priced again
    whenever it improves. An e-node's cycles are mostly at least its children's (not a Const's,
    whose value is computed once at setup, nor a loop's whose buffers hide its body's load
    waits), so most e-classes improve only once; visited in node-id order, as before
    2026-11-28, they improved again and again (a GRU(2816) step's 6 k e-nodes were visited
    120 k times). A candidate priced before a child improved is dropped. An e-node whose term
    is no smaller than its class's free one is not priced at all (on a Snowflake 1x1 training
    convolution's 140 k e-node graph, from before saturation undid steps past twice the node
    limit, 46 k of 47 k e-classes were free re-layouts, of weights mostly, reached 110 k ways),
    and e-nodes are decoded (`admission`) when first priced, so those whose children never get
    a cost never are (`enode_costs`: decoded by an earlier pass over the same graph and model)."""
    best: dict[str, Choice] = {}
    ids, kids, classes = graph.functions.ids, graph.functions.kids, graph.functions.classes
    users, missing = graph.functions.uses.users, list(graph.functions.uses.distinct)
    scalar = model.scalar if runs == 1 else partial(_runs_scalar, model, runs)
    work = work_of(model)
    cost_fn = enode_costs or EnodeCosts(graph, model, view)
    version = [0] * len(ids)
    heap: list[tuple[float, float, int, str, int, int, Any]] = []
    pop, push = heapq.heappop, heapq.heappush

    def price(n: int) -> None:
        version[n] = stamp = version[n] + 1
        chosen = [best[k] for k in kids[n]]
        size, old = 1 + sum([b.size for b in chosen]), best.get(classes[n])
        if old is not None and (0.0, 0.0, size, ids[n]) >= old[:4]:
            return  # cycles and work are never negative: even free, it would not beat its class
        cost_of = cost_fn(n)
        if cost_of is False:
            return
        cost = cost_of([b.cost for b in chosen])
        cand = (scalar(cost), work(cost), size, ids[n])
        if old is None or cand < old[:4]:
            push(heap, (*cand, n, stamp, cost))

    with gc_paused():
        for n, m in enumerate(missing):
            if not m:
                price(n)
        while heap:
            cycles, effort, size, nid, n, stamp, cost = pop(heap)
            cls = classes[n]
            old = best.get(cls)
            if stamp != version[n] or (old is not None and (cycles, effort, size, nid) >= old[:4]):
                continue
            best[cls] = Choice(cycles, effort, size, nid, cost)
            for u in users.get(cls, ()):
                if old is None:
                    missing[u] -= 1
                if not missing[u]:
                    price(u)
    return best


#: how many runs of a sub-program greedy's second pass ranks it by (`greedy_choice`)
LOOP_RUNS = 2.0
#: how much cheaper the second pass's program must be to replace the first pass's when it moves
#: more data (`greedy_best`): the model is not that exact, and a program that reloads what the
#: other loads once waits in ways it does not see (cpu's 1x1 training convolution
#: 14x14x256x16x1024, ranked as loop bodies, reloads each 8x8 weight tile for every block of
#: input channels into one buffer, waiting for the tile's 49 reads: predicted 0.8% cheaper,
#: 31,190,936 cycles simulated, against 16,461,720 for loading each block's 32 tiles once)
PASS_MARGIN = 0.01


def _runs_scalar(model: CostModel, runs: float, cost: Any) -> float:
    """The cycles of `runs` runs of a cost: greedy's ranking of a loop's body (INF for a cost the
    target cannot run, whose parts paid once `counted` would take from INF)."""
    return INF if model.scalar(cost) == INF else model.scalar(model.counted(cost, runs))


def extract_greedy(graph: SaturatedGraph, root: str, model: CostModel) -> Extracted:
    """Cheapest term for root (a class id) under the cost model, of greedy's two rankings
    (`greedy_best`)."""
    return greedy_best(graph, root, model, GraphView(graph))[1]


def greedy_best(graph: SaturatedGraph, root: str, model: CostModel, view: GraphView) -> tuple[dict[str, Choice], Extracted]:
    """The cheaper of greedy's two programs for the root e-class and the choices it came from:
    sub-programs ranked as programs, then as loop bodies (`LOOP_RUNS` runs), the second taken
    only where it is cheaper by `PASS_MARGIN`, or as cheap and moving less data. Ranked as a
    program, a loop's body that pays a drain or a cold start once can lose to one that pays more
    every run (brainwave's 14x14x256 1x1 training convolution on 16 images:
    a whole image's stores after its products, 106,156 cycles predicted, lost to a store per
    pixel, 152,320); ranked as loop bodies, a program's own top level is, too, so neither pass
    is always the better. A model without `counted` (costs not told apart by run) ranks as
    programs only."""
    found, enode_costs = [], EnodeCosts(graph, model, view)
    for runs in (1.0, LOOP_RUNS) if hasattr(model, "counted") else (1.0,):
        best = greedy_choice(graph, model, view, runs, enode_costs)
        found.append((best, chosen_program(root, best, view, model)))
    work = work_of(model)
    first, *later = found
    for f in later:
        if f[1].cycles < first[1].cycles * (1 - PASS_MARGIN) or (
                f[1].cycles <= first[1].cycles and work(f[1].cost) < work(first[1].cost)):
            first = f
    return first


def chosen_program(root: str, best: dict[str, Choice], view: GraphView, model: CostModel) -> Extracted:
    """The program `greedy_choice` chose for the root e-class, with its cycles (an
    ExtractionError when the target can run none)."""
    if root not in best or best[root].cycles == INF:
        raise ExtractionError("no program the target can run was found for this layer")
    cost = best[root].cost
    return Extracted(view.build(root, {cls: b.nid for cls, b in best.items()}), cost, model.scalar(cost))
