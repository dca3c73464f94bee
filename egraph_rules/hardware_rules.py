"""Hardware rules, generated from device-operator descriptions: "this pattern at this size is
that device op", with the moves of its operands into the memories the op reads."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from egraph_rules.ir import T, Term, fin, fout
from egraph_rules.rules import Rule


@dataclass(frozen=True)
class DeviceOp:
    """A device operator as the e-graph sees it: its meaning (an IR function at a fixed type),
    the memory each operand must be in, and the memory its result lands in."""

    name: str
    meaning: Term
    operand_spaces: tuple[str, ...]
    result_space: str

    @property
    def term(self) -> Term:
        """The Dev node standing for this operator."""
        return T("Dev", self.name, fin(self.meaning), fout(self.meaning))


def _moves(op: DeviceOp) -> str:
    t = fin(op.meaning)
    if len(op.operand_spaces) == 1:
        return T("ToChip", op.operand_spaces[0], t).sexpr
    if len(op.operand_spaces) != 2 or t.op != "TP":
        raise ValueError(f"device op {op.name}: {len(op.operand_spaces)} operand spaces for input {t}")
    a, b = t.args
    fa = T("Comp", T("ToChip", op.operand_spaces[0], a), T("Fst", t))
    fb = T("Comp", T("ToChip", op.operand_spaces[1], b), T("Snd", t))
    return T("Fork", fa, fb).sexpr


def hardware_rules(ops: list[DeviceOp]) -> list[Rule]:
    """One rule per device op: its meaning is replaced by the op applied to its moved operands."""
    rules = []
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
    return rules
