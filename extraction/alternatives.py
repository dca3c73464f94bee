"""The K cheapest distinct programs of a root e-class under a target's cost model.

Every e-class keeps its `width` cheapest candidate terms of distinct cost vectors (terms with the
same cost differ in re-indexing only, as far as the model can tell): an e-node with one
candidate chosen for each F/E child. Candidates are combined best-first from the children's
lists, and an e-node is combined again whenever a child's list changes, until none does; the
cheapest changes are combined first, as greedy extraction prices (in node-id order, a
GRU(1024) step's 6 k e-nodes on the systolic array were combined 105 k times, 12 s).
Keeping one term per cost vector also keeps out the best program wrapped in identities
(Comp(Id, f) lives in f's class and costs the same). Ties go to the lesser work (the model's
tie-break, as in greedy extraction), then to the smaller term, then to node ids, so the order is
deterministic; the first program returned is greedy extraction's.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from itertools import zip_longest

from egraph_rules.ir import Term
from egraph_rules.saturate import SaturatedGraph, gc_paused
from extraction.greedy import (INF, Computation, CostModel, Extracted, GraphView, combiner_of, computations,
                               extract_greedy, fixpoint, work_of)


@dataclass(frozen=True)
class _Cand:
    """One candidate term of an e-class: its e-node and one candidate per F/E child (`choice`:
    their places in the children's lists, so that at equal cost the children's best win, as in
    greedy extraction)."""

    scalar: float
    work: float
    size: int
    key: int
    node: str
    choice: tuple[int, ...]
    kids: tuple[_Cand, ...]
    cost: object

    def rank(self) -> tuple:
        return (self.scalar, self.work, self.size, self.node, self.choice)


def k_cheapest(graph: SaturatedGraph, root: str, model: CostModel, k: int, width: int | None = None) -> list[Extracted]:
    """Up to k terms of the root class with distinct cost vectors, cheapest first; the first is
    greedy extraction's program (width: candidates kept per class, at least k)."""
    width = max(width or k, k)
    view = GraphView(graph)
    best: dict[str, list[_Cand]] = {}
    made: dict[tuple, tuple[int, object, float, float, int]] = {}
    combiner, combines, work = combiner_of(model), {}, work_of(model)

    def improve(it: Computation) -> bool | float:
        old = best.get(it.eclass, [])
        if it.nid not in combines:
            combines[it.nid] = combiner(it.op, it.args, len(it.kids))
        merged = _cheapest_per_cost(old + _combine(it, combines[it.nid], best, model, work, width, made))[:width]
        fresh = next((c for c, o in zip_longest(merged, old) if o is None or c.key != o.key), None)
        if fresh is None:
            return False
        best[it.eclass] = merged
        return fresh.scalar  # the users combine the cheapest changes first, as greedy prices

    with gc_paused():
        fixpoint(computations(graph, view, model), improve)
    head = extract_greedy(graph, root, model)
    rest = [c for c in best.get(root, []) if c.scalar < INF and tuple(c.cost) != tuple(head.cost)]
    return [head] + [Extracted(_term(c, view), c.cost, c.scalar) for c in rest[: k - 1]]


def _combine(it: Computation, combine: Callable[[list[object]], object], best: dict[str, list[_Cand]],
             model: CostModel, work: Callable[[object], float], width: int,
             made: dict[tuple, tuple[int, object, float, float, int]]) -> list[_Cand]:
    """The node's `width` cheapest candidates: choices of child candidates explored best-first
    from (0, 0, ...), priced by `combine` (the node's cost from its children's; `work`, the
    model's tie-break, looked up once per extraction). `made` numbers distinct terms (an e-node
    and its children's numbers), so comparing candidates is cheap, and keeps each one's cost,
    cycles, work and size: a node is combined again whenever a child's list changes, mostly from
    the same child candidates."""
    lists = [best[c] for c in it.kids]
    scalars = [[c.scalar for c in lst] for lst in lists]
    sizes = [[c.size for c in lst] for lst in lists]
    out: list[_Cand] = []
    start = (0,) * len(it.kids)
    heap = [(_estimate(scalars, sizes, start), start)]
    seen = {start}
    while heap and len(out) < width:
        _, idx = heapq.heappop(heap)
        chosen = tuple(lst[i] for lst, i in zip(lists, idx))
        term = (it.nid,) + tuple(c.key for c in chosen)
        entry = made.get(term)
        if entry is None:
            cost = combine([c.cost for c in chosen])
            entry = made[term] = (len(made), cost, model.scalar(cost), work(cost), 1 + sum(c.size for c in chosen))
        key, cost, scalar, effort, size = entry
        out.append(_Cand(scalar, effort, size, key, it.nid, idx, chosen, cost))
        for j in range(len(idx)):
            nxt = idx[:j] + (idx[j] + 1,) + idx[j + 1:]
            if nxt[j] < len(lists[j]) and nxt not in seen:
                seen.add(nxt)
                heapq.heappush(heap, (_estimate(scalars, sizes, nxt), nxt))
    return out


def _cheapest_per_cost(cands: list[_Cand]) -> list[_Cand]:
    """The candidates in rank order, keeping the first of each cost vector: two terms the model
    cannot tell apart are one alternative (they differ in re-indexing, not in what runs)."""
    out: dict[tuple, _Cand] = {}
    for c in sorted(cands, key=_Cand.rank):
        out.setdefault(tuple(c.cost), c)
    return list(out.values())


def _estimate(scalars: list[list[float]], sizes: list[list[int]], idx: tuple[int, ...]) -> tuple:
    """Exploration order of child choices (idx: a place in each child's list): the sum of their
    predicted cycles, then sizes, then the index tuple (the cost model is a max over units, so
    this is an order, not a bound)."""
    return (sum(s[i] for s, i in zip(scalars, idx)), sum(s[i] for s, i in zip(sizes, idx)), idx)


def _term(c: _Cand, view: GraphView) -> Term:
    return view.term(c.node, [_term(k, view) for k in c.kids])
