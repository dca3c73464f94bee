"""Small builders for the example terms that rules carry (their property tests evaluate them)."""

from __future__ import annotations

import numpy as np

from egraph_rules.ir import T, Term, ta, tensor_type, ts

F32 = ts("f32")


def vec(n: int) -> Term:
    """An f32 vector type of n elements."""
    return ta(F32, n)


def mat(n: int, k: int) -> Term:
    """An f32 matrix type of n rows of k elements."""
    return tensor_type("f32", (n, k))


def var(name: str, t: Term) -> Term:
    """A named input of type t."""
    return T("Var", name, t)


def pick(rng: np.random.Generator, lo: int, hi: int) -> int:
    """A random int in [lo, hi]."""
    return int(rng.integers(lo, hi + 1))
