"""The command line: `liftsat optimize LAYER... --input BxF --target T`, `liftsat targets`,
`liftsat rules`.

Each subcommand is a function from its parsed arguments to the text it prints; `main` turns the
user errors any of them raises into one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import json
import sys

from egraph_rules.ir import IRTypeError
from egraph_rules.saturate import Budget, EGraphError
from extraction.greedy import ExtractionError
from frontend.layers import LayerError, parse_shape
from hwmodels.codegen import CodegenError
from hwmodels.simulator import SimulationError
from liftsat.api import EXTRACTORS, TIME_LIMIT, Comparison, optimize, optimize_targets
from liftsat.rule_table import rule_rows
from liftsat.targets import BUILTIN, TargetError, get_target, get_targets, summary

USER_ERRORS = (LayerError, TargetError, IRTypeError, ExtractionError, CodegenError, SimulationError, EGraphError)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other bad input
        print(f"liftsat: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="liftsat", description="Map deep-learning layers onto accelerators by equality saturation.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    o = sub.add_parser("optimize", help="compile layers for a target, simulate, report")
    o.add_argument("layers", nargs="+", help='PyTorch-style layers applied in order, e.g. "Linear(1024, 1000)" "ReLU()"')
    o.add_argument("--input", required=True,
                   help="input shape: BxF (batch x features), e.g. 1x1024; TxBxF (time first) for GRU, LSTM, "
                        "RNN; NxCxHxW for image layers, e.g. 1x3x32x32")
    o.add_argument("--target", default="brainwave",
                   help="built-in target name, or the path of a .toml target description (default brainwave); "
                        "'all' or a comma list (systolic,vta) saturates one e-graph and extracts for each")
    o.add_argument("--native-dim", type=int, help="native dimension of the target (brainwave: 128, 64 or 32)")
    o.add_argument("--seed", type=int, default=0, help="seed of the random inputs and weights (default 0)")
    o.add_argument("--timing-only", action="store_true",
                   help="simulate without data (any size; output not checked against numpy)")
    o.add_argument("--alternatives", type=_positive, default=1, metavar="K",
                   help="also generate and simulate the next cheapest distinct programs, K in all (default 1)")
    o.add_argument("--extractor", choices=EXTRACTORS, default="greedy",
                   help="greedy (default), or ilp: exact with shared sub-terms paid once (HiGHS), warm-started "
                        "from greedy")
    o.add_argument("--ilp-time-limit", type=float, default=TIME_LIMIT, metavar="SECONDS",
                   help=f"time limit of the ILP extractor (default {TIME_LIMIT:g} s); when it stops the search, the "
                        f"best program found and the optimality gap are reported")
    o.add_argument("--max-nodes", type=int, default=Budget.nodes,
                   help="e-node budget of saturation (a step that passes twice it is undone)")
    o.add_argument("--max-iterations", type=int, default=Budget.iterations, help="iteration budget")
    o.add_argument("--max-seconds", type=float, default=Budget.seconds, help="time budget of saturation")
    out = o.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument("--listing", action="store_true", help="print the program in the target's assembly syntax")
    o.set_defaults(run=_optimize)
    t = sub.add_parser("targets", help="list the built-in targets and their key numbers")
    t.add_argument("--json", action="store_true", help="print a JSON list")
    t.set_defaults(run=_targets)
    r = sub.add_parser("rules", help="list every rewrite rule: level, side condition, meaning, test")
    r.add_argument("--target", default="brainwave", help="target whose hardware rules and tile size to list")
    r.add_argument("--native-dim", type=int, help="native dimension of the target")
    r.add_argument("--json", action="store_true", help="print a JSON list")
    r.set_defaults(run=_rules)
    return p


def _positive(text: str) -> int:
    """An integer of at least 1 (argparse type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


def _alternatives(r) -> list[str]:
    """The alternatives table: predicted and simulated cycles, and the ops that differ from the best."""
    if not r.alternatives and not r.unbuildable:
        return []
    lines = [f"  alternatives  {'#':>2} {'predicted':>10} {'simulated':>10}  ops vs best",
             f"                {1:>2} {r.predicted_cycles:>10.0f} {r.cycles:>10}  (best)"]
    for i, a in enumerate(r.alternatives, 2):
        diff = a.alternative_dict(r)["ops_vs_best"]
        lines.append(f"                {i:>2} {a.predicted_cycles:>10.0f} {a.cycles:>10}  "
                     + (", ".join(f"{op} {n:+d}" for op, n in diff.items()) or "same ops, other order or layout"))
    lines += [f"  not buildable {why}" for why in r.unbuildable]
    return lines


def _ilp(x: dict) -> str:
    """The ILP's outcome for the summary line (nothing for greedy)."""
    if x["extractor"] != "ilp":
        return ""
    gap = "" if x["status"] == "optimal" else f", gap {x['gap']:.1%}"
    return (f" (ILP: {x['status']}{gap}; greedy's program {x['greedy_cycles']:.0f} predicted, "
            f"{x['greedy_shared_cycles']:.0f} with shared sub-terms paid once)")


def _summary(r) -> str:
    e = r.egraph
    stop = "saturated" if e.saturated else f"stopped: {e.stop_reason}; best program found so far"
    ops = ", ".join(f"{k} x{v}" for k, v in r.ops.items())
    return "\n".join([
        f"{' -> '.join(r.layers)} on {r.target}: input {'x'.join(map(str, r.input_shape))} -> "
        f"output {'x'.join(map(str, r.output_shape))}",
        f"  cycles        {r.cycles} simulated, {r.predicted_cycles:.0f} predicted, {r.roofline_cycles:.0f} roofline "
        f"(efficiency {r.efficiency:.2f}); setup {r.setup_cycles}",
        f"  accuracy      max abs error {r.max_abs_error:.2e}, max rel error {r.max_rel_error:.2e} vs numpy"
        if r.output is not None else "  accuracy      not checked (timing-only simulation)",
        f"  e-graph       {e.enodes} e-nodes, {e.eclasses} e-classes, {e.iterations} iterations, {stop}, "
        f"{e.seconds:.2f} s (serialized and indexed in {e.serialize_seconds:.2f} s); "
        f"extraction {r.extract_seconds:.2f} s{_ilp(r.extraction)}",
        f"  program       {r.instructions} instructions, {r.dynamic_instructions} executed: {ops}",
        _units(r),
        *_alternatives(r),
    ])


def _units(r) -> str:
    """Each unit done when, predicted / simulated (its busy cycles), and the model's chain; the
    longest of each side marked, so a misprediction shows which unit the model got wrong."""
    rows = r.units_dict()
    top = {side: max(x[side] for x in rows.values() if side in x) for side in ("predicted", "simulated")}

    def cell(u: str, side: str) -> str:
        v = rows[u].get(side)
        return "-" if v is None else f"{v:.0f}{'*' if v == top[side] else ''}"

    parts = [f"{u} {cell(u, 'predicted')}/{cell(u, 'simulated')}" + (f" ({rows[u]['busy']} busy)" if "busy" in rows[u] else "")
             for u in rows]
    return f"  units         done at, predicted/simulated: {', '.join(parts)}"


def _comparison(c: Comparison) -> str:
    """Several targets from one e-graph: a table side by side, then each target's summary."""
    e = c.egraph
    head = [f"{' -> '.join(c.layers)}: input {'x'.join(map(str, c.input_shape))}; shared e-graph {e.enodes} e-nodes, "
            f"{e.eclasses} e-classes, {e.iterations} iterations, {e.seconds:.2f} s; then each target's rules",
            f"  {'target':<12} {'simulated':>12} {'predicted':>12} {'efficiency':>10} {'e-nodes':>8} {'saturation':>10}"]
    head += [f"  {r.target:<12} {r.cycles:>12} {r.predicted_cycles:>12.0f} {r.efficiency:>10.3f} {r.egraph.enodes:>8} "
             f"{r.egraph.seconds:>9.2f}s" for r in c.results]
    head += [f"  {name:<12} no program: {why}" for name, why in c.failures.items()]
    return "\n\n".join(["\n".join(head)] + [_summary(r) for r in c.results])


def _optimize(args: argparse.Namespace) -> str:
    """`liftsat optimize`: compile, simulate, report (one target, or several side by side)."""
    shape = parse_shape(args.input)
    budget = Budget(nodes=args.max_nodes, iterations=args.max_iterations, seconds=args.max_seconds)
    targets = get_targets(args.target, args.native_dim)
    if len(targets) == 1 and args.target != "all":
        result = optimize(args.layers, shape, targets[0], seed=args.seed, budget=budget,
                          functional=not args.timing_only, alternatives=args.alternatives,
                          extractor=args.extractor, time_limit=args.ilp_time_limit)
        if args.json:
            return json.dumps(result.as_dict(), indent=2)
        return result.listing if args.listing else _summary(result)
    comparison = optimize_targets(args.layers, shape, targets, seed=args.seed, budget=budget,
                                  functional=not args.timing_only, alternatives=args.alternatives,
                                  extractor=args.extractor, time_limit=args.ilp_time_limit)
    if not comparison.results:
        raise ExtractionError("no target has a program: " + "; ".join(comparison.failures.values()))
    if args.json:
        return json.dumps(comparison.as_dict(), indent=2)
    if args.listing:
        return "\n\n".join(f"; {r.target}\n{r.listing}" for r in comparison.results)
    return _comparison(comparison)


def _size(nbytes: int) -> str:
    """Bytes in the largest binary unit that divides them."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _targets(args: argparse.Namespace) -> str:
    """`liftsat targets`: the built-in targets' key numbers."""
    items = [summary(get_target(name)) for name in BUILTIN]
    if args.json:
        return json.dumps(items, indent=2)
    return "\n".join(
        f"{d['name']}: native dim {d['native_dim']}, {d['clock_mhz']:g} MHz, {d['peak_macs_per_cycle']} MACs/cycle, "
        f"DRAM {d['dram_bytes_per_cycle']} B/cycle\n"
        f"  memories  {', '.join(f'{m} {_size(c)}' for m, c in d['memory_bytes'].items())}\n"
        f"  ops       {', '.join(d['ops'])}"
        for d in items)


def _rules(args: argparse.Namespace) -> str:
    """`liftsat rules`: the rule catalogue."""
    rows = rule_rows([get_target(args.target, args.native_dim)])
    if args.json:
        return json.dumps(rows, indent=2)
    return "\n".join(
        f"{r['level']:<12} {r['name']}\n  means     {r['meaning']}\n  when      {r['condition']}\n"
        f"  tested by {r['test']}"
        for r in rows)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        text = args.run(args)
    except USER_ERRORS as exc:
        print(f"liftsat: error: {exc}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
