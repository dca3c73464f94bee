"""Benchmark: how closely the cost model's predicted cycles agree with the simulator's.

Every layer of the DeepBench suites (GEMM, RNN over all its time steps, convolution) and
AlexNet's convolutions and classifier (benchmarks/deepbench.py), and the per-target benchmark's
layers (benchmarks/targets.py), on every built-in target, timing-only: the extracted program's
predicted cycles beside its simulated cycles. It prints every row worst-first (ratio =
predicted / simulated, with the unit the model has done last, when the simulator had it done,
and the unit the simulator kept busiest: `Result.units_dict`) and, per target, how many rows
are within +-10%, the median and the worst |error|, the longest greedy extraction (the
issue's bound: 0.5 s per layer and target) and how the saturations stopped (a time limit makes
a program depend on the machine's load); layers a target has no program for are listed apart.

Why: extraction chooses programs by the prediction, so a prediction that drifts from what the
machine does picks the wrong programs; the simulator is the ground truth.

With --compare PATH ... (--json files of an earlier run, or of its parts) it also lists the rows whose predicted or
simulated cycles changed, and the runs that gained or lost a program.

Usage: python benchmarks/fidelity.py [--targets NAME ...] [--only SUBSTRING ...] [--json PATH]
                                     [--compare PATH ...]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import time
from collections import Counter

from deepbench import layers as deepbench_layers
from targets import LAYERS as TARGET_LAYERS

from frontend.layers import LayerError
from hwmodels.codegen import CodegenError
from liftsat.api import NoProgramError, optimize
from liftsat.targets import BUILTIN

TOLERANCE = 0.10


def suite() -> list[tuple[str, list[str], tuple[int, ...]]]:
    """(name, layer specs, input shape) of every distinct layer, DeepBench and AlexNet first."""
    rows = [(n, s, shape) for n, s, shape in deepbench_layers() if shape is not None]
    rows += [(n, s, shape) for n, s, shape, _ in TARGET_LAYERS]
    seen: set[tuple[tuple[str, ...], tuple[int, ...]]] = set()
    out = []
    for name, specs, shape in rows:
        key = (tuple(specs), tuple(shape))
        if key not in seen:
            seen.add(key)
            out.append((name, specs, shape))
    return out


def measure(target: str, name: str, specs: list[str], shape: tuple[int, ...]) -> dict:
    """One layer on one target: predicted and simulated cycles, or why there is no program."""
    t0 = time.perf_counter()
    row: dict = {"target": target, "layer": name}
    try:
        r = optimize(specs, shape, target, functional=False)
    except (NoProgramError, LayerError, CodegenError) as exc:
        row["error"] = str(exc).splitlines()[0]
    else:
        row.update(predicted=r.predicted_cycles, simulated=r.cycles, ratio=r.predicted_cycles / r.cycles,
                   extract_seconds=r.extract_seconds, units=r.units_dict(), stop=r.egraph.stop_reason)
    row["seconds"] = time.perf_counter() - t0
    return row


def error(row: dict) -> float:
    """|predicted / simulated - 1|."""
    return abs(row["ratio"] - 1)


def longest(row: dict) -> str:
    """The unit (or chain) the cost model has done last, and when the simulator had it done, e.g.
    "mvu 736 (388 simulated)": where a misprediction starts looking ("-" for rows from before
    units were recorded)."""
    units = {u: x for u, x in row.get("units", {}).items() if "predicted" in x}
    if not units:
        return "-"
    u = max(units, key=lambda k: units[k]["predicted"])
    sim = units[u].get("simulated")
    return f"{u} {units[u]['predicted']:.0f} ({'not simulated' if sim is None else f'{sim} simulated'})"


def busiest(row: dict) -> str:
    """The unit the simulator kept busy longest and its busy cycles ("-" as for `longest`)."""
    units = {u: x["busy"] for u, x in row.get("units", {}).items() if "busy" in x}
    if not units:
        return "-"
    u = max(units, key=units.__getitem__)
    return f"{u} {units[u]}"


def stops(rows: list[dict]) -> str:
    """How the rows' saturations stopped, e.g. "275 saturated, 19 iteration limit, 21 node limit"
    (the reason without its figures; "-" where no row recorded one)."""
    counts = Counter(r["stop"].split(" (")[0] for r in rows if "stop" in r)
    return ", ".join(f"{n} {why}" for why, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) or "-"


def report(rows: list[dict], targets: list[str]) -> str:
    """The worst-first table, the per-target summary and the rows without a program."""
    done = sorted((r for r in rows if "ratio" in r), key=lambda r: (-error(r), r["target"], r["layer"]))
    lines = ["| layer | target | predicted | simulated | ratio | model's longest | simulator's busiest |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['layer']} | {r['target']} | {r['predicted']:.0f} | {r['simulated']} | {r['ratio']:.3f} | "
              f"{longest(r)} | {busiest(r)} |" for r in done]
    lines += ["", "| target | rows | within ±10% | median abs error | worst abs error | worst layer | "
              "max greedy extraction s | saturation stopped |", "|---|---|---|---|---|---|---|---|"]
    for t in [*targets, "all"]:
        mine = [r for r in done if t in ("all", r["target"])]
        if not mine:
            continue
        worst = max(mine, key=error)
        within = sum(error(r) <= TOLERANCE for r in mine)
        lines.append(f"| {t} | {len(mine)} | {within} | {statistics.median(map(error, mine)):.1%} | "
                     f"{error(worst):.1%} | {worst['layer']}{'' if t != 'all' else ' on ' + worst['target']} | "
                     f"{max(r['extract_seconds'] for r in mine):.2f} | {stops(mine)} |")
    failed = [r for r in rows if "error" in r]
    if failed:
        lines += ["", "No program (not counted above):", ""]
        lines += [f"- {r['layer']} on {r['target']}: {r['error']}" for r in failed]
    return "\n".join(lines)


def changes(rows: list[dict], before: list[dict]) -> str:
    """The rows of this run whose predicted or simulated cycles differ from the earlier run's
    (rows only one run has are left out), and the ±10% count over the rows both runs have."""
    old = {(r["target"], r["layer"]): r for r in before}
    both = [(old[(r["target"], r["layer"])], r) for r in rows if (r["target"], r["layer"]) in old]

    def within(side: list[dict]) -> int:
        return sum("ratio" in r and error(r) <= TOLERANCE for r in side)

    def cells(r: dict) -> str:
        return f"{r['predicted']:.0f} | {r['simulated']} | {r['ratio']:.3f}" if "ratio" in r else "no program | – | –"

    changed = [f"| {r['layer']} | {r['target']} | {cells(o)} | {cells(r)} |" for o, r in both
               if (o.get("predicted"), o.get("simulated")) != (r.get("predicted"), r.get("simulated"))]
    head = (f"Against {len(both)} rows of the earlier run: within ±10% {within([o for o, _ in both])} before, "
            f"{within([r for _, r in both])} now")
    if not changed:
        return f"{head}\n\nNo row changed."
    return "\n".join([head, "", "| layer | target | predicted before | simulated before | ratio before | predicted | "
                       "simulated | ratio |", "|---|---|---|---|---|---|---|---|", *changed])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", nargs="+", default=list(BUILTIN), choices=list(BUILTIN), help="targets to run")
    p.add_argument("--only", nargs="+", metavar="SUBSTRING", help="only layers whose name contains one of these")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON to PATH")
    p.add_argument("--compare", nargs="+", metavar="PATH",
                   help="list what changed against an earlier run's --json files (their rows together)")
    args = p.parse_args()
    before: list[dict] = []
    for path in args.compare or []:
        try:
            with open(path) as f:
                before += json.load(f)
        except (OSError, ValueError) as exc:
            p.error(f"--compare {path}: {exc}")
    layers = [row for row in suite() if not args.only or any(s in row[0] for s in args.only)]
    t0 = time.perf_counter()
    rows = []
    for name, specs, shape in layers:
        for target in args.targets:
            rows.append(measure(target, name, specs, shape))
            print(f"  {name} on {target}: {rows[-1].get('ratio', rows[-1].get('error'))}", flush=True)
    wall = time.perf_counter() - t0
    print(f"\nPredicted vs simulated cycles (timing-only): {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, egglog {importlib.metadata.version('egglog')}\n")
    print(report(rows, args.targets))
    print(f"\n{len(rows)} runs in {wall:.0f} s wall-clock (slowest {max(r['seconds'] for r in rows):.1f} s)")
    if args.compare:
        print("\n" + changes(rows, before))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
