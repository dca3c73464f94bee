"""Benchmark: how simulation time grows with loop trip counts (issue 4).

For each pair of layers, the second does 10x the work of the first through 10x the trip count of
one loop (the batch loop): Linear(1024, 1024) with pinned weights at batch 16 and 160, and
Linear(4096, 4096), whose weights do not fit on chip and are streamed, at batch 2 and 20, both
on brainwave (native dimension 128). Each program is compiled once with `liftsat.optimize`, then
simulated in timing-only mode (best of several runs) and in functional mode (which executes
every iteration and computes every value).

Why: timing-only simulation proves loops periodic and skips whole periods, so its time must not
grow with trip counts: for 10x the work it must take less than 2x the time, while giving exactly
the cycles, instruction counts and unit activity of functional mode (checked here too).

Usage: python benchmarks/sim_scaling.py [--repeat N]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import time

import numpy as np

from frontend.layers import build_model, parse_layer
from hwmodels.simulator import simulate
from liftsat.api import optimize
from liftsat.targets import get_target

TARGET = "brainwave"
PAIRS = [  # (layer, batch of the small run, batch of the 10x run)
    ("Linear(1024, 1024)", 16, 160),
    ("Linear(4096, 4096)", 2, 20),
]
LIMIT = 2.0  # timing-only seconds, 10x run / small run, must stay below this


def best_of(repeat: int, run) -> tuple[float, object]:
    """Fastest wall-clock time of `repeat` calls (garbage collection off while timing), and the
    last result."""
    times, result = [], None
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeat):
            t0 = time.perf_counter()
            result = run()
            times.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return min(times), result


def compile_layer(layer: str, batch: int) -> dict:
    """Optimize one Linear layer at one batch size: its row, with the program and input values."""
    in_features = int(layer.split("(")[1].split(",")[0])
    shape = (batch, in_features)
    r = optimize([layer], shape, TARGET)
    return {"layer": layer, "batch": batch, "weights": r.weights["W0"], "program": r.program,
            "env": build_model([parse_layer(layer)], shape).env}


def measure(row: dict, repeat: int) -> None:
    """Simulate one compiled program both ways; add the numbers to its row."""
    native = get_target(TARGET).native_dim
    timing_s, timing = best_of(repeat, lambda: simulate(row["program"], native, None, functional=False))
    functional_s, functional = best_of(1, lambda: simulate(row["program"], native, row["env"], functional=True))
    row.update(dyn=timing.dynamic_instructions, cycles=timing.cycles, timing_s=timing_s, functional_s=functional_s,
               same=(timing.cycles, timing.setup_cycles, timing.dynamic_instructions, timing.unit_busy) ==
                    (functional.cycles, functional.setup_cycles, functional.dynamic_instructions, functional.unit_busy))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=9, help="timing-only runs per program (the best counts)")
    args = p.parse_args()
    print(f"Simulation time vs trip count on {TARGET}: {os.cpu_count()} cores, {platform.machine()}, "
          f"Python {platform.python_version()}, numpy {np.__version__}; wall-clock seconds of one process\n")
    head = ["layer", "batch", "weights", "dynamic instructions", "simulated cycles", "timing-only s",
            "functional s", "functional / timing-only", "timing = functional"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    verdicts, ok = [], True
    for layer, small, large in PAIRS:
        rows = [compile_layer(layer, b) for b in (small, large)]
        for row in rows:
            measure(row, args.repeat)
        for row in rows:
            print(f"| {row['layer']} | {row['batch']} | {row['weights']} | {row['dyn']} | {row['cycles']} | "
                  f"{row['timing_s']:.4f} | {row['functional_s']:.3f} | {row['functional_s'] / row['timing_s']:.0f}x | "
                  f"{'yes' if row['same'] else 'NO'} |")
        work = rows[1]["dyn"] / rows[0]["dyn"]
        ratio = rows[1]["timing_s"] / rows[0]["timing_s"]
        good = ratio < LIMIT and all(row["same"] for row in rows)
        ok &= good
        verdicts.append(f"{layer}, batch {large} / batch {small}: {work:.1f}x the dynamic instructions, "
                        f"timing-only time ratio {ratio:.2f} (must be < {LIMIT:g}), functional time ratio "
                        f"{rows[1]['functional_s'] / rows[0]['functional_s']:.2f}: {'ok' if good else 'FAIL'}")
    print()
    print("\n".join(verdicts))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
