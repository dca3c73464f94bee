"""Benchmark: greedy against ILP extraction, on the layers of the targets benchmark on every
built-in target, plus a GRU cell (where the program uses sub-terms twice) and a DeepBench GEMM
(where greedy's tree cost misses the ILP's program).

For each layer and target the e-graph is saturated once, then both extractors run on it. The
table gives greedy's seconds and predicted cycles (its tree cost, and its program costed with
shared sub-terms paid once, as code generation runs it), the ILP's seconds and predicted cycles
(with sharing), the ILP's improvement over greedy's program, its status and gap, and the
contexts its model had; then both programs generated and simulated (with values, checked
against the reference, where the targets benchmark runs the layer with values; timing-only
otherwise) and the ILP's improvement in simulated cycles; last, the seconds k-best extraction
takes to rank the 10 cheapest distinct programs (what a compile ranks when its cheapest program
does not lay out: 8 + 2 x `--alternatives`, 10 by default).

Why: the ILP is exact over shared sub-terms within its time limit; this shows what that is
worth over greedy, predicted and simulated, and what it costs in time.

Usage: python benchmarks/extractors.py [--targets NAME ...] [--layers N ...] [--time-limit S] [--json PATH]
(`--layers 0 1 3 4 5 11`, every layer but the full-size GEMM and AlexNet convolutions, took about
8 minutes on every target on a 2-core machine shared with other jobs.)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import platform
import time

from targets import LAYERS  # this script runs with benchmarks/ on sys.path
from egraph_rules.ir import Term
from extraction.alternatives import k_cheapest
from extraction.greedy import ExtractionError, extract_greedy
from extraction.ilp import TIME_LIMIT, extract_ilp
from frontend.layers import Model, build_model
from hwmodels.codegen import CodegenError, generate
from hwmodels.target import Target
from liftsat.api import FALLBACKS, SharedEGraph, run_checked
from liftsat.targets import BUILTIN, get_target

#: how many programs k-best extraction ranks: as many as a compile ranks for its fallbacks
K = FALLBACKS + 2
#: the targets benchmark's layers (name, layers, input shape, simulated with values), a GRU cell
#: whose gates share, and DeepBench's GEMM 1024x700x512 (as liftsat's MatMul, see README)
ROWS: list[tuple[str, list[str], tuple[int, ...], bool]] = LAYERS + [
    ("GRUCell 64->32, batch 1", ["GRUCell(64, 32)"], (1, 64), True),
    ("DeepBench GEMM 1024x700x512 (timing-only)", ["MatMul(512, 1024, a_t=True, b_t=True)"], (512, 700), False)]


def simulated(term: Term, model: Model, target: Target, functional: bool) -> tuple[int | None, float, str]:
    """A program's simulated cycles and its output's largest relative error against the reference
    (NaN when not functional), or None, NaN and why codegen could not lay it out."""
    try:
        program = generate(term, target)
    except CodegenError as exc:
        return None, math.nan, str(exc)
    timing, _, _, rel_err = run_checked(program, model, target, functional)
    return timing.cycles, rel_err, ""


def run(target: str, name: str, layers: list[str], shape: tuple[int, ...], functional: bool,
        time_limit: float) -> dict:
    """Saturate one layer for one target, extract with both, simulate both programs; its row."""
    tgt = get_target(target)
    model = build_model(layers, shape, values=functional)
    graph = SharedEGraph(model.term).saturate(tgt)
    row = {"target": target, "layer": name, "enodes": graph.stats.enodes}
    t0 = time.perf_counter()
    try:
        greedy = extract_greedy(graph, graph.roots["root"], tgt.cost_model())
    except ExtractionError as exc:
        return {**row, "error": str(exc)}
    row["greedy_seconds"] = time.perf_counter() - t0
    r = extract_ilp(graph, graph.roots["root"], tgt.cost_model(), time_limit=time_limit)
    assert r.greedy.term == greedy.term
    t0 = time.perf_counter()
    ranked = k_cheapest(graph, graph.roots["root"], tgt.cost_model(), K)
    assert ranked[0].term == greedy.term
    kbest_seconds = time.perf_counter() - t0
    same = r.term == greedy.term
    greedy_sim, greedy_err, greedy_why = simulated(greedy.term, model, tgt, functional)
    ilp_sim, ilp_err, ilp_why = ((greedy_sim, greedy_err, greedy_why) if same
                                 else simulated(r.term, model, tgt, functional))
    return {**row, "greedy_cycles": greedy.cycles, "greedy_dag_cycles": r.greedy_dag_cycles,
            "ilp_seconds": r.seconds, "ilp_cycles": r.cycles, "status": r.status, "gap": r.gap,
            "contexts": r.contexts, "same_program": same, "greedy_simulated": greedy_sim,
            "greedy_rel_error": greedy_err, "greedy_unbuildable": greedy_why, "ilp_simulated": ilp_sim,
            "ilp_rel_error": ilp_err, "ilp_unbuildable": ilp_why, "kbest_seconds": kbest_seconds}


def _improvement(before: int | None, after: int | None) -> str:
    """1 - after / before in simulated cycles, as a percentage; blank when a program did not lay out."""
    return "" if before is None or after is None else f"{1 - after / before:.1%}"


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    lines = ["| layer | target | e-nodes | greedy s | greedy cycles (tree) | greedy cycles (shared) | ILP s | "
             "ILP cycles | improvement | ILP status (gap) | contexts | greedy simulated | ILP simulated | "
             f"simulated improvement | max rel error | {K} cheapest s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['layer']} | {r['target']} | {r['enodes']} | {r['error']} | | | | | | | | | | | | |")
            continue
        better = 1 - r["ilp_cycles"] / r["greedy_dag_cycles"] if r["greedy_dag_cycles"] else 0.0
        errs = [e for e in (r["greedy_rel_error"], r["ilp_rel_error"]) if not math.isnan(e)]
        gap = "" if r["status"] == "optimal" else f" ({r['gap']:.1%})"
        sims = [f"{r[k + '_simulated']}" if r[k + "_simulated"] is not None
                else f"does not lay out: {r[k + '_unbuildable']}" for k in ("greedy", "ilp")]
        if r["same_program"]:
            sims[1] = "greedy's program"
        lines.append(f"| {r['layer']} | {r['target']} | {r['enodes']} | {r['greedy_seconds']:.3f} | "
                     f"{r['greedy_cycles']:.0f} | {r['greedy_dag_cycles']:.0f} | {r['ilp_seconds']:.2f} | "
                     f"{r['ilp_cycles']:.0f} | {better:.1%} | "
                     f"{r['status']}{gap} | {r['contexts']} | {sims[0]} | {sims[1]} | "
                     f"{_improvement(r['greedy_simulated'], r['ilp_simulated'])} | "
                     f"{f'{max(errs):.1e}' if errs else 'timing-only'} | {r['kbest_seconds']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", nargs="+", default=list(BUILTIN), choices=list(BUILTIN), help="targets to run")
    p.add_argument("--layers", nargs="+", type=int, default=list(range(len(ROWS))),
                   help="row numbers of the layers to run: " + "; ".join(f"{i} {r[0]}" for i, r in enumerate(ROWS)))
    p.add_argument("--time-limit", type=float, default=TIME_LIMIT, help="ILP seconds per row")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON to PATH")
    args = p.parse_args()
    rows = []
    for i in args.layers:
        for t in args.targets:
            rows.append(run(t, *ROWS[i], args.time_limit))
            print(f"{ROWS[i][0]} on {t}: done", flush=True)
    print(f"\nGreedy and ILP extraction: {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"egglog {importlib.metadata.version('egglog')}, highspy {importlib.metadata.version('highspy')}, "
          f"ILP time limit {args.time_limit} s\n")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
