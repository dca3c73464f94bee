"""Benchmark: saturation with and without egglog 14's tree-decomposed query plans.

egglog 14 plans each rule's query with a tree decomposition unless the e-graph is built with
`no_decomp`; liftsat turns that planning off (`egraph_rules.saturate.new_egraph`). For each layer
and target this saturates the same term twice in one process, with the plans and without, and
reports both saturations' seconds, their ratio, and whether the two e-graphs and programs are
the same (e-node, e-class and iteration counts, and the greedy program). The seconds budget is
raised so that only the node or iteration limit stops either run. egglog 13.2 (Python 3.11) has
one planner, so this needs egglog 14 (Python 3.12 or later).

Usage: python benchmarks/egglog_plans.py [--targets NAME ...] [--layers SUBSTRING ...] [--json PATH]
(the default eight layers on every target took about 5 minutes on a 2-core machine)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
from statistics import geometric_mean

from fidelity import suite  # this script runs with benchmarks/ on sys.path
from egraph_rules.saturate import PLANNER_SWITCH, Budget
from extraction.greedy import ExtractionError, extract_greedy
from frontend.layers import build_model
from liftsat.api import SharedEGraph
from liftsat.targets import BUILTIN, get_target

#: a GEMM, recurrent cells, convolutions (one whose e-graph stops at the node limit) and a layer stack
DEFAULT_LAYERS = ["gemm training 1760x16x1760", "rnn gru_inference h512 b1 t1", "rnn lstm_inference h256 b1 t150",
                  "conv training 14x14x256x16x1024x1x1", "alexnet conv2", "Linear 1024x1024, batch 16",
                  "Conv2d 3x3 16->32 + ReLU on 16x16", "MaxPool2d 3/2 on 64x55x55"]

#: room for the node or iteration limit to stop both saturations
BUDGET = Budget(seconds=600)


def saturation(target: str, specs: list[str], shape: tuple[int, ...], tree_plans: bool) -> dict:
    """Saturate one layer for one target; its figures and greedy program."""
    tgt = get_target(target)
    graph = SharedEGraph(build_model(specs, shape, values=False).term, BUDGET, tree_plans).saturate(tgt)
    st = graph.stats
    try:
        program = extract_greedy(graph, graph.roots["root"], tgt.cost_model()).term
    except ExtractionError:
        program = None
    return {"enodes": st.enodes, "eclasses": st.eclasses, "iterations": st.iterations, "stop": st.stop_reason,
            "seconds": st.seconds, "program": program}


def run(target: str, name: str, specs: list[str], shape: tuple[int, ...]) -> dict:
    """One layer on one target, with the plans and without; its row."""
    with_plans = saturation(target, specs, shape, True)
    without = saturation(target, specs, shape, False)
    keys = ("enodes", "eclasses", "iterations", "program")
    return {"layer": name, "target": target, "enodes": without["enodes"], "iterations": without["iterations"],
            "stop": without["stop"], "plans_seconds": with_plans["seconds"], "seconds": without["seconds"],
            "same": all(with_plans[k] == without[k] for k in keys)}


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table, then the geometric mean and total of the speedups."""
    lines = ["| layer | target | e-nodes | iterations | stop | with tree plans s | without s | speedup | same e-graph and program |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['layer']} | {r['target']} | {r['enodes']} | {r['iterations']} | {r['stop']} | "
                     f"{r['plans_seconds']:.2f} | {r['seconds']:.2f} | {r['plans_seconds'] / r['seconds']:.1f}x | "
                     f"{'yes' if r['same'] else 'NO'} |")
    ratios = [r["plans_seconds"] / r["seconds"] for r in rows]
    lines.append(f"\nSpeedup: geometric mean {geometric_mean(ratios):.2f}x, "
                 f"range {min(ratios):.1f}-{max(ratios):.1f}x; seconds in all "
                 f"{sum(r['plans_seconds'] for r in rows):.1f} -> {sum(r['seconds'] for r in rows):.1f}; "
                 f"{sum(r['same'] for r in rows)} of {len(rows)} rows the same e-graph and program.")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", nargs="+", default=list(BUILTIN), choices=list(BUILTIN), help="targets to run")
    p.add_argument("--layers", nargs="+", default=DEFAULT_LAYERS, metavar="SUBSTRING",
                   help="suite layers whose names contain one of these (default: eight of them)")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON to PATH")
    args = p.parse_args()
    if not PLANNER_SWITCH:
        print(f"egglog {importlib.metadata.version('egglog')} has one query planner; this benchmark needs egglog 14 "
              "(Python 3.12 or later)", file=sys.stderr)
        return 2
    layers = [row for row in suite() if any(s in row[0] for s in args.layers)]
    rows = []
    for name, specs, shape in layers:
        for t in args.targets:
            rows.append(run(t, name, specs, shape))
            print(f"{name} on {t}: done", flush=True)
    print(f"\nSaturation with and without tree-decomposed query plans: {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, egglog {importlib.metadata.version('egglog')}\n")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
