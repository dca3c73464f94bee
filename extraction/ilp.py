"""Extraction by integer linear programming (HiGHS, through highspy): a sub-term the program
applies twice to the same value is paid once, as code generation compiles it once.

The cost model is linear (an e-node costs its `local` vector plus each F/E child's cost counted
the node's `scales` times), so a program's cost is a sum over the places its e-nodes are used.
A *context* is such a place: (e-class, input key, multiplicity, buffers). The multiplicity is the
product of the scales above (loop trip counts; 0 under Const, computed once at setup), the
buffers are those the innermost loop above gives its body's loads (1 outside every loop), and
the model's `counted(local, multiplicity, buffers)` is what the e-node itself costs there (a
loop's load waits from cold only once, so that is affine, not proportional, in the
multiplicity). The input key
names the value the function is applied to as code generation's `apply(f, v)` sees it: a Fork's
branches and a composition's first stage see their parent's input; a composition's second stage
sees the first stage's result, a loop body an element, an App's function its value, each keyed
by that source and the parent's key. Values (E) have no input, and all of a multiplicity-0
context costs nothing, so those are one context per e-class. `dag_cost` prices a term this way
with full keys: the cost the ILP's result and greedy's are compared on.

Full keys cannot be enumerated over an e-graph (one path per way of reaching an e-class: more
than 400,000 contexts for a 64 x 32 Linear), so the ILP keeps only the `depth` latest sources of
a key (2, then 3 and 4 while the program found costs more than the ILP counted: short keys can
merge uses of a generic combinator on different values). Binary x[node, context] picks at most
one e-node per context, the root context exactly one, and a picked node needs a pick in each of
its child contexts. The objective is z ≥ Σ w_u × counted_u × x for every cost component u: the
model's `scalar` must be a weighted max of the components (checked: `scalar(c) = max_u w_u c_u`
with w_u = scalar(unit vector u); if `scalar` changes form, this objective must too). Valid cuts
z ≥ Σ lower bound at the context's multiplicity × x (per context: a first use's bound plus the
multiplicity less one times a further use's) make the LP bound useful. A tiny cost per pick
(TIE_BREAK cycles in all) sends ties to smaller programs. Once the cycles are proven optimal,
a second ILP over the same contexts keeps z at the program's cycles and minimizes the model's
`work` (linear too: `work_weights`), greedy's tie-break: of programs predicted as fast, the one
moving less data (brainwave's GEMM 1024x700x512: 188,304 cycles predicted either way, one
loading its rows a band at a time and running 183,085, the other a row at a time, 226,200).

What the search leaves out, to stay finite and fast, keeps greedy's program feasible: an e-node
whose child is in its own strongly connected component of e-classes is kept only when that
child comes earlier in the order (greedy term size, e-class id), so no e-class ever contains
itself (cycles such as C = Comp(Id, C) are forbidden) and the context graph is acyclic; an
e-class with a program of zero cost only takes zero-cost programs; e-nodes whose lower bound
times multiplicity exceeds greedy's cost are dropped, and multiplicities beyond greedy's cost
over the cheapest node's cost keep zero-cost nodes only. HiGHS runs single-threaded with a
fixed seed and starts from the greedy program; the result is never dearer than greedy's
program counted the same way, which is never dearer than greedy's tree cost. "optimal" means
the program's full-key cost is within a cycle of the ILP's proven bound.
"""

from __future__ import annotations

import math
import operator
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import highspy
import networkx as nx
import numpy as np

from egraph_rules.ir import SCHEMA, Term
from egraph_rules.saturate import SaturatedGraph
from extraction.greedy import (Choice, Computation, CostModel, Extracted, ExtractionError, GraphView,
                               computations, fixpoint, greedy_best, work_of)

INF = math.inf
#: contexts beyond which no ILP is built (the greedy program is returned, and the status says why)
MAX_CONTEXTS = 50_000
#: seconds HiGHS may search by default
TIME_LIMIT = 10.0
#: the total tie-break cost of picked nodes, in cycles
TIE_BREAK = 0.25
#: relative MIP gap at which HiGHS stops (besides the absolute gap ABS_GAP)
REL_GAP = 1e-7
#: absolute MIP gap in cycles: with integral cycle costs, a program this close to the bound is optimal
ABS_GAP = 0.7
#: how many latest sources input keys keep, tried in turn (see the module docstring)
KEY_DEPTHS = (2, 3, 4)

Context = tuple[str, Any, float, int]


@dataclass
class IlpExtracted(Extracted):
    """The ILP's program, its cost (`dag_cost`: shared sub-terms paid once) and cycles, and how
    the search went."""

    #: "optimal"; "time limit" (the best program found when HiGHS, or building its model, was
    #: stopped by the limit, which covers both); "bound gap (...)":
    #: even the longest input keys merged uses the program keeps apart; "context limit (...)": the
    #: model was too large to build (the best program so far, at first greedy's)
    status: str
    #: (cycles - the lower bound the ILP proved) / cycles; 0 when optimal, 1 when no ILP was solved
    gap: float
    #: wall-clock seconds, greedy extraction and every ILP attempt included
    seconds: float
    #: contexts of the last ILP built
    contexts: int
    #: greedy's program with its tree cost
    greedy: Extracted
    #: greedy's program costed as this one is (shared sub-terms paid once)
    greedy_dag_cycles: float


def _child_context(op: str, i: int, sort: str, key: tuple, m: float, scale: float, tag: Any,
                   depth: int | None) -> tuple[tuple, float]:
    """The input key and multiplicity at which the i-th F/E child (of sort `sort`) of an e-node
    used at (key, m) is used; `tag` names where its input comes from (see `_tag`); keys keep
    their `depth` latest tags (all with None)."""
    m2 = 0.0 if scale == 0 else m * scale
    if m2 == 0 or sort == "E":
        return (), m2
    if op == "Fork" or (op == "Comp" and i == 1):
        return key, m2
    return ((tag,) + key)[:depth], m2


def _buffers(model: CostModel, op: str, outer: int) -> int:
    """The buffers the loads of an e-node's children get: its own when it is a loop, else those
    of the loop around it."""
    own = model.buffers(op)
    return outer if own is None else own


def _tag(op: str, i: int, kids: tuple, parent: Any) -> Any:
    """What the i-th child's input is made by: the first stage for a composition's second stage,
    the value for an App's function, the e-node itself for a loop body."""
    return kids[1] if op in ("Comp", "App") and i == 0 else ("in", parent)


def _kid_sorts(op: str) -> list[str]:
    return [s for s in SCHEMA[op][1] if s in ("F", "E")]


def dag_cost(term: Term, model: CostModel) -> tuple[float, ...]:
    """The cost of a program term with every sub-term applied twice to the same value (the same
    sub-term, the same input as code generation sees it, the same multiplicity) paid once;
    all-INF when the target cannot run some part of it."""
    ids: dict[str, int] = {}
    seen: set[tuple[int, tuple, float, int]] = set()
    total: list[float] | None = None
    stack: list[tuple[Term, tuple, float, int]] = [(term, (), 1.0, 1)]
    while stack:
        t, key, m, buffers = stack.pop()
        ident = ids.setdefault(t.sexpr, len(ids))
        if (ident, key, m, buffers) in seen:
            continue
        seen.add((ident, key, m, buffers))
        sorts = SCHEMA[t.op][1]
        args = tuple(None if s in ("F", "E") else a for s, a in zip(sorts, t.args))
        kids = tuple(a for s, a in zip(sorts, t.args) if s in ("F", "E"))
        local = model.local(t.op, args)
        if INF in local:
            return (INF,) * len(local)
        part = model.counted(local, m, buffers)
        total = list(part) if total is None else [a + x for a, x in zip(total, part)]
        kid_ids = tuple(ids.setdefault(k.sexpr, len(ids)) for k in kids)
        inner = _buffers(model, t.op, buffers)
        for i, (kid, scale) in enumerate(zip(kids, model.scales(t.op, args, len(kids)))):
            tag = _tag(t.op, i, kid_ids, ident)
            stack.append((kid, *_child_context(t.op, i, kid.sort, key, m, scale, tag, None), inner))
    return tuple(total or ())


def _probes(n: int) -> tuple[list[tuple[float, ...]], list[tuple[float, ...]]]:
    """The unit vectors of n cost components, and vectors to check a form read off them on."""
    units = [tuple(1.0 if j == i else 0.0 for j in range(n)) for i in range(n)]
    return units, [tuple(float(j + 1) for j in range(n)), tuple(float(n - j) for j in range(n)), (1.0,) * n]


def work_weights(model: CostModel, n: int) -> tuple[float, ...]:
    """ww_u such that the model's `work` (its tie-break between costs of equal cycles; 0 for a
    model without one) is Σ_u ww_u c_u, the form the ILP's second objective needs; an
    ExtractionError when it is not linear on probe vectors."""
    work = work_of(model)
    units, probes = _probes(n)
    ww = tuple(float(work(u)) for u in units)
    for p in probes:
        if not math.isclose(work(p), sum(a * b for a, b in zip(ww, p)), rel_tol=1e-9, abs_tol=1e-9):
            raise ExtractionError("the ILP extractor needs the cost model's work to be linear in its cost "
                                  "components; this model's is not")
    return ww


def unit_weights(model: CostModel, n: int) -> tuple[float, ...]:
    """w_u such that model.scalar(c) = max_u w_u c_u for every cost c counted in a context (the
    objective sums those), the form the ILP's objective needs; an ExtractionError when the
    model's scalar is not of that form on probe vectors."""
    units, probes = _probes(n)
    w = tuple(float(model.scalar(u)) for u in units)
    for p in (model.counted(p, 1.0, 1) for p in probes):
        if not math.isclose(model.scalar(p), max(a * b for a, b in zip(w, p)), rel_tol=1e-9):
            raise ExtractionError("the ILP extractor needs the cost model's scalar to be a weighted max over "
                                  "its cost components; this model's is not")
    return w


class _Model:
    """The e-nodes a program may pick with their costs and lower bounds (built once), the
    contexts reachable from the root at an input key depth and the e-nodes each may pick
    (`enumerate_contexts`, once per depth tried), and the ILP over them."""

    def __init__(self, graph: SaturatedGraph, root: str, model: CostModel, view: GraphView,
                 greedy: dict[str, Choice], bound: float):
        self.model, self.view = model, view
        self.local: dict[str, tuple[float, ...]] = {}
        #: what each use of an e-node after the first costs (a load's cold start is paid once)
        self.repeat: dict[str, tuple[float, ...]] = {}
        self.scales: dict[str, tuple[float, ...]] = {}
        self.by_class: dict[str, list[Computation]] = {}
        #: what each e-node itself costs at its first use, whatever loop it is in (per component,
        #: the least over the buffer counts loops give; `counted` prices each context exactly)
        self.first: dict[str, tuple[float, ...]] = {}
        buffers = sorted({b for op in SCHEMA if (b := model.buffers(op)) is not None} | {1})
        for c in computations(graph, view, model):
            local = model.local(c.op, c.args)
            if INF in local or c.eclass in c.kids:
                continue
            self.local[c.nid] = local
            once = [model.counted(local, 1.0, b) for b in buffers]
            twice = [model.counted(local, 2.0, b) for b in buffers]
            self.first[c.nid] = tuple(min(xs) for xs in zip(*once))
            self.repeat[c.nid] = tuple(min(t - o for t, o in zip(ts, os)) for ts, os in zip(zip(*twice), zip(*once)))
            self.scales[c.nid] = model.scales(c.op, c.args, len(c.kids))
            self.by_class.setdefault(c.eclass, []).append(c)
        self._keep_order(greedy)
        self.lower, self.free = self._lower_bounds()
        self.bound = bound * (1 + 1e-9)
        positive = [model.scalar(v) for v in self.repeat.values() if model.scalar(v) > 0]
        self.cap = self.bound / min(positive) if positive else INF
        self.root: Context = (root, (), 1.0, 1)
        #: (context, e-node, child contexts) for every e-node a context may pick (`enumerate_contexts`)
        self.options: list[tuple[Context, Computation, tuple[Context, ...]]] = []

    def _keep_order(self, greedy: dict[str, Choice]) -> None:
        """Keep only the e-nodes whose children inside their own strongly connected component of
        e-classes come earlier in the order (greedy term size, e-class id): no program can then
        hold an e-class inside itself, and every greedy e-node stays."""
        edges = nx.DiGraph()
        edges.add_edges_from((c.eclass, k) for cs in self.by_class.values() for c in cs for k in c.kids)
        scc = {cls: i for i, comp in enumerate(nx.strongly_connected_components(edges)) for cls in comp}

        def rank(cls: str) -> tuple[float, str]:
            return (greedy[cls].size if cls in greedy else INF, cls)

        for cls, cs in self.by_class.items():
            cs[:] = [c for c in cs if all(scc[k] != scc[cls] or rank(k) < rank(cls) for k in c.kids)]

    def _lower_bounds(self) -> tuple[dict[str, tuple[tuple[float, ...], tuple[float, ...]]], set[str]]:
        """Lower bounds of the cost vector of any program rooted at each e-node, sharing counted:
        of its first use and of each use after it (a use at multiplicity m >= 1 costs at least the
        first plus m - 1 times the other; see `_low`); and the e-classes that have a program of
        no cost. Per component: a composition's stages see different inputs and add up, a Fork's
        branches may share (the larger counts), a loop scales its body; an e-class takes the
        least of its e-nodes in each component."""
        best: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {}
        low: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {}

        def improve(c: Computation) -> bool:
            first, again = self.first[c.nid], self.repeat[c.nid]
            parts = [(tuple(f + (s - 1) * r for f, r in zip(*best[k])), tuple(s * r for r in best[k][1]))
                     for k, s in zip(c.kids, self.scales[c.nid]) if s]
            if c.op == "Fork" and parts:
                parts = [tuple(tuple(map(max, *side)) for side in zip(*parts))]
            for pf, pr in parts:
                first, again = tuple(map(operator.add, first, pf)), tuple(map(operator.add, again, pr))
            low[c.nid] = (first, again)
            old = best.get(c.eclass)
            new = low[c.nid] if old is None else (tuple(map(min, old[0], first)), tuple(map(min, old[1], again)))
            if new == old:
                return False
            best[c.eclass] = new
            return True

        fixpoint([c for cs in self.by_class.values() for c in cs], improve)
        return low, {cls for cls, (f, r) in best.items() if self.model.scalar(f) == 0 and self.model.scalar(r) == 0}

    def _low(self, nid: str, m: float) -> float:
        """A lower bound of the cycles of e-node nid's programs used at multiplicity m."""
        first, again = self.lower[nid]
        if m == 0:
            return 0.0
        if m == INF:
            return 0.0 if self.model.scalar(first) == 0 and self.model.scalar(again) == 0 else INF
        return self.model.scalar(tuple(f + (m - 1) * r for f, r in zip(first, again)))

    def _usable(self, c: Computation, m: float) -> bool:
        """Whether e-node c can be part of a program no dearer than the bound at multiplicity m."""
        return c.nid in self.lower and self._low(c.nid, m) <= self.bound

    def enumerate_contexts(self, depth: int, max_contexts: int, deadline: float) -> str:
        """The options with input keys of `depth`, breadth-first from the root; why it stopped
        early: more than max_contexts contexts, or the deadline (a `time.perf_counter()` time)
        passed ("" when it did not)."""
        self.options = []
        seen = {self.root}
        queue = deque([self.root])
        while queue:
            ctx = queue.popleft()
            cls, key, m, buffers = ctx
            for c in self.by_class.get(cls, []):
                if not self._usable(c, m):
                    continue
                kids = []
                inner = _buffers(self.model, c.op, buffers)
                for i, (kid, sort, scale) in enumerate(zip(c.kids, _kid_sorts(c.op), self.scales[c.nid])):
                    k2, m2 = _child_context(c.op, i, sort, key, m, scale, _tag(c.op, i, c.kids, c.eclass), depth)
                    if m2 > self.cap or (m2 and kid in self.free):
                        k2, m2 = (), INF
                    kids.append((kid, k2, m2, inner))
                    if kids[-1] not in seen:
                        seen.add(kids[-1])
                        queue.append(kids[-1])
                self.options.append((ctx, c, tuple(kids)))
            if len(seen) > max_contexts:
                return f"context limit (more than {max_contexts} contexts with input keys of depth {depth})"
            if time.perf_counter() > deadline:
                return "time limit"
        return ""

    def prune(self) -> set[Context]:
        """Drop options with a child context that can pick nothing, to a fixpoint, and those not
        reachable from the root; the contexts left."""
        live = self.options
        while True:
            has = {ctx for ctx, _, _ in live}
            kept = [o for o in live if all(k in has for k in o[2])]
            if len(kept) == len(live):
                break
            live = kept
        by_ctx: dict[Context, list[int]] = {}
        for j, (ctx, _, _) in enumerate(live):
            by_ctx.setdefault(ctx, []).append(j)
        reach, stack = set(), [self.root] if self.root in by_ctx else []
        while stack:
            ctx = stack.pop()
            if ctx in reach:
                continue
            reach.add(ctx)
            stack += [k for j in by_ctx[ctx] for k in live[j][2]]
        self.options = [o for o in live if o[0] in reach]
        return reach

    def context_rows(self) -> dict[Context, list[int]]:
        """The options of each context."""
        ctx_rows: dict[Context, list[int]] = {}
        for j, (ctx, _, _) in enumerate(self.options):
            ctx_rows.setdefault(ctx, []).append(j)
        return ctx_rows

    def solve(self, weights: tuple[float, ...], start: list[int], deadline: float,
              work: tuple[float, ...] | None = None, cycles: float = INF) -> tuple[list[int], bool, float]:
        """Build and run the ILP, warm-started from the options `start` (a program), HiGHS
        stopping at `deadline` (a `time.perf_counter()` time: building the ILP counts against the
        time limit too): the options picked (none when HiGHS found no program in time), whether
        HiGHS proved its optimum, and the lower bound it proved for its objective. The objective
        is the cycles; given `work` weights, it is the work of programs of at most `cycles`."""
        opts = self.options
        ctx_rows = self.context_rows()
        counted = {j: self.counted(j) for j, (ctx, _, _) in enumerate(opts) if ctx[2] != INF}
        nx_ = z = len(opts)
        ncol = nx_ + 1
        lower = np.zeros(ncol)
        upper = np.ones(ncol)
        upper[z] = highspy.kHighsInf if work is None else cycles * (1 + 1e-9)
        cost = np.zeros(ncol)
        cost[:nx_] = TIE_BREAK / max(nx_, 1)
        if work is None:
            cost[z] = 1.0
        else:
            for j, v in counted.items():
                cost[j] += sum(a * b for a, b in zip(work, v))
        rows: list[tuple[float, float, list[int], list[float]]] = []
        for ctx, js in ctx_rows.items():
            rows.append((1.0 if ctx == self.root else -highspy.kHighsInf, 1.0, js, [1.0] * len(js)))
            bounds = [(j, self._low(opts[j][1].nid, ctx[2])) for j in js if ctx[2] not in (0, INF)]
            if any(v for _, v in bounds):  # whatever it picks here, the program costs at least that
                rows.append((-highspy.kHighsInf, 0.0, [j for j, _ in bounds] + [z], [v for _, v in bounds] + [-1.0]))
        for j, (_, _, kids) in enumerate(opts):
            for k in dict.fromkeys(kids):
                rows.append((-highspy.kHighsInf, 0.0, [j, *ctx_rows[k]], [1.0] + [-1.0] * len(ctx_rows[k])))
        for ui, w in enumerate(weights):
            coef = [(j, w * v[ui]) for j, v in counted.items() if w * v[ui] != 0]
            if coef:
                rows.append((-highspy.kHighsInf, 0.0, [j for j, _ in coef] + [z], [v for _, v in coef] + [-1.0]))
        h = highspy.Highs()
        for name, value in (("output_flag", False), ("threads", 1), ("random_seed", 0),
                            ("mip_rel_gap", REL_GAP), ("mip_abs_gap", ABS_GAP)):
            h.setOptionValue(name, value)
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = ncol, len(rows)
        lp.col_cost_, lp.col_lower_, lp.col_upper_ = cost, lower, upper
        lp.row_lower_ = np.array([r[0] for r in rows])
        lp.row_upper_ = np.array([r[1] for r in rows])
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.start_ = np.cumsum([0] + [len(r[2]) for r in rows])
        lp.a_matrix_.index_ = np.array([i for r in rows for i in r[2]], dtype=np.int32)
        lp.a_matrix_.value_ = np.array([v for r in rows for v in r[3]])
        lp.integrality_ = [highspy.HighsVarType.kInteger] * nx_ + [highspy.HighsVarType.kContinuous]
        h.passModel(lp)
        h.setSolution(self._solution(start, weights))
        h.setOptionValue("time_limit", max(deadline - time.perf_counter(), 0.0))
        h.run()
        status, info = h.getModelStatus(), h.getInfo()
        if status not in (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kTimeLimit):
            raise ExtractionError(f"HiGHS stopped with status {h.modelStatusToString(status)}")
        bound = max(0.0, float(info.mip_dual_bound) - TIE_BREAK)
        if info.primal_solution_status != 2:  # no feasible solution in time
            return [], False, bound
        x = h.getSolution().col_value
        return [j for j in range(nx_) if x[j] > 0.5], status == highspy.HighsModelStatus.kOptimal, bound

    def picks(self, choice: dict[str, Choice]) -> list[int]:
        """The options that spell the program of a choice per e-class (greedy's)."""
        ctx_rows = self.context_rows()
        picked, stack, seen = [], [self.root], set()
        while stack:
            ctx = stack.pop()
            if ctx in seen:
                continue
            seen.add(ctx)
            j = next(j for j in ctx_rows[ctx] if self.options[j][1].nid == choice[ctx[0]].nid)
            picked.append(j)
            stack += self.options[j][2]
        return picked

    def _solution(self, picked: list[int], weights: tuple[float, ...]) -> highspy.HighsSolution:
        """The program of the picked options as a solution of the ILP."""
        val = np.zeros(len(self.options) + 1)
        val[picked] = 1.0
        totals = np.zeros(len(weights))
        for j in np.flatnonzero(val[:-1]):
            if self.options[j][0][2] != INF:
                totals += np.array(self.counted(j))
        val[-1] = max(w * v for w, v in zip(weights, totals))
        sol = highspy.HighsSolution()
        sol.col_value = list(val)
        sol.value_valid = True
        return sol

    def counted(self, j: int) -> tuple[float, ...]:
        """What option j's e-node itself costs at its context's multiplicity."""
        ctx, c, _ = self.options[j]
        return self.model.counted(self.local[c.nid], ctx[2], ctx[3])

    def term(self, picked: list[int]) -> Term:
        """The program the picked options spell, from the root (where a context picked more
        than one e-node, the first)."""
        choice: dict[Context, int] = {}
        for j in picked:
            choice.setdefault(self.options[j][0], j)

        def build(ctx: Context) -> Term:
            _, c, kids = self.options[choice[ctx]]
            return self.view.term(c.nid, [build(k) for k in kids])

        return build(self.root)


def extract_ilp(graph: SaturatedGraph, root: str, model: CostModel, time_limit: float = TIME_LIMIT,
                max_contexts: int = MAX_CONTEXTS) -> IlpExtracted:
    """The program of the root e-class (a class id) cheapest with shared sub-terms paid once,
    by ILP under a time limit in seconds (for all attempts together), warm-started from the
    greedy program. Input keys get longer (KEY_DEPTHS) while the program found costs more than
    the ILP counted; beyond max_contexts contexts the best program so far (at first, greedy's)
    is returned with the reason as its status."""
    t0 = time.perf_counter()
    view = GraphView(graph)
    best, greedy = greedy_best(graph, root, model, view)
    greedy_dag = dag_cost(greedy.term, model)
    weights, work = unit_weights(model, len(greedy_dag)), work_weights(model, len(greedy_dag))
    term, cost, status, gap, contexts = greedy.term, greedy_dag, "", 0.0, 0
    ilp = _Model(graph, root, model, view, best, model.scalar(greedy_dag))
    for depth in KEY_DEPTHS:
        stopped = ilp.enumerate_contexts(depth, max_contexts, t0 + time_limit)
        if stopped:  # the bound of an earlier attempt holds; before any, only 0 is proven
            status, gap = stopped, gap if status else 1.0
            break
        contexts = len(ilp.prune())
        start = ilp.picks(best)
        picked, proved, bound = ilp.solve(weights, start, t0 + time_limit)
        found = ilp.term(picked) if picked else greedy.term
        found_cost = dag_cost(found, model)
        if model.scalar(found_cost) < model.scalar(cost):
            term, cost = found, found_cost
        cycles = model.scalar(cost)
        gap = max(cycles - bound, 0.0) / cycles if cycles > 0 else 0.0
        if not proved:
            status = "time limit"
            break
        if cycles - bound <= max(ABS_GAP + TIE_BREAK, REL_GAP * cycles):
            status, gap = "optimal", 0.0
            if any(work):  # warm-started from a program that fast: greedy's if kept, else this depth's optimum
                within = start if term == greedy.term else picked
                term, cost = _least_work(ilp, model, weights, work, within, term, cost, t0 + time_limit)
            break
        status = f"bound gap (input keys of depth {depth} merge uses the program keeps apart)"
    return IlpExtracted(term, cost, model.scalar(cost), status, gap, time.perf_counter() - t0, contexts, greedy,
                        model.scalar(greedy_dag))


def _least_work(ilp: _Model, model: CostModel, weights: tuple[float, ...], work: tuple[float, ...], start: list[int],
                term: Term, cost: tuple[float, ...], deadline: float) -> tuple[Term, tuple[float, ...]]:
    """Of the programs no slower than `term` (`start`: the options of one of them), the one of
    least work (greedy's tie-break), found by the second ILP within the deadline; `term` itself
    when that finds none with less work and as few cycles counted with full keys."""
    picked, _, _ = ilp.solve(weights, start, deadline, work, model.scalar(cost))
    if not picked:
        return term, cost
    found = ilp.term(picked)
    found_cost = dag_cost(found, model)
    score = work_of(model)
    if model.scalar(found_cost) <= model.scalar(cost) and score(found_cost) < score(cost):
        return found, found_cost
    return term, cost
