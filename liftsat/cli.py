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
from liftsat.api import optimize
from liftsat.rule_table import rule_rows
from liftsat.targets import BUILTIN, TargetError, get_target, summary

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
                   help="built-in target name, or the path of a .toml target description (default brainwave)")
    o.add_argument("--native-dim", type=int, help="native dimension of the target (brainwave: 128, 64 or 32)")
    o.add_argument("--seed", type=int, default=0, help="seed of the random inputs and weights (default 0)")
    o.add_argument("--timing-only", action="store_true",
                   help="simulate without data (any size; output not checked against numpy)")
    o.add_argument("--max-nodes", type=int, default=Budget.nodes, help="e-node budget of saturation")
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
        f"{e.seconds:.2f} s; extraction {r.extract_seconds:.2f} s",
        f"  program       {r.instructions} instructions, {r.dynamic_instructions} executed: {ops}",
    ])


def _optimize(args: argparse.Namespace) -> str:
    """`liftsat optimize`: compile, simulate, report."""
    shape = parse_shape(args.input)
    budget = Budget(nodes=args.max_nodes, iterations=args.max_iterations, seconds=args.max_seconds)
    result = optimize(args.layers, shape, args.target, seed=args.seed, native_dim=args.native_dim, budget=budget,
                      functional=not args.timing_only)
    if args.json:
        return json.dumps(result.as_dict(), indent=2)
    return result.listing if args.listing else _summary(result)


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
