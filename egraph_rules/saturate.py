"""The saturation driver: one e-graph, all rule levels together, under node, iteration and time
budgets that egglog itself does not enforce; reports why it stopped."""

from __future__ import annotations

import gc
import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache, cached_property
from operator import itemgetter

from egglog import bindings

from egraph_rules.ir import SCHEMA, Term, arg_sexpr, egglog_declarations, primitive_value
from egraph_rules.rules import LEVELS, Rule, analysis_program, rulesets_program


@dataclass(frozen=True)
class Budget:
    """Limits on one saturation: e-nodes, iterations, seconds. Saturation stops once the e-graph
    has more than `nodes` e-nodes, and a step that would leave it with more than `undo_past`
    times that is undone: such a step is an explosion of composition and fusion rules (29 k to
    410 k e-nodes in the systolic GEMM 1760x16x1760's last step) and found no faster program on
    any suite layer, while a step that ends just past the limit may (the cpu GEMM
    4096x128x4096's, 20 k to 56 k: 1.6x faster)."""

    nodes: int = 50_000
    iterations: int = 40
    seconds: float = 10.0
    undo_past: float = 2.0


@dataclass
class SaturationStats:
    """What a saturation did and why it stopped. E-classes are counted when the e-graph is
    serialized (None before); e-nodes are recounted then, without primitives, and
    `serialize_seconds` is how long the serialized e-graph took to build, with its index of
    e-node uses (`SaturatedGraph.functions`)."""

    enodes: int
    eclasses: int | None
    iterations: int
    saturated: bool
    stop_reason: str
    seconds: float
    matches_per_rule: dict[str, int] = field(default_factory=dict)
    serialize_seconds: float = 0.0

    def as_dict(self) -> dict:
        return {
            "enodes": self.enodes,
            "eclasses": self.eclasses,
            "iterations": self.iterations,
            "saturated": self.saturated,
            "stop_reason": self.stop_reason,
            "seconds": round(self.seconds, 4),
            "serialize_seconds": round(self.serialize_seconds, 4),
        }


class EGraphError(RuntimeError):
    """egglog rejected a program or found an inconsistency (a rule bug)."""


@dataclass
class SaturatedGraph:
    """The serialized e-graph after saturation: e-nodes of the IR sorts only (children given as
    e-class ids), with the root e-class of every named term."""

    nodes: dict[str, dict]
    classes: dict[str, list[str]]
    roots: dict[str, str]
    stats: SaturationStats
    #: where each function e-class leaves its value: the on-chip memories (the `inspace` analysis)
    #: and the e-class of its output type (`fout`), so extraction can check capacities
    spaces: dict[str, tuple[str, ...]] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    #: the e-nodes of sort F or E with their F/E children and uses: what every extraction from
    #: this e-graph walks (each stage, pin budget, alternative), indexed once with it
    functions: Functions = field(init=False, repr=False)

    def __post_init__(self) -> None:
        ids: list[str] = []
        ops: list[str] = []
        kids: list[tuple[str, ...]] = []
        classes: list[str] = []
        for nid in sorted(self.nodes):
            node = self.nodes[nid]
            pick = kids_of(node["op"])
            if pick is not None:
                ids.append(nid)
                ops.append(node["op"])
                kids.append(pick(node["children"]))
                classes.append(node["eclass"])
        self.functions = Functions(ids, ops, kids, classes, uses_of(kids))

    @cached_property
    def _index(self) -> dict[tuple[str, tuple[str, ...]], str]:
        """The e-class of each e-node, keyed by its operator and its children's e-classes."""
        return {(_key(nid, n["op"]), tuple(n["children"])): n["eclass"] for nid, n in self.nodes.items()}

    def class_of(self, term: Term) -> str:
        """The e-class holding a term (an EGraphError when the e-graph does not hold it)."""
        return _class_of(term, self._index)


@cache
def child_sorts(op: str) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    """Where an operator's F/E children are among its arguments, and for each argument whether it is one."""
    is_kid = tuple(s in ("F", "E") for s in SCHEMA[op][1])
    return tuple(i for i, k in enumerate(is_kid) if k), is_kid


@cache
def kids_of(op: str) -> Callable[[list[str]], tuple[str, ...]] | None:
    """What picks an e-node's F/E children out of its children (None: op is no F/E operator)."""
    schema = SCHEMA.get(op)
    if schema is None or schema[0] == "Ty":
        return None
    kid_at = child_sorts(op)[0]
    if len(kid_at) == 1:
        return lambda children: (children[kid_at[0]],)
    return itemgetter(*kid_at) if kid_at else lambda children: ()


@dataclass(frozen=True)
class Uses:
    """For a list of e-nodes: the positions of the e-nodes using each e-class as an F/E child,
    and how many distinct e-classes each e-node's F/E children are (what a bottom-up fixpoint
    waits for before it visits an e-node)."""

    users: dict[str, list[int]]
    distinct: list[int]


def uses_of(kids: list[tuple[str, ...]]) -> Uses:
    """The uses of e-nodes given by their F/E children's e-classes."""
    users: defaultdict[str, list[int]] = defaultdict(list)
    distinct: list[int] = []
    for n, ks in enumerate(kids):
        if len(ks) == 2 and ks[0] != ks[1]:
            users[ks[0]].append(n)
            users[ks[1]].append(n)
            distinct.append(2)
        else:
            ds = set(ks) if len(ks) > 1 else ks
            distinct.append(len(ds))
            for k in ds:
                users[k].append(n)
    return Uses(dict(users), distinct)


@dataclass(frozen=True)
class Functions:
    """The e-nodes of sort F or E of an e-graph in node-id order: their ids, operators, F/E
    children's e-classes, their own e-classes, and their uses."""

    ids: list[str]
    ops: list[str]
    kids: list[tuple[str, ...]]
    classes: list[str]
    uses: Uses


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cycle collector off for a block: serializing and extracting an e-graph allocate
    a record or two per e-node, none in a cycle, and the collections those allocations set off
    scanned the whole e-graph again and again (half of greedy extraction's time on AlexNet
    conv2's 91 k e-nodes; half of serializing the systolic GEMM 1760x128x1760's 410 k)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _ir_size(sizes: list[tuple[str, int]]) -> int:
    return sum(n for name, n in sizes if name in SCHEMA)


#: whether this egglog can plan rule queries without tree decompositions (egglog 14 can; 13.2
#: has one planner)
PLANNER_SWITCH = "no_decomp" in (bindings.EGraph.__text_signature__ or "")


def new_egraph(tree_plans: bool = False) -> bindings.EGraph:
    """An empty egglog e-graph. egglog 14 plans each rule's query with a tree decomposition
    unless told not to; here that planning cost more than it saved on every layer measured, and
    without it saturation reaches the same e-graph 1.4-14x sooner (2.2x geometric mean over 40
    layer x target pairs, `benchmarks/egglog_plans.py`), so it is off unless `tree_plans`."""
    return bindings.EGraph(no_decomp=not tree_plans) if PLANNER_SWITCH else bindings.EGraph()


#: a saturation keeps its first snapshot once the e-graph has 1/16 of the node limit (3,125
#: e-nodes by default): an egglog push took 10-25 ms at 8-11 k e-nodes, and one at every
#: doubling from the first step made saturating layers of 5-8 k e-nodes 5-11% slower (egglog
#: 14); every step in the suite that passed the node limit started from 13 k e-nodes or more
SNAPSHOT_FROM = 16
#: and another before a step once the steps since the last took this long, so that undoing a
#: step past the node limit replays at most that much: Snowflake's Conv2d(16, 32, 1) + ReLU on
#: 4x4 replayed a 3 s step (9.2 s to compile, 5.7 s with this; a push at 11 k e-nodes: 58 ms)
REPLAY_SECONDS = 0.5


class Saturator:
    """Builds an e-graph from named terms and a rule list, and saturates it (`tree_plans`: with
    egglog 14's tree-decomposed query plans, see `new_egraph`)."""

    def __init__(self, rules: list[Rule], tree_plans: bool = False):
        self.egraph = new_egraph(tree_plans)
        #: the egglog commands added so far: a command several rules share (the analysis marks
        #: that their queries walk, `REDUCE_TAILS`) is added once, not run once per rule
        self.added: set[str] = set()
        #: egglog push levels this saturator holds: one per rule extension, and the e-graphs its
        #: runs kept to go back to before a step past the node limit (`run`)
        self.snapshots = 0
        self._run("\n".join([egglog_declarations(), analysis_program(), rulesets_program()]))
        self._add_rules(rules)
        self._run(f"(unstable-combined-ruleset liftsat {' '.join(LEVELS)})")

    def _run(self, program: str) -> list:
        try:
            return self.egraph.run_program(*self.egraph.parse_program(program))
        except bindings.EggSmolError as exc:
            raise EGraphError(f"egglog: {exc}") from None

    def _add_rules(self, rules: list[Rule]) -> None:
        """One program per command: egglog 13.2 copies a program's whole text into every command
        it runs, so the rules as one program took 15x longer to load (1.7 s against 0.12 s, busy
        machine), and a program per rule, once lstmcell-hidden-blocks had up to eight variants,
        0.24-0.36 s per target where a program per command takes 0.16-0.18 s."""
        for r in rules:
            for command in r.commands(self.added):
                self._run(command)
            self.added.update(r.egglog)

    @contextmanager
    def extended(self, rules: list[Rule]) -> Iterator[None]:
        """Inside, the e-graph and rule set are a copy with these rules added; on exit both are
        as they were (egglog push/pop), so each target can grow its own programs from one shared
        e-graph without mixing in another target's."""
        depth = self.snapshots
        self._snapshot()
        added = set(self.added)
        try:
            self._add_rules(rules)
            yield
        finally:
            for _ in range(self.snapshots - depth):
                self._run("(pop)")
            self.snapshots = depth
            self.added = added

    def add(self, name: str, term: Term) -> None:
        """Add a term under a global name (its e-class is a root)."""
        self._run(f"(let ${name} {term.sexpr})")

    def size(self) -> int:
        """IR e-nodes now in the e-graph (analysis tables excluded)."""
        out = self._run("(print-size)")
        return _ir_size(out[0].sizes)

    def run(self, budget: Budget, after: SaturationStats | None = None) -> SaturationStats:
        """Saturate all levels together: analyses to a fixpoint, then one step of every rule,
        until nothing changes or a budget runs out (checked before every step). A step that
        takes the e-graph past `Budget.undo_past` times the node limit is undone. (egglog cannot
        drop a snapshot, so one is kept once the e-graph has 1/`SNAPSHOT_FROM` of the node limit
        and whenever it has doubled since the last, or the steps since the last took
        `REPLAY_SECONDS`; undoing goes back to the last and replays
        the steps since, which rebuilds the same e-graph: saturation is deterministic. A step
        taken before the first snapshot is kept whatever it grows to.) `after`: an earlier
        saturation of this e-graph with other rules: it has spent part of the time budget (the
        node and iteration limits apply to each saturation), and the figures returned cover
        both."""
        start = time.perf_counter()
        spent_iterations, spent_seconds = (after.iterations, after.seconds) if after else (0, 0.0)
        matches: Counter[str] = Counter(after.matches_per_rule if after else {})
        iterations, saturated, reason = 0, False, ""
        self._run("(run-schedule (saturate (run analysis)))")
        kept = 0  # the e-graph's size at the last snapshot (0: none yet)
        since, since_seconds = 0, 0.0  # steps since it, and their seconds
        while True:
            size = self.size()
            if size > budget.nodes:
                reason = f"node limit ({size} > {budget.nodes})"
                break
            if iterations >= budget.iterations:
                reason = f"iteration limit ({budget.iterations})"
                break
            if spent_seconds + time.perf_counter() - start > budget.seconds:
                reason = f"time limit ({budget.seconds} s)"
                break
            if size >= max(2 * kept, budget.nodes // SNAPSHOT_FROM) or (kept > 0 and since_seconds >= REPLAY_SECONDS):
                self._snapshot()
                kept, since, since_seconds = size, 0, 0.0
            step_start = time.perf_counter()
            report = self._step()
            since_seconds += time.perf_counter() - step_start
            grown = self.size()
            if kept and grown > budget.undo_past * budget.nodes:
                self._replay(since)
                reason = (f"node limit (the next step grew {size} e-nodes to {grown} > {budget.undo_past:g} x "
                          f"{budget.nodes}; undone)")
                break
            iterations += 1
            since += 1
            for name, n in report.num_matches_per_rule.items():
                if "#" in name:
                    matches[name.split("#")[0]] += n
            if not report.updated:
                saturated, reason = True, "saturated"
                break
        return SaturationStats(self.size(), None, spent_iterations + iterations, saturated, reason,
                               spent_seconds + time.perf_counter() - start, dict(matches))

    def _snapshot(self) -> None:
        """Push the e-graph and rule set on egglog's stack, counted in `snapshots`."""
        self._run("(push)")
        self.snapshots += 1

    def _step(self) -> bindings.RunReport:
        """One step of every rule, then the analyses to a fixpoint; egglog's report of the step."""
        return self._run("(run-schedule (run liftsat) (saturate (run analysis)))")[0].report

    def _replay(self, steps: int) -> None:
        """Back to the last snapshot (kept on the stack), then the `steps` steps after it again:
        saturation is deterministic, so this is the e-graph they built."""
        self._run("(pop)")
        self._run("(push)")
        for _ in range(steps):
            self._step()

    def serialize(self, roots: dict[str, Term], stats: SaturationStats) -> SaturatedGraph:
        """The e-graph as plain data for extraction (IR sorts and their primitives only), its
        F/E e-nodes indexed (`SaturatedGraph.functions`); the seconds it took go in the stats."""
        start = time.perf_counter()
        with gc_paused():
            graph = self._serialized(roots, stats)
        stats.serialize_seconds = time.perf_counter() - start
        return graph

    def _serialized(self, roots: dict[str, Term], stats: SaturationStats) -> SaturatedGraph:
        data = json.loads(self.egraph.serialize([]).to_json())
        class_of = {nid: n["eclass"] for nid, n in data["nodes"].items()}
        nodes = {
            nid: {"op": n["op"], "eclass": n["eclass"], "children": [class_of[c] for c in n["children"]]}
            for nid, n in data["nodes"].items()
            if n["op"] in SCHEMA or nid.startswith("primitive")
        }
        classes: dict[str, list[str]] = {}
        for nid, node in nodes.items():
            classes.setdefault(node["eclass"], []).append(nid)
        _check_types(nodes, classes)
        stats.eclasses = sum(1 for ids in classes.values() if not ids[0].startswith("primitive"))
        stats.enodes = sum(1 for nid in nodes if not nid.startswith("primitive"))
        spaces: dict[str, set[str]] = {}
        outputs = {}
        for n in data["nodes"].values():
            if n["op"] == "inspace":
                f, space = n["children"]
                spaces.setdefault(class_of[f], set()).add(primitive_value(data["nodes"][space]["op"]))
            elif n["op"] == "fout":
                outputs[class_of[n["children"][0]]] = n["eclass"]
        graph = SaturatedGraph(nodes, classes, {}, stats, {c: tuple(sorted(s)) for c, s in spaces.items()}, outputs)
        graph.roots.update({name: graph.class_of(term) for name, term in roots.items()})
        return graph


def _key(nid: str, op: str) -> str:
    """An e-node's operator, a primitive's in Python's syntax (egglog prints 1e+20 as 1e20)."""
    return arg_sexpr(primitive_value(op)) if nid.startswith("primitive") else op


def _class_of(term: Term, index: dict[tuple[str, tuple[str, ...]], str]) -> str:
    kids = tuple(_class_of(a, index) if isinstance(a, Term) else index[(arg_sexpr(a), ())] for a in term.args)
    try:
        return index[(term.op, kids)]
    except KeyError:
        raise EGraphError(f"term {term.op} not found in the serialized e-graph") from None


def _check_types(nodes: dict[str, dict], classes: dict[str, list[str]]) -> None:
    """Every Ty e-class holds one type; two means a rule equated values of different types."""
    for cls, ids in classes.items():
        tys = [nodes[i] for i in ids if nodes[i]["op"] in ("TS", "TA", "TP")]
        if len(tys) > 1:
            raise EGraphError(f"type conflict in e-class {cls}: a rule equated terms of different types")
