"""Benchmark: liftsat against phase-ordered rewriting, every target from one e-graph.

For each layer (the per-target benchmark's layers and every DeepBench inference GEMM, all
timing-only at full size) one e-graph is saturated and every built-in target extracts from it
(`optimize_targets`). The same layer is then compiled per target by phase-ordered rewriting
(`liftsat.baselines.phase_ordered`: lower, tile, restructure, committing to one program after
each phase) and simulated, both its final program and the tiled lowering its `tile` phase
committed to (DSL lowering, native tiling and device ops, no restructuring: per output tile,
multiply the streamed weight tiles, accumulate, add the bias, activate, write). Printed:
simulated cycles, liftsat ÷ each baseline (below 1: the e-graph wins), greedy extraction
seconds per target, and the geometric mean of the ratios per target and overall.

Usage: python benchmarks/baselines.py [--targets NAME ...] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import platform
import time
from pathlib import Path

from targets import LAYERS, deepbench_inference_gemms  # this script runs with benchmarks/ on sys.path
from egraph_rules.ir import Term
from extraction.greedy import ExtractionError
from frontend.layers import build_model
from hwmodels.codegen import CodegenError, generate
from hwmodels.simulator import simulate
from hwmodels.target import Target
from liftsat.api import optimize_targets
from liftsat.baselines import phase_ordered
from liftsat.targets import BUILTIN, get_target


def phase_ordered_cycles(layers: list[str], shape: tuple[int, ...], target: str) -> tuple[int | None, int | None]:
    """Simulated cycles of the tiled lowering (the `tile` phase's program) and of the
    phase-ordered program (None: no program, or none that fits on chip)."""
    t = get_target(target)
    model = build_model(layers, shape, values=False)
    try:
        phases = phase_ordered(model.term, t)
    except ExtractionError:
        return None, None
    return tuple(_simulated(p.term, t) if p else None for p in (phases[1].program, phases[-1].program))


def _simulated(term: Term, target: Target) -> int | None:
    """Timing-only simulated cycles of a program (None: codegen cannot lay it out on chip)."""
    try:
        return simulate(generate(term, target), target.native_dim, None, functional=False).cycles
    except CodegenError:
        return None


def rows_for(name: str, layers: list[str], shape: tuple[int, ...], targets: list[str]) -> list[dict]:
    """One layer on every target: liftsat (one shared e-graph) and the phase-ordered baseline."""
    t0 = time.perf_counter()
    both = optimize_targets(layers, shape, targets, functional=False)
    shared_seconds = time.perf_counter() - t0
    rows = []
    for r in both.results:
        tiled, base = phase_ordered_cycles(layers, shape, r.target)
        rows.append({"layer": name, "target": r.target, "cycles": r.cycles, "tiled": tiled, "phase_ordered": base,
                     "ratio": r.cycles / base if base else None, "ratio_tiled": r.cycles / tiled if tiled else None,
                     "extract_seconds": r.extract_seconds, "saturation_seconds": r.egraph.seconds,
                     "all_targets_seconds": shared_seconds})
    for t in both.failures:
        tiled, base = phase_ordered_cycles(layers, shape, t)
        rows.append({"layer": name, "target": t, "cycles": None, "tiled": tiled, "phase_ordered": base,
                     "ratio": None, "ratio_tiled": None, "extract_seconds": None, "saturation_seconds": None,
                     "all_targets_seconds": shared_seconds})
    return rows


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", nargs="+", default=list(BUILTIN), choices=list(BUILTIN))
    p.add_argument("--quick", action="store_true", help="only the first four layers (a smoke run)")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON to PATH")
    args = p.parse_args()
    layers = [(n, ls, s) for n, ls, s, _ in LAYERS] + [(f"DeepBench GEMM {n}", ls, s)
                                                      for n, ls, s in deepbench_inference_gemms()]
    if args.quick:
        layers = layers[:4]
    rows = [row for layer in layers for row in rows_for(*layer, args.targets)]
    print(f"liftsat vs phase-ordered rewriting: {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"egglog {importlib.metadata.version('egglog')}; timing-only, full size\n")
    print("| layer | target | liftsat cycles | tiled lowering | phase-ordered | liftsat / tiled | "
          "liftsat / phase-ordered | greedy extraction s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratios = [f"{r[k]:.3f}" if r[k] else "–" for k in ("ratio_tiled", "ratio")]
        ext = f"{r['extract_seconds']:.2f}" if r["extract_seconds"] is not None else "–"
        print(f"| {r['layer']} | {r['target']} | {r['cycles'] or 'no program'} | {r['tiled'] or 'no program'} | "
              f"{r['phase_ordered'] or 'no program'} | {' | '.join(ratios)} | {ext} |")
    print("\n| target | geomean liftsat / tiled | geomean liftsat / phase-ordered | layers | max greedy extraction s |")
    print("|---|---|---|---|---|")
    for t in args.targets + ["all"]:
        mine = [r for r in rows if t in ("all", r["target"])]
        tiled = [r["ratio_tiled"] for r in mine if r["ratio_tiled"]]
        ordered = [r["ratio"] for r in mine if r["ratio"]]
        ext = max((r["extract_seconds"] for r in mine if r["extract_seconds"] is not None), default=math.nan)
        print(f"| {t} | {geomean(tiled):.3f} | {geomean(ordered):.3f} | {len(ordered)} | {ext:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
