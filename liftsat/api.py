"""The Python API: optimize a layer stack for a target, end to end, and report what happened."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from egraph_rules.algorithmic_rules import algorithmic_rules
from egraph_rules.dsl_rules import dsl_rules
from egraph_rules.hardware_rules import hardware_rules
from egraph_rules.ir import Term
from egraph_rules.rules import Rule
from egraph_rules.saturate import Budget, Saturator, SaturationStats
from extraction.greedy import Extracted, ExtractionError, extract_greedy
from frontend.layers import LayerSpec, Model, build_model, parse_layer
from hwmodels.codegen import generate
from hwmodels.isa import Program
from hwmodels.simulator import simulate
from hwmodels.target import Target
from liftsat.targets import get_target


class SimulationMismatch(RuntimeError):
    """Functional and timing-only simulation disagree on cycles (a simulator bug)."""


def rules_for(targets: list[Target]) -> list[Rule]:
    """DSL, algorithmic (tiled to the targets' native sizes; weight-stationary GEMMs only where
    every target's result memory holds the GEMM's rows and results and its weights do not fit on
    chip) and hardware rules, together."""
    natives = tuple(sorted({t.native_dim for t in targets}))
    resident = min(t.result_capacity // 4 for t in targets)
    pinnable = min(max(m.capacity for m in t.memories.values()) // 4 for t in targets)
    rules = dsl_rules(resident, pinnable) + algorithmic_rules(natives, resident, pinnable)
    for t in targets:
        rules += hardware_rules(t.device_ops(), t.native_dim)
    return rules


def roofline_cycles(model: Model, target: Target) -> float:
    """max(MACs / peak MACs per cycle, minimum DRAM bytes / bytes per cycle); weights that fit
    on chip count as resident when the target keeps weights (they are loaded at deployment)."""
    on_chip = sum(m.capacity for m in target.memories.values())
    resident = target.persistent_weights and model.weight_bytes <= on_chip
    min_bytes = model.io_bytes + (0 if resident else model.weight_bytes)
    return max(model.macs / target.peak_macs_per_cycle, min_bytes / target.dram.bandwidth)


def weight_residency(term: Term, weights: list[str]) -> dict[str, str]:
    """For each weight: 'pinned' when the program moves it on chip once, as a constant (loaded
    at setup), 'streamed' when it is read from DRAM per inference."""
    pinned: set[str] = set()
    for node in term.walk():
        if node.op == "Const":
            moved = any(n.op == "ToChip" for n in node.args[0].walk())
            if moved:
                pinned |= {n.args[0] for n in node.args[0].walk() if n.op == "Var"}
    return {w: "pinned" if w in pinned else "streamed" for w in weights}


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
    ops: dict[str, int]
    weights: dict[str, str]
    term: Term
    program: Program
    output: np.ndarray | None = field(repr=False)
    reference: np.ndarray | None = field(repr=False)

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
            "instructions": self.instructions,
            "dynamic_instructions": self.dynamic_instructions,
            "ops": self.ops,
            "weights": self.weights,
        }


class NoProgramError(ExtractionError):
    """No program for the layer on the target; carries the saturation figures of the attempt."""

    def __init__(self, message: str, stats: SaturationStats):
        super().__init__(message)
        self.stats = stats


def compile_term(term: Term, target: Target, budget: Budget | None = None) -> tuple[SaturationStats, Extracted, float]:
    """Saturate a program term with every rule level for the target, extract its cheapest
    program; returns the saturation figures, the extracted program and the extraction seconds."""
    sat = Saturator(rules_for([target]))
    sat.add("root", term)
    stats = sat.run(budget or Budget())
    graph = sat.serialize({"root": term}, stats)
    t0 = time.perf_counter()
    try:
        best = extract_greedy(graph, graph.roots["root"], target.cost_model())
    except ExtractionError as exc:
        if stats.saturated:
            raise NoProgramError(f"{exc} on {target.name}: the rules cover no device program for it, or its "
                                 f"values do not fit in the target's on-chip memories", stats) from None
        raise NoProgramError(f"{exc} on {target.name} before saturation stopped ({stats.stop_reason}); "
                             f"a larger budget may find one", stats) from None
    return stats, best, time.perf_counter() - t0


def optimize(layers: list[str | LayerSpec], input_shape: tuple[int, ...], target: str | Target = "brainwave",
             *, seed: int = 0, native_dim: int | None = None, budget: Budget | None = None,
             functional: bool = True) -> Result:
    """Compile a layer stack for a target by equality saturation, simulate it, check it. With
    functional=False there are no values: only timing-only simulation runs (any size), and the
    errors are NaN."""
    tgt = target if isinstance(target, Target) else get_target(target, native_dim)
    specs = [parse_layer(s) if isinstance(s, str) else s for s in layers]
    model = build_model(specs, tuple(input_shape), seed=seed, values=functional)
    stats, best, extract_seconds = compile_term(model.term, tgt, budget)
    program = generate(best.term, tgt)
    timing = simulate(program, tgt.native_dim, None, functional=False)
    out, abs_err, rel_err = None, math.nan, math.nan
    if functional:
        run = simulate(program, tgt.native_dim, model.env, functional=True)
        if timing.cycles != run.cycles:
            raise SimulationMismatch(f"functional {run.cycles} vs timing-only {timing.cycles} cycles")
        out = run.output.reshape(model.output_shape)
        err = np.abs(out.astype(np.float64) - model.reference)
        scale = max(float(np.abs(model.reference).max()), 1e-30)
        abs_err, rel_err = float(err.max()), float(err.max() / scale)
    roof = roofline_cycles(model, tgt)
    return Result(
        target=tgt.name, layers=[str(s) for s in specs], input_shape=model.input_shape,
        output_shape=model.output_shape, cycles=timing.cycles, setup_cycles=timing.setup_cycles,
        predicted_cycles=best.cycles, roofline_cycles=roof, efficiency=roof / timing.cycles,
        max_abs_error=abs_err, max_rel_error=rel_err, egraph=stats,
        extract_seconds=extract_seconds, instructions=program.static_count(),
        dynamic_instructions=program.dynamic_count(), ops=program.histogram(),
        weights=weight_residency(best.term, model.weights), term=best.term,
        program=program, output=out, reference=model.reference)
