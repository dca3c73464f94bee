"""The Python API: optimize a layer stack for a target, end to end, and report what happened."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from egraph_rules.dsl_rules import blocks_only_when_asked
from egraph_rules.ir import Term
from egraph_rules.saturate import Budget, SaturatedGraph, Saturator, SaturationStats
from extraction.alternatives import k_cheapest
from extraction.greedy import Extracted, ExtractionError, extract_greedy
from extraction.ilp import TIME_LIMIT, IlpExtracted, dag_cost, extract_ilp
from extraction.pinning import PinnedData, over_budget, pinned_constants
from frontend.layers import LayerSpec, Model, build_model
from hwmodels.codegen import CapacityError, CodegenError, generate
from hwmodels.isa import Program
from hwmodels.simulator import SimResult, simulate
from hwmodels.target import Target
from liftsat.rulesets import memory_guards, shared_rules, target_rules
from liftsat.targets import get_target


class SimulationMismatch(RuntimeError):
    """Functional and timing-only simulation disagree on cycles (a simulator bug)."""


def roofline_cycles(model: Model, target: Target) -> float:
    """max(MACs / peak MACs per cycle, minimum DRAM bytes / bytes per cycle); weights that fit
    on chip count as resident when the target keeps weights (they are loaded at deployment)."""
    on_chip = sum(m.capacity for m in target.memories.values())
    resident = target.persistent_weights and model.weight_bytes <= on_chip
    min_bytes = model.io_bytes + (0 if resident else model.weight_bytes)
    return max(model.macs / target.peak_macs_per_cycle, min_bytes / target.dram.bandwidth)


def weight_residency(term: Term, weights: list[str]) -> dict[str, str]:
    """For each weight: 'pinned' when the program moves it on chip once, as constants (loaded
    at setup), 'streamed' when it is read from DRAM per inference, 'partly pinned' when some
    parts of it are pinned and the others streamed (a budget for pinned constants chose them)."""
    pinned: set[str] = set()
    streamed: set[str] = set()
    for node in term.walk():
        if node.op == "Const":
            moved = any(n.op == "ToChip" for n in node.args[0].walk())
            (pinned if moved else streamed).update(n.args[0] for n in node.args[0].walk() if n.op == "Var")
    return {w: ("partly pinned" if w in streamed else "pinned") if w in pinned else "streamed" for w in weights}


@dataclass
class Result:
    """Everything one optimization produced and measured."""

    target: str
    layers: list[str]
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    cycles: int
    setup_cycles: int
    predicted_cycles: float
    roofline_cycles: float
    efficiency: float
    max_abs_error: float
    max_rel_error: float
    egraph: SaturationStats
    extract_seconds: float
    instructions: int
    dynamic_instructions: int
    #: when the cost model has each unit done, and its chain (`predicted_units`): the largest is
    #: predicted_cycles
    predicted_units: dict[str, float]
    #: when each unit's last instruction had its result in the simulator (the latest is cycles),
    #: and how many cycles each unit was busy
    unit_done: dict[str, int]
    unit_busy: dict[str, int]
    ops: dict[str, int]
    weights: dict[str, str]
    term: Term
    program: Program
    output: np.ndarray | None = field(repr=False)
    reference: np.ndarray | None = field(repr=False)
    #: the next cheapest distinct programs (by predicted cycles), each generated, simulated, checked
    alternatives: list[Result] = field(default_factory=list, repr=False)
    #: alternatives the extractor found that codegen could not lay out, and why
    unbuildable: list[str] = field(default_factory=list)
    #: how extraction went: the extractor, and for the ILP its status, gap and greedy's cycles
    extraction: dict = field(default_factory=lambda: {"extractor": "greedy"})

    @property
    def listing(self) -> str:
        return self.program.listing()

    def as_dict(self) -> dict:
        """The JSON-ready summary."""
        return {
            "target": self.target,
            "layers": self.layers,
            "input_shape": list(self.input_shape),
            "output_shape": list(self.output_shape),
            "cycles": self.cycles,
            "setup_cycles": self.setup_cycles,
            "predicted_cycles": self.predicted_cycles,
            "roofline_cycles": round(self.roofline_cycles, 2),
            "efficiency": round(self.efficiency, 4),
            "max_abs_error": None if math.isnan(self.max_abs_error) else self.max_abs_error,
            "max_rel_error": None if math.isnan(self.max_rel_error) else self.max_rel_error,
            "egraph": self.egraph.as_dict(),
            "extract_seconds": round(self.extract_seconds, 4),
            "extraction": self.extraction,
            "instructions": self.instructions,
            "dynamic_instructions": self.dynamic_instructions,
            "units": self.units_dict(),
            "ops": self.ops,
            "weights": self.weights,
            **({"alternatives": [a.alternative_dict(self) for a in self.alternatives], "unbuildable": self.unbuildable}
               if self.alternatives or self.unbuildable else {}),
        }

    def units_dict(self) -> dict[str, dict[str, float | int]]:
        """Each unit (and the model's chain): when the cost model has it done, when it was done in
        the simulator (the dispatcher: its last issue), and its busy cycles there; what is not
        known is left out."""
        done = {**self.unit_done, "issue": self.dynamic_instructions}  # the dispatcher issues one a cycle
        out = {}
        for u in [*self.predicted_units, *(u for u in done if u not in self.predicted_units)]:
            row = {"predicted": self.predicted_units.get(u), "simulated": done.get(u), "busy": self.unit_busy.get(u)}
            out[u] = {k: v for k, v in row.items() if v is not None}
        return out

    def alternative_dict(self, best: Result) -> dict:
        """This program as an alternative to the best one: its cycles, and how its op histogram
        differs (op: count here minus count in the best; zero differences left out)."""
        ops = set(self.ops) | set(best.ops)
        return {
            "predicted_cycles": self.predicted_cycles,
            "cycles": self.cycles,
            "efficiency": round(self.efficiency, 4),
            "max_abs_error": None if math.isnan(self.max_abs_error) else self.max_abs_error,
            "ops": self.ops,
            "ops_vs_best": {op: self.ops.get(op, 0) - best.ops.get(op, 0) for op in sorted(ops)
                            if self.ops.get(op, 0) != best.ops.get(op, 0)},
        }


class NoProgramError(ExtractionError):
    """No program for the layer on the target; carries the saturation figures of the attempt."""

    def __init__(self, message: str, stats: SaturationStats):
        super().__init__(message)
        self.stats = stats


class SharedEGraph:
    """One e-graph for a program term, saturated once with the shared rules (the DSL lowering).
    Each target then grows its own programs from it (structural, tiling and hardware rules, on a
    copy that is dropped afterwards, so no program mixes two targets' memories) and extracts its
    cheapest one (`tree_plans`: see `Saturator`)."""

    def __init__(self, term: Term, budget: Budget | None = None, tree_plans: bool = False):
        self.term, self.budget = term, budget or Budget()
        self.sat = Saturator(shared_rules(), tree_plans)
        self.sat.add("root", term)
        self.stats = self.sat.run(self.budget)
        self.stats.eclasses = self.sat.serialize({"root": term}, self.stats).stats.eclasses

    def saturate(self, target: Target, staged: bool = True, blocked_cells: bool = False) -> SaturatedGraph:
        """The e-graph grown with the target's rules within what is left of the budget (without
        splitting loads through staging memories when not `staged`; with recurrent cells in
        blocks of hidden units wherever they can be, when `blocked_cells`)."""
        with self.sat.extended(target_rules(target, staged, blocked_cells)):
            return self.sat.serialize({"root": self.term}, self.sat.run(self.budget, after=self.stats))


#: the extractors `optimize` offers
EXTRACTORS = ("greedy", "ilp")


def extract(graph: SaturatedGraph, target: Target, extractor: str = "greedy",
            time_limit: float = TIME_LIMIT, unpinned: frozenset[str] = frozenset()) -> tuple[Extracted, float]:
    """The target's cheapest program in a saturated e-graph (greedy, or exact by ILP within the
    time limit; the constants of the `unpinned` e-classes not pinned on chip) and the seconds
    extraction took; NoProgramError (saying whether saturation had finished) when the target
    can run none."""
    if extractor not in EXTRACTORS:
        raise ValueError(f"unknown extractor {extractor!r}; extractors: {', '.join(EXTRACTORS)}")
    stats = graph.stats
    t0 = time.perf_counter()
    try:
        if extractor == "ilp":
            best = extract_ilp(graph, graph.roots["root"], target.cost_model(unpinned), time_limit)
        else:
            best = extract_greedy(graph, graph.roots["root"], target.cost_model(unpinned))
    except ExtractionError as exc:
        if stats.saturated:
            raise NoProgramError(f"{exc} on {target.name}: the rules cover no device program for it, or its "
                                 f"values do not fit in the target's on-chip memories", stats) from None
        raise NoProgramError(f"{exc} on {target.name} before saturation stopped ({stats.stop_reason}); "
                             f"a larger budget may find one", stats) from None
    return best, time.perf_counter() - t0


def compile_term(term: Term, target: Target, budget: Budget | None = None) -> tuple[SaturationStats, Extracted, float]:
    """Saturate a program term with every rule level for the target, extract its cheapest
    program; returns the saturation figures, the extracted program and the extraction seconds."""
    graph = SharedEGraph(term, budget).saturate(target)
    best, seconds = extract(graph, target)
    return graph.stats, best, seconds


def predicted_cycles(term: Term, target: Target) -> float:
    """The cost model's cycles for a program as code generation compiles it: a sub-term applied
    twice to the same value is compiled, and paid for, once."""
    return max(predicted_units(term, target).values())


def predicted_units(term: Term, target: Target) -> dict[str, float]:
    """`predicted_cycles` unit by unit: when the cost model has each unit done, and its chain of
    loads' recurrences and stores' drains (the largest is the prediction)."""
    model = target.cost_model()
    return model.by_unit(dag_cost(term, model))


def run_checked(program: Program, model: Model, target: Target,
                functional: bool) -> tuple[SimResult, np.ndarray | None, float, float]:
    """Simulate a program timing-only and, when functional, with values too (both must give the
    same cycles): the timing run, the output in the model's shape and its largest absolute and
    relative errors against the model's reference (None and NaN without values)."""
    timing = simulate(program, target.native_dim, None, functional=False)
    if not functional:
        return timing, None, math.nan, math.nan
    run = simulate(program, target.native_dim, model.env, functional=True)
    if timing.cycles != run.cycles:
        raise SimulationMismatch(f"functional {run.cycles} vs timing-only {timing.cycles} cycles")
    out = run.output.reshape(model.output_shape)
    err = np.abs(out.astype(np.float64) - model.reference)
    scale = max(float(np.abs(model.reference).max()), 1e-30)
    return timing, out, float(err.max()), float(err.max() / scale)


def _measure(model: Model, target: Target, best: Extracted, stats: SaturationStats, extract_seconds: float,
             functional: bool) -> Result:
    """Generate the extracted program, simulate it (timing-only, and with values when functional:
    both must give the same cycles) and check its output against the model's reference."""
    program = generate(best.term, target)
    timing, out, abs_err, rel_err = run_checked(program, model, target, functional)
    roof = roofline_cycles(model, target)
    units = predicted_units(best.term, target)
    return Result(
        target=target.name, layers=[str(s) for s in model.layers], input_shape=model.input_shape,
        output_shape=model.output_shape, cycles=timing.cycles, setup_cycles=timing.setup_cycles,
        predicted_cycles=max(units.values()), roofline_cycles=roof, efficiency=roof / timing.cycles,
        predicted_units=units, unit_done=timing.unit_done, unit_busy=timing.unit_busy,
        max_abs_error=abs_err, max_rel_error=rel_err, egraph=stats,
        extract_seconds=extract_seconds, instructions=program.static_count(),
        dynamic_instructions=program.dynamic_count(), ops=program.histogram(),
        weights=weight_residency(best.term, model.weights), term=best.term,
        program=program, output=out, reference=model.reference)


#: how many of the next cheapest programs are tried when the cheapest does not fit on chip
FALLBACKS = 8
#: the share of each on-chip memory one value, and one constant pinned at setup, may fill, and
#: the share all pinned constants may fill together (None: no limit), tried in turn while
#: programs overflow; last, nothing is pinned (weights are read where they are used)
ROOM = ((1.0, 1.0, None), (0.5, 0.5, None), (0.25, 0.25, None), (0.25, 0.25, 0.75), (0.25, 0.25, 0.5), (0.25, 0.25, 0.25),
        (0.25, 0.0, None))


def candidates(best: Extracted, graph: SaturatedGraph, target: Target, unpinned: frozenset[str],
               alternatives: int) -> Iterator[Extracted]:
    """The extracted program, then (ranked only when asked for) the next cheapest distinct ones."""
    yield best
    model = target.cost_model(unpinned)
    for c in k_cheapest(graph, graph.roots["root"], model, FALLBACKS + 2 * alternatives):
        if c.term != best.term:
            yield c


def _run(shared: SharedEGraph, model: Model, target: Target, functional: bool, alternatives: int,
         extractor: str, time_limit: float) -> Result:
    """The target's cheapest program from the shared e-graph, generated, simulated and checked;
    with alternatives > 1, also the next cheapest distinct programs up to that many in all (found
    by k-best extraction, reported in order of predicted cycles with shared sub-terms paid once,
    which the k-best ranking by tree cost only approximates). Extraction checks each value against
    its memory, but codegen lays out all live values together, so a program may still overflow:
    then the next cheapest that codegen lays out is taken (`_lay_out`). When none does on a target
    with a staging memory, the e-graph is grown again without splitting its loads: the split's
    programs can fill every candidate (a GRU(2816) step on the systolic array, whose gate vectors
    and the biases pinned beside them overflow the accumulator). When none does still, a program
    with recurrent cells is grown again with its cells in blocks of hidden units (`_attempts`).
    The programs codegen could not lay out are listed in `unbuildable` with the reason."""
    unbuildable: list[str] = []
    for split, blocked in _attempts(shared.term, target):
        result, best = _lay_out(shared.saturate(target, split, blocked), model, target, functional, alternatives,
                                extractor, time_limit, unbuildable)
        if result is not None:
            break
    if result is None:
        raise CodegenError(f"none of the {len(unbuildable)} cheapest programs can be laid out on {target.name}; "
                           f"the cheapest, {unbuildable[0]}")
    result.unbuildable = unbuildable
    result.alternatives.sort(key=lambda a: a.predicted_cycles)
    if isinstance(best, IlpExtracted):
        result.extraction = {"extractor": "ilp", "status": best.status, "gap": round(best.gap, 6),
                             "contexts": best.contexts, "greedy_cycles": best.greedy.cycles,
                             "greedy_shared_cycles": best.greedy_dag_cycles}
    return result


def _attempts(term: Term, target: Target) -> list[tuple[bool, bool]]:
    """The ways a target's e-graph is grown, in order, until a program lays out: (loads through
    staging memories split, cells in blocks of hidden units wherever they can be). A GRU or LSTM
    cell runs over whole gate vectors unless they fill the result memory, but its step keeps
    several gate-sized values live: the systolic array's GRU(4096) and LSTM(3072) steps need
    256 KiB and 168 KiB of its 64 KiB accumulator, so blocks are the last resort, for a program
    with a cell that runs over whole vectors by default and has a block size."""
    splits = (True, False) if target.staging else (True,)
    resident = memory_guards(target).resident
    blockable = any(blocks_only_when_asked(n, resident, target.native_dim)
                    for n in term.walk() if n.op in ("GRUCell", "LSTMCell"))
    return [(split, blocked) for blocked in ((False, True) if blockable else (False,)) for split in splits]


def _lay_out(graph: SaturatedGraph, model: Model, target: Target, functional: bool, alternatives: int,
             extractor: str, time_limit: float, unbuildable: list[str]) -> tuple[Result | None, Extracted]:
    """The cheapest program of a saturated e-graph that codegen lays out (None when none does)
    and the last one extracted. When none of the cheapest lays out and some overflowed,
    extraction is retried with less room per value, then with a budget for the pinned constants
    together, then with none pinned (`ROOM`); once less room per value leaves no program at all,
    the later retries keep the last room that had one. Appends to `unbuildable` why each
    candidate could not be laid out."""
    result = None
    least, last, tried = 0.0, ROOM[0][0], set()
    data, done = PinnedData(graph), {}
    for stage in ROOM:
        room, pinned, budget = max(stage[0], least), stage[1], stage[2]
        if (room, pinned, budget) in tried:
            continue
        tried.add((room, pinned, budget))
        cost_target = replace(target, value_room=room, pinned_room=pinned)
        try:
            found = _extract_within(graph, cost_target, extractor, time_limit, budget, data, done)
        except NoProgramError:
            if stage == ROOM[0]:
                raise
            least = last  # a GRU(1536) step on systolic: no program at a quarter, but its biases pin within a budget
            continue
        last = room
        if found is None:
            continue  # the pinned constants fit the budget already: the stage before tried this
        best, seconds, unpinned = found
        result, overflowed = _first_buildable(model, cost_target, unpinned, graph, best, seconds, functional,
                                              alternatives, unbuildable)
        if result is not None or not overflowed:
            break
    return result, best


def _extract_within(graph: SaturatedGraph, target: Target, extractor: str, time_limit: float,
                    budget: float | None, data: PinnedData,
                    done: dict[tuple, tuple[Extracted, float]]) -> tuple[Extracted, float, frozenset[str]] | None:
    """The cheapest program whose pinned constants fill at most `budget` of each on-chip memory
    together (any, when None), its extraction seconds and the e-classes of the constants it may
    not pin. Each program found that pins too much has the pins that do not fit unpinned, in
    every layout of their data (`over_budget` keeps the largest that fit; `PinnedData`), and
    extraction runs again, until its pins fit; None when the first program's pins already fit.
    `done` holds the extractions of earlier stages by room and unpinned constants: a stage
    with a budget starts from the program the stage without one found, so it is not extracted
    again (its seconds still count)."""
    unpinned: frozenset[str] = frozenset()
    total = 0.0
    while True:
        key = (target.value_room, target.pinned_room, unpinned)
        if key not in done:
            done[key] = extract(graph, target, extractor, time_limit, unpinned)
        best, seconds = done[key]
        total += seconds
        if budget is None:
            return best, total, unpinned
        pins = pinned_constants(graph, graph.roots["root"], best.term)
        drop = over_budget(pins, {s: m.capacity * budget for s, m in target.memories.items()})
        if not drop:
            return (best, total, unpinned) if unpinned else None
        unpinned |= data.same(p for p in pins if p.eclass in drop)


def _first_buildable(model: Model, target: Target, unpinned: frozenset[str], graph: SaturatedGraph,
                     best: Extracted, seconds: float, functional: bool, alternatives: int,
                     unbuildable: list[str]) -> tuple[Result | None, bool]:
    """The cheapest candidate codegen lays out, with up to alternatives - 1 more (None when none
    lays out), and whether any overflowed an on-chip memory; the reasons of those codegen could
    not lay out are appended to `unbuildable`."""
    result, overflowed = None, False
    for program in candidates(best, graph, target, unpinned, alternatives):
        try:
            measured = _measure(model, target, program, graph.stats, seconds, functional)
        except CodegenError as exc:
            overflowed = overflowed or isinstance(exc, CapacityError)
            unbuildable.append(f"predicted {predicted_cycles(program.term, target):.0f} cycles: {exc}")
            continue
        if result is None:
            result = measured
        else:
            result.alternatives.append(measured)
        if len(result.alternatives) == alternatives - 1:
            break  # before the next candidate, whose k-best extraction is not needed
    return result, overflowed


def optimize(layers: list[str | LayerSpec], input_shape: tuple[int, ...], target: str | Target = "brainwave",
             *, seed: int = 0, native_dim: int | None = None, budget: Budget | None = None,
             functional: bool = True, alternatives: int = 1, extractor: str = "greedy",
             time_limit: float = TIME_LIMIT) -> Result:
    """Compile a layer stack for a target by equality saturation, simulate it, check it. With
    functional=False there are no values: only timing-only simulation runs (any size), and the
    errors are NaN. alternatives=K also gives the K-1 next cheapest distinct programs;
    extractor="ilp" extracts by ILP (shared sub-terms paid once) within time_limit seconds."""
    tgt = target if isinstance(target, Target) else get_target(target, native_dim)
    model = build_model(layers, tuple(input_shape), seed=seed, values=functional)
    return _run(SharedEGraph(model.term, budget), model, tgt, functional, alternatives, extractor, time_limit)


@dataclass
class Comparison:
    """One layer stack on several targets from one shared e-graph: a Result per target, or the
    reason that target has no program."""

    layers: list[str]
    input_shape: tuple[int, ...]
    egraph: SaturationStats
    results: list[Result]
    failures: dict[str, str]

    def as_dict(self) -> dict:
        """The JSON-ready summary: the shared e-graph figures, then each target's result."""
        return {
            "layers": self.layers,
            "input_shape": list(self.input_shape),
            "targets": [r.target for r in self.results] + list(self.failures),
            "egraph": self.egraph.as_dict(),
            "results": [r.as_dict() for r in self.results],
            "failures": self.failures,
        }


def optimize_targets(layers: list[str | LayerSpec], input_shape: tuple[int, ...], targets: list[str | Target],
                     *, seed: int = 0, native_dim: int | None = None, budget: Budget | None = None,
                     functional: bool = True, alternatives: int = 1, extractor: str = "greedy",
                     time_limit: float = TIME_LIMIT) -> Comparison:
    """Compile a layer stack for several targets at once: saturate one e-graph with the shared
    rules (the DSL lowering), then grow, extract, generate and simulate each target's cheapest
    program from it. A
    target with no program (or none codegen can lay out) is reported in `failures` with the
    reason; the others still run."""
    tgts = [t if isinstance(t, Target) else get_target(t, native_dim) for t in targets]
    model = build_model(layers, tuple(input_shape), seed=seed, values=functional)
    shared = SharedEGraph(model.term, budget)
    results, failures = [], {}
    for t in tgts:
        try:
            results.append(_run(shared, model, t, functional, alternatives, extractor, time_limit))
        except (NoProgramError, CodegenError) as exc:
            failures[t.name] = str(exc)
    return Comparison([str(s) for s in model.layers], model.input_shape, shared.stats, results, failures)
