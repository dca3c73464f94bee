"""DSL rules: layers rewritten into Lift patterns and arithmetic."""

from __future__ import annotations

import numpy as np

from egraph_rules.ir import T, Term, ta, tensor_type, ts
from egraph_rules.rules import Rule, rewrite


def _dims(rng: np.random.Generator) -> tuple[int, int]:
    return int(rng.integers(1, 40)), int(rng.integers(1, 40))


def _linear_example(rng: np.random.Generator) -> Term:
    n, k = _dims(rng)
    w = T("Var", "W", tensor_type("f32", (n, k)))
    b = T("Var", "b", ta(ts("f32"), n))
    return T("Linear", w, b, ta(ts("f32"), k))


def _linear_nb_example(rng: np.random.Generator) -> Term:
    n, k = _dims(rng)
    return T("LinearNB", T("Var", "W", tensor_type("f32", (n, k))), ta(ts("f32"), k))


def dsl_rules() -> list[Rule]:
    """Fully connected layers become a matrix-vector product plus a bias."""
    return [
        Rule(
            "linear-to-mvmul",
            "dsl",
            (
                rewrite(
                    "(Linear w b t)",
                    "(Comp (VVAdd (TP u u)) (Fork (Comp (MVMul (TP tw t)) (Fork (Const w t) (Id t))) (Const b t)))",
                    "dsl",
                    ["(= u (ty b))", "(= tw (ty w))"],
                ),
            ),
            "none",
            "Linear(W, b) x = VVAdd(MVMul(W, x), b)",
            _linear_example,
        ),
        Rule(
            "linear-nobias-to-mvmul",
            "dsl",
            (rewrite("(LinearNB w t)", "(Comp (MVMul (TP tw t)) (Fork (Const w t) (Id t)))", "dsl", ["(= tw (ty w))"]),),
            "none",
            "Linear(W, bias=False) x = MVMul(W, x)",
            _linear_nb_example,
        ),
    ]
