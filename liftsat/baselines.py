"""Baselines that liftsat's e-graph is measured against.

Phase-ordered rewriting: the same rules in a fixed order of phases, committing to one program
after each phase, as a pass pipeline does: lower the layers (DSL rules), then tile to the
target's native size, then restructure (Lift's algorithmic rules: fusion, movement, stacking,
im2col). Each phase rewrites only the program the previous one committed to, together with the
target's hardware rules so that a runnable program can be chosen (the cheapest that codegen lays
out, as liftsat's compile takes: `liftsat.api.candidates`); when a phase ends with no runnable
program, the next phase starts from what it was given. egglog is only the rewriting
engine here: nothing found in one phase survives into the next except the committed program.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from egraph_rules.algorithmic_rules import common_algorithmic_rules
from egraph_rules.dsl_rules import dsl_rules
from egraph_rules.hardware_rules import hardware_rules
from egraph_rules.interpreter import BINARY, UNARY
from egraph_rules.ir import Term
from egraph_rules.rules import Rule
from egraph_rules.saturate import Budget, SaturatedGraph, Saturator
from extraction.greedy import Extracted, ExtractionError, extract_greedy
from hwmodels.codegen import CodegenError, generate
from hwmodels.target import Target
from liftsat.api import candidates
from liftsat.rulesets import target_dsl_rules, target_tiling_rules

#: the rules that keep hardware rules' early moves bounded (a value moved twice is moved once)
MOVE_BOUNDS = ("tochip-elide", "move-stage-idempotent")
#: whole layers, which only DSL rules lower
LAYER_OPS = frozenset(("Linear", "LinearNB", "GRUCell", "LSTMCell", "RNNCell"))

#: the phases in order: name and the rules of the phase for a target
PHASES: tuple[tuple[str, Callable[[Target], list[Rule]]], ...] = (
    ("lower", lambda t: dsl_rules() + target_dsl_rules(t)),
    ("tile", target_tiling_rules),
    ("restructure", lambda t: common_algorithmic_rules()),
)


@dataclass
class Phase:
    """What one phase did: its name, the runnable program it committed to (None: it found none
    and committed the most lowered term instead), and its e-graph's size and stop reason."""

    name: str
    program: Extracted | None
    enodes: int
    stop_reason: str

    def __str__(self) -> str:
        did = (f"committed, {self.program.cycles:.0f} predicted cycles" if self.program
               else "no runnable program yet, committed the most lowered one")
        return f"{self.name}: {did} ({self.enodes} e-nodes, {self.stop_reason})"


def phase_ordered(term: Term, target: Target, budget: Budget | None = None) -> list[Phase]:
    """Phase-ordered rewriting of a program term for the target: what each phase committed to.
    The result is the last phase's program; `tile`'s is the tiled lowering before any
    restructuring. ExtractionError when no phase ends with a runnable program."""
    phases = []
    hardware = hardware_rules(target.device_ops(), target.native_dim)
    hardware += [r for r in common_algorithmic_rules() if r.name in MOVE_BOUNDS]
    for name, rules in PHASES:
        sat = Saturator(list({r.name: r for r in rules(target) + hardware}.values()))
        sat.add("root", term)
        stats = sat.run(budget or Budget())
        graph = sat.serialize({"root": term}, stats)
        best = _laid_out(graph, target)
        term = best.term if best else extract_greedy(graph, graph.roots["root"], _Lowered(target)).term
        phases.append(Phase(name, best, stats.enodes, stats.stop_reason))
    if phases[-1].program is None:
        raise ExtractionError(f"phase-ordered rewriting found no program {target.name} runs: "
                              + "; ".join(map(str, phases)))
    return phases


def _laid_out(graph: SaturatedGraph, target: Target) -> Extracted | None:
    """The phase's cheapest program that codegen lays out (None: the target runs none of them)."""
    try:
        best = extract_greedy(graph, graph.roots["root"], target.cost_model())
    except ExtractionError:
        return None
    for program in candidates(best, graph, target, frozenset(), 0):
        try:
            generate(program.term, target)
        except CodegenError:
            continue
        return program
    return None


class _Lowered:
    """The commitment of a phase that ends with no runnable program: fewest whole layers and
    operations no device op does, then fewest operations at a size no device op has, then the
    smallest term (a cost model in extraction's sense, not cycles)."""

    def __init__(self, target: Target):
        self.meanings = {op.meaning for op in target.device_ops()}
        self.kinds = {m.op for m in self.meanings}

    def node(self, op: str, args: tuple, kids: list[float]) -> float:
        computes = op in BINARY or op in UNARY
        if op in LAYER_OPS or (computes and op not in self.kinds):
            own = 1e6
        elif computes and Term(op, args) not in self.meanings:
            own = 1e3
        else:
            own = 1.0
        return own + sum(kids)

    def scalar(self, cost: float) -> float:
        return cost
