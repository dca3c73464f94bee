"""Benchmark: fully connected layers on BrainWave, end to end through `liftsat.api.optimize`.

For each FC layer (named out x in, as in the issue: 1024x1024, 4096x4096, 1000x1024 with a
non-divisible output count, 2560x2560) at batch 1 and 16, it measures the e-graph size and how
saturation stopped, saturation and extraction time (and the whole optimize call), predicted,
simulated and roofline cycles, efficiency against the roofline, numerical error against numpy,
and whether the weights end up pinned on chip or streamed.

Why: loops stay symbolic in the IR, so the e-graph must not grow with the layer size (the
4096x4096 / 1024x1024 node ratio should be near 1.0) and compile time must stay small, while the
extracted program must be correct and close to the roofline. The ratio and the worst compile time
printed below the table are measured in the same run as the table.

Usage: python benchmarks/fc.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import time

from liftsat.api import Result, optimize

TARGET = "brainwave"
LAYERS = [(1024, 1024), (4096, 4096), (1024, 1000), (2560, 2560)]  # (in_features, out_features)
BATCHES = (1, 16)
QUICK_LAYERS = (LAYERS[0], LAYERS[2])
COLUMNS = {  # header -> (row key, cell format)
    "layer (out×in)": ("layer", "{}"), "batch": ("batch", "{}"), "e-nodes": ("enodes", "{}"),
    "e-classes": ("eclasses", "{}"), "iterations": ("iterations", "{}"),
    "saturated/stop reason": ("stop_reason", "{}"), "saturation s": ("saturation_s", "{:.2f}"),
    "extraction s": ("extraction_s", "{:.2f}"), "optimize s (total)": ("optimize_s", "{:.2f}"),
    "predicted cycles": ("predicted_cycles", "{:.0f}"), "simulated cycles": ("cycles", "{}"),
    "roofline cycles": ("roofline_cycles", "{:.0f}"), "efficiency": ("efficiency", "{:.3f}"),
    "max rel error": ("max_rel_error", "{:.2e}"), "weights": ("weights", "{}"),
}


def configs(quick: bool) -> list[tuple[int, int, int]]:
    """(in_features, out_features, batch) of every run, layer-major."""
    layers = QUICK_LAYERS if quick else LAYERS
    batches = BATCHES[:1] if quick else BATCHES
    return [(i, o, b) for i, o in layers for b in batches]


def run(in_features: int, out_features: int, batch: int) -> dict:
    """Optimize one Linear layer and return its row (numbers, not yet formatted)."""
    t0 = time.perf_counter()
    r: Result = optimize([f"Linear({in_features}, {out_features})"], (batch, in_features), TARGET)
    total = time.perf_counter() - t0
    e = r.egraph
    return {
        "layer": f"{out_features}×{in_features}", "batch": batch, "enodes": e.enodes, "eclasses": e.eclasses,
        "iterations": e.iterations, "stop_reason": e.stop_reason, "saturation_s": e.seconds,
        "extraction_s": r.extract_seconds, "optimize_s": total, "predicted_cycles": r.predicted_cycles,
        "cycles": r.cycles, "roofline_cycles": r.roofline_cycles, "efficiency": r.efficiency,
        "max_rel_error": r.max_rel_error, "weights": r.weights["W0"],
        "setup_cycles": r.setup_cycles, "ops": r.ops,
    }


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(spec.format(row[key]) for key, spec in COLUMNS.values()) + " |" for row in rows]
    return "\n".join(lines)


def ratios(rows: list[dict]) -> list[str]:
    """The summary lines below the table, from this run's rows only."""
    nodes = {(row["layer"], row["batch"]): row["enodes"] for row in rows}
    big, small = nodes.get(("4096×4096", 1)), nodes.get(("1024×1024", 1))
    growth = f"{big / small:.3f}" if big and small else "n/a (not both run)"
    worst = max(row["saturation_s"] + row["extraction_s"] for row in rows)
    return [f"e-nodes 4096×4096 / 1024×1024 at batch 1: {growth}; loops stay symbolic, expect ~1.0",
            f"max saturation+extraction over all rows: {worst:.3f} s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="batch 1 of 1024×1024 and 1000×1024 only")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON to PATH")
    args = p.parse_args()
    rows = [run(*c) for c in configs(args.quick)]
    print(f"FC layers on {TARGET}: {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"egglog {importlib.metadata.version('egglog')}\n")
    print(table(rows) + "\n")
    print("\n".join(ratios(rows)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2, ensure_ascii=False)


if __name__ == "__main__":
    main()
