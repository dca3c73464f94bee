"""Benchmark: the same layers on every built-in target, end to end through `liftsat.api.optimize`.

Layers: Linear 1024x1024 at batch 1 and 16, a DeepBench inference GEMM at full size, a ReLU over
16 x 1024 values, a 3x3 convolution with ReLU, AlexNet's first max pooling, and AlexNet's five
convolutions at full size. For each target and layer it prints the simulated cycles per
inference, the roofline cycles (max of MACs / peak MACs per cycle and minimum DRAM bytes / bytes
per cycle), the efficiency (roofline / simulated), the largest relative error against numpy and
the device instructions executed, and per target the AlexNet convolutions' overall efficiency
(Snowflake's beside its published figure), then every DeepBench inference GEMM at full size on
every target. Rows marked timing-only run without values, at full size; the others are simulated functionally (values checked, and timing-only simulation must
give the same cycles).

Why: targets are data; this shows that one description per accelerator is enough for every layer
to compile and run, and how far each target's program is from its roofline.

Usage: python benchmarks/targets.py [--targets NAME ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import platform
import time
import tomllib
from pathlib import Path

from liftsat.api import optimize
from liftsat.targets import BUILTIN

DEEPBENCH = Path(__file__).with_name("deepbench.toml")
#: torchvision's AlexNet convolutions and their inputs
ALEXNET_CONVS = [("Conv2d(3, 64, 11, stride=4, padding=2)", (1, 3, 224, 224)),
                 ("Conv2d(64, 192, 5, padding=2)", (1, 64, 27, 27)),
                 ("Conv2d(192, 384, 3, padding=1)", (1, 192, 13, 13)),
                 ("Conv2d(384, 256, 3, padding=1)", (1, 384, 13, 13)),
                 ("Conv2d(256, 256, 3, padding=1)", (1, 256, 13, 13))]
#: Snowflake's published efficiency on AlexNet's convolutions (Gokhale et al.), for comparison
SNOWFLAKE_PUBLISHED = 0.91
#: DeepBench inference_server (M, N, K) = (3072, 1, 1024), as liftsat's MatMul (see README)
LAYERS: list[tuple[str, list[str], tuple[int, ...], bool]] = [   # (name, layers, input, functional)
    ("Linear 1024x1024, batch 1", ["Linear(1024, 1024)"], (1, 1024), True),
    ("Linear 1024x1024, batch 16", ["Linear(1024, 1024)"], (16, 1024), True),
    ("DeepBench GEMM 3072x1x1024 (timing-only)", ["MatMul(1024, 3072, a_t=True, b_t=True)"], (1024, 1), False),
    ("ReLU 16x1024", ["ReLU()"], (16, 1024), True),
    ("Conv2d 3x3 16->32 + ReLU on 16x16", ["Conv2d(16, 32, 3, padding=1)", "ReLU()"], (1, 16, 16, 16), True),
    ("MaxPool2d 3/2 on 64x55x55", ["MaxPool2d(3, stride=2)"], (1, 64, 55, 55), True),
    *[(f"AlexNet conv{i + 1} (timing-only)", [spec], shape, False) for i, (spec, shape) in enumerate(ALEXNET_CONVS)],
]


def run(target: str, name: str, layers: list[str], shape: tuple[int, ...], functional: bool) -> dict:
    """Optimize and simulate one layer on one target; its row."""
    t0 = time.perf_counter()
    r = optimize(layers, shape, target, functional=functional)
    return {"target": target, "layer": name, "cycles": r.cycles, "roofline_cycles": r.roofline_cycles,
            "efficiency": r.efficiency, "max_rel_error": r.max_rel_error, "ops": r.ops,
            "seconds": time.perf_counter() - t0}


def deepbench_inference_gemms() -> list[tuple[str, list[str], tuple[int, ...]]]:
    """DeepBench's inference GEMMs (M, N, K, a_t, b_t) as liftsat MatMul layers (see README)."""
    db = tomllib.loads(DEEPBENCH.read_text())
    out = []
    for suite in ("inference_server", "inference_device"):
        for m, n, k, a_t, b_t in db["gemm"][suite]:
            out.append((f"{m} x {n} x {k}", [f"MatMul({k}, {m}, a_t={not b_t}, b_t={not a_t})"],
                        (k, n) if not b_t else (n, k)))
    return out


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    lines = ["| target | layer | simulated cycles | roofline cycles | efficiency | max rel error | instructions executed |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        err = "timing-only" if math.isnan(row["max_rel_error"]) else f"{row['max_rel_error']:.1e}"
        ops = ", ".join(f"{k} {v}" for k, v in row["ops"].items())
        lines.append(f"| {row['target']} | {row['layer']} | {row['cycles']} | {row['roofline_cycles']:.0f} | "
                     f"{row['efficiency']:.3f} | {err} | {ops} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", nargs="+", default=list(BUILTIN), choices=list(BUILTIN), help="targets to run")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON to PATH")
    args = p.parse_args()
    rows = [run(t, *layer) for t in args.targets for layer in LAYERS]
    print(f"Layers on every built-in target: {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"egglog {importlib.metadata.version('egglog')}\n")
    print(table(rows))
    for target in args.targets:
        convs = [r for r in rows if r["target"] == target and r["layer"].startswith("AlexNet")]
        overall = sum(r["roofline_cycles"] for r in convs) / sum(r["cycles"] for r in convs)
        published = f" (published for Snowflake: above {SNOWFLAKE_PUBLISHED:.2f})" if target == "snowflake" else ""
        print(f"\n{target}: AlexNet convolutions overall efficiency {overall:.3f}{published}", end="")
    print()
    gemms = [(name, run(t, name, layers, shape, False)) for name, layers, shape in deepbench_inference_gemms()
             for t in args.targets]
    print("\nEvery DeepBench inference GEMM at full size (timing-only): simulated cycles (efficiency)\n")
    print("| GEMM M x N x K | " + " | ".join(args.targets) + " |")
    print("|---|" + "---|" * len(args.targets))
    for name in dict.fromkeys(n for n, _ in gemms):
        cells = [f"{r['cycles']} ({r['efficiency']:.3f})" for n, r in gemms if n == name]
        print(f"| {name} | " + " | ".join(cells) + " |")
    rows += [r for _, r in gemms]
    print(f"\nwall-clock seconds per row: max {max(r['seconds'] for r in rows):.1f}, "
          f"total {sum(r['seconds'] for r in rows):.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2, default=str)


if __name__ == "__main__":
    main()
