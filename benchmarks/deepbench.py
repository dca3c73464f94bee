"""Benchmark: e-graph budget for DeepBench layers (GEMM, convolution; RNN layers over all their
time steps) and AlexNet's five convolutions and three classifier layers, on brainwave: e-nodes,
e-classes, iterations, saturated or why it stopped, saturation and extraction seconds, and the
cost model's prediction.

Why: every layer must stop within 50,000 e-nodes and 2 s of saturation on this 2-core machine,
and the e-graph must not grow with the layer's size (loops are symbolic). Where a layer does not
saturate, the rules that matched most say what drives the growth. Only compilation is measured
(terms are built without weight values; nothing is simulated), so the full DeepBench sizes run.

Sizes come from benchmarks/deepbench.toml (DeepBench's kernels/*_problems.h, public facts).

Saturation seconds are the median of --repeat compiles (3 by default): on this shared 2-core
machine one compile's time varies by a third from run to run; the e-graph and the program do not.

Usage: python benchmarks/deepbench.py [--json PATH] [--repeat N]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import tomllib
from pathlib import Path

from frontend.layers import LayerError, build_model, parse_layer
from liftsat.api import NoProgramError, compile_term
from liftsat.targets import get_target

SIZES = Path(__file__).with_name("deepbench.toml")
NODE_BUDGET, SECONDS_BUDGET = 50_000, 2.0
#: torchvision's AlexNet features: (name, layer, input N x C x H x W)
ALEXNET_CONVS = [("alexnet conv1", "Conv2d(3, 64, 11, stride=4, padding=2)", (1, 3, 224, 224)),
                 ("alexnet conv2", "Conv2d(64, 192, 5, padding=2)", (1, 64, 27, 27)),
                 ("alexnet conv3", "Conv2d(192, 384, 3, padding=1)", (1, 192, 13, 13)),
                 ("alexnet conv4", "Conv2d(384, 256, 3, padding=1)", (1, 384, 13, 13)),
                 ("alexnet conv5", "Conv2d(256, 256, 3, padding=1)", (1, 256, 13, 13))]
ALEXNET_CLASSIFIER = [("alexnet fc6", "Linear(9216, 4096)", 9216), ("alexnet fc7", "Linear(4096, 4096)", 4096),
                      ("alexnet fc8", "Linear(4096, 1000)", 4096)]


def layers() -> list[tuple[str, list[str], tuple[int, ...] | None]]:
    """(name, layer specs, input shape) for every row; shape None marks an unsupported row."""
    db = tomllib.loads(SIZES.read_text())
    rows: list[tuple[str, list[str], tuple[int, ...] | None]] = []
    for suite, problems in db["gemm"].items():
        for m, n, k, a_t, b_t in problems:
            # DeepBench: C = op(A) op(B), A the weights; liftsat's MatMul is input . weight,
            # so C^T = op(B)^T op(A)^T
            spec = f"MatMul({k}, {m}, a_t={not b_t}, b_t={not a_t})"
            rows.append((f"gemm {suite} {m}x{n}x{k}", [spec], (k, n) if not b_t else (n, k)))
    for suite, problems in db["rnn"].items():
        layer = "GRU" if suite.startswith("gru") else "LSTM" if suite.startswith("lstm") else "RNN"
        for hidden, batch, steps in problems:
            rows.append((f"rnn {suite} h{hidden} b{batch} t{steps}", [f"{layer}({hidden}, {hidden})"],
                         (steps, batch, hidden)))
    for suite, problems in db["conv"].items():
        for w, h, c, n, k, s, r, pad_w, pad_h, stride_w, stride_h in problems:
            spec = f"Conv2d({c}, {k}, ({r}, {s}), stride=({stride_h}, {stride_w}), padding=({pad_h}, {pad_w}))"
            rows.append((f"conv {suite} {w}x{h}x{c}x{n}x{k}x{s}x{r}", [spec], (n, c, h, w)))
    rows += [(name, [spec], shape) for name, spec, shape in ALEXNET_CONVS]
    rows += [(name, [spec], (1, fin)) for name, spec, fin in ALEXNET_CLASSIFIER]
    return rows


def compile_once(specs: list[str], shape: tuple[int, ...]) -> dict:
    """One compile on brainwave: the saturation figures, the extraction seconds, the prediction."""
    model = build_model([parse_layer(s) for s in specs], shape, values=False)
    try:
        stats, best, extract_s = compile_term(model.term, get_target("brainwave"))
        predicted: float | None = best.cycles
    except NoProgramError as exc:  # e.g. a recurrent state larger than the on-chip memories
        stats, predicted, extract_s = exc.stats, None, 0.0
    top = sorted(stats.matches_per_rule.items(), key=lambda kv: -kv[1])[:3]
    return {"enodes": stats.enodes, "eclasses": stats.eclasses, "iterations": stats.iterations,
            "stop": stats.stop_reason, "saturation_s": stats.seconds, "extraction_s": extract_s,
            "predicted_cycles": predicted,
            "growth": "" if stats.saturated else ", ".join(f"{r} ({n})" for r, n in top)}


def measure(specs: list[str], shape: tuple[int, ...], repeat: int = 1) -> dict:
    """A row's figures over `repeat` compiles: the median seconds; the e-graph and the program
    must be the same every time (compilation is deterministic)."""
    runs = [compile_once(specs, shape) for _ in range(repeat)]
    timed = ("saturation_s", "extraction_s")
    figures = [{k: v for k, v in r.items() if k not in timed} for r in runs]
    if any(f != figures[0] for f in figures[1:]):
        raise SystemExit(f"{' '.join(specs)}: two compiles of the same layer differ")
    row = {**figures[0], **{k: statistics.median(r[k] for r in runs) for k in timed}}
    row["within_budget"] = row["enodes"] <= NODE_BUDGET and row["saturation_s"] <= SECONDS_BUDGET
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    ap.add_argument("--repeat", type=int, default=3, help="compiles per row; seconds are their median")
    args = ap.parse_args()
    print(f"DeepBench and AlexNet layers on brainwave (compile only): {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, egglog {importlib.metadata.version('egglog')}; "
          f"seconds are the median of {args.repeat} compiles\n")
    print("| layer | liftsat layers | input | e-nodes | e-classes | iterations | stop | saturation s | "
          "extraction s | predicted cycles | within budget | growth drivers |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for name, specs, shape in layers():
        if shape is None:
            print(f"| {name} | {' '.join(specs)} | | | | | not supported yet | | | | | |")
            rows.append({"layer": name, "supported": False})
            continue
        try:
            r = measure(specs, shape, args.repeat)
        except LayerError as exc:
            print(f"| {name} | {' '.join(specs)} | {'x'.join(map(str, shape))} | | | | {exc} | | | | | |")
            rows.append({"layer": name, "supported": False, "error": str(exc)})
            continue
        rows.append({"layer": name, "layers": specs, "input": list(shape), **r})
        predicted = "no program fits on chip" if r["predicted_cycles"] is None else f"{r['predicted_cycles']:.0f}"
        print(f"| {name} | {' '.join(specs)} | {'x'.join(map(str, shape))} | {r['enodes']} | {r['eclasses']} | "
              f"{r['iterations']} | {r['stop']} | {r['saturation_s']:.2f} | {r['extraction_s']:.2f} | "
              f"{predicted} | {'yes' if r['within_budget'] else 'NO'} | {r['growth']} |")
    flat = [measure([f"GRUCell({h}, {h})"], (1, h))["enodes"] for h in (512, 1024, 2048, 4096)]
    done = [r for r in rows if "enodes" in r]
    convs = [measure(["Conv2d(64, 64, 3, padding=1)"], (1, 64, hw, hw))["enodes"] for hw in (14, 28, 56, 112)]
    over_time = [measure(["GRU(512, 512)"], (t, 16, 512))["enodes"] for t in (1, 10, 100, 1000)]
    print(f"\nGRUCell e-nodes at hidden 512, 1024, 2048, 4096: {flat} (flat: loops are symbolic)")
    print(f"GRU(512, 512) e-nodes over 1, 10, 100, 1000 time steps: {over_time} (flat: the time loop is a Fold)")
    print(f"Conv2d(64, 64, 3, padding=1) e-nodes on 14x14, 28x28, 56x56, 112x112 images: {convs}")
    print(f"within budget: {sum(r['within_budget'] for r in done)} of {len(done)} supported rows; "
          f"max saturation {max(r['saturation_s'] for r in done):.2f} s, "
          f"max e-nodes {max(r['enodes'] for r in done)}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
