"""Hardware rules, generated from device-operator descriptions: "this pattern at this size is
that device op", with the moves of its operands into the memories the op reads."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from egraph_rules.ir import T, Term, fin, fout
from egraph_rules.rules import Rule, chain_rewrites


@dataclass(frozen=True)
class DeviceOp:
    """A device operator as the e-graph sees it: its meaning (an IR function at a fixed type),
    the memory each operand must be in, and the memory its result lands in."""

    name: str
    meaning: Term
    operand_spaces: tuple[str, ...]
    result_space: str

    @property
    def operands(self) -> tuple[tuple[Term, str], ...]:
        """(type, memory) of each operand: the op's input for one operand, the parts of its
        input pair for two."""
        t = fin(self.meaning)
        if len(self.operand_spaces) == 1:
            return ((t, self.operand_spaces[0]),)
        if len(self.operand_spaces) != 2 or t.op != "TP":
            raise ValueError(f"device op {self.name}: {len(self.operand_spaces)} operand spaces for input {t}")
        return tuple(zip(t.args, self.operand_spaces))

    @property
    def is_matrix(self) -> bool:
        """Whether it multiplies by a matrix (MVMul, MMMul): the ops that read weights."""
        return self.meaning.op in ("MVMul", "MMMul")

    @property
    def term(self) -> Term:
        """The Dev node standing for this operator."""
        return T("Dev", self.name, fin(self.meaning), fout(self.meaning))


def _moves(op: DeviceOp) -> str:
    moves = [T("ToChip", space, t) for t, space in op.operands]
    if len(moves) == 1:
        return moves[0].sexpr
    t = fin(op.meaning)
    return T("Fork", T("Comp", moves[0], T("Fst", t)), T("Comp", moves[1], T("Snd", t))).sexpr


def _generalized(t: Term, n: int, conds: list[str]) -> str:
    """Pattern text for any type of the same shape rank whose array lengths are multiples of
    n, with the element types kept; appends the divisibility conditions to conds (its length
    numbers the dimension variables, so patterns built with one list never share a name)."""

    def go(u: Term) -> str:
        if u.op == "TA":
            v = f"d{len(conds)}"
            conds.append(f"(= 0 (% {v} {n}))")
            return f"(TA {go(u.args[0])} {v})"
        if u.op == "TP":
            return f"(TP {go(u.args[0])} {go(u.args[1])})"
        return u.sexpr

    return go(t)


def early_move_rule(op: DeviceOp, native: int) -> Rule:
    """Where the operands of an op the device runs are produced, they may move, whole, to the
    memories the device reads them from before the op is tiled: that is how a weight becomes
    resident (pinned) on chip. Anchored at the Fork producing the operands, so that moving twice
    is the same as moving once (ToChip . ToChip is elided) and saturation stays bounded."""
    t = fin(op.meaning)
    conds: list[str] = []
    if t.op == "TP":
        first, second = _generalized(t.args[0], native, conds), _generalized(t.args[1], native, conds)
        pat = f"(TP {first} {second})"
    else:
        pat = _generalized(t, native, conds)
    generic = f"({op.meaning.op} {pat})"
    if t.op == "TP":
        lhs = f"(Comp {generic} (Fork g h))"
        rhs = (f"(Comp {generic} (Fork (Comp (ToChip \"{op.operand_spaces[0]}\" {first}) g) "
               f"(Comp (ToChip \"{op.operand_spaces[1]}\" {second}) h)))")
    else:
        lhs = f"(Comp {generic} g)"
        rhs = f"(Comp {generic} (Comp (ToChip \"{op.operand_spaces[0]}\" {pat}) g))"
    text = f"(rewrite {lhs} {rhs} :when ({' '.join(conds)}) :ruleset hardware)"

    def example(rng: np.random.Generator, t: Term = t) -> Term:
        big = _scaled(t, int(rng.integers(1, 3)))
        operands = T("Fork", T("Fst", big), T("Snd", big)) if big.op == "TP" else T("Id", big)
        return T("Comp", T(op.meaning.op, big), operands)

    return Rule(f"move-early:{op.name}", "hardware", (text,), f"every length a multiple of {native}",
                f"{op.meaning.op} . Fork(g, h) = {op.meaning.op} . Fork(ToChip . g, ToChip . h): operands move "
                f"to {', '.join(op.operand_spaces)} before tiling", example)


def _scaled(t: Term, k: int) -> Term:
    if t.op == "TA":
        return T("TA", _scaled(t.args[0], k), t.args[1] * k)
    if t.op == "TP":
        return T("TP", _scaled(t.args[0], k), _scaled(t.args[1], k))
    return t


def hardware_rules(ops: list[DeviceOp], native: int) -> list[Rule]:
    """Per device op: its meaning is replaced by the op applied to its moved operands, and a
    store of its result by the op with the store chained (`store_chain_rule`); and for the ops
    that read a matrix, moving operands before tiling."""
    rules = [early_move_rule(op, native) for op in ops if op.is_matrix]
    for op in ops:
        dev = op.term.sexpr
        text = (
            f"(rule ((= f {op.meaning.sexpr})) "
            f"((union f (Comp {dev} {_moves(op)})) (inspace {dev} \"{op.result_space}\")) "
            f":ruleset hardware)"
        )

        def example(rng: np.random.Generator, meaning: Term = op.meaning) -> Term:
            return meaning

        rules.append(Rule(f"hw:{op.name}", "hardware", (text,), f"operands exactly {fin(op.meaning)}",
                          f"{op.meaning.op} at this size is device op {op.name}", example))
        rules.append(store_chain_rule(op))
    return rules


def store_chain_rule(op: DeviceOp) -> Rule:
    """Storing the op's result = the op with its store chained to it (`DevOut`): one e-node the
    cost model prices as a pipeline, each result stored while the op computes the next, which a
    cost linear per e-node cannot see in the op and the store apart."""
    out = fout(op.meaning)
    chained = T("DevOut", op.name, fin(op.meaning), out)

    def example(rng: np.random.Generator) -> Term:
        return T("Comp", T("ToOutput", out), op.term)

    return Rule(f"hw-out:{op.name}", "hardware",
                chain_rewrites([T("ToOutput", out).sexpr, op.term.sexpr], [chained.sexpr], "hardware"),
                "none", f"ToOutput . {op.name} = {op.name} with its store chained", example)
