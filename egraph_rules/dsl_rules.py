"""DSL rules: layers rewritten into Lift patterns and arithmetic."""

from __future__ import annotations

import numpy as np

from egraph_rules.ir import RNN_NONLINEARITIES, T, Term, ta, tensor_type, ts
from egraph_rules.rules import Rule, rewrite


def _dims(rng: np.random.Generator) -> tuple[int, int]:
    return int(rng.integers(1, 40)), int(rng.integers(1, 40))


def _layer(bias: bool, out: int, k: int) -> Term:
    """Linear(k, out) with or without its bias, weights named W and b."""
    w = T("Var", "W", tensor_type("f32", (out, k)))
    return T("Linear", w, T("Var", "b", ta(ts("f32"), out)), ta(ts("f32"), k)) if bias else T("LinearNB", w, ta(ts("f32"), k))


def _linear_example(rng: np.random.Generator) -> Term:
    n, k = _dims(rng)
    return _layer(True, n, k)


def _mmmul_example(rng: np.random.Generator) -> Term:
    m, k, n = (int(rng.integers(1, 6)) for _ in range(3))
    return T("MMMul", T("TP", tensor_type("f32", (m, k)), tensor_type("f32", (k, n))))


def _linear_nb_example(rng: np.random.Generator) -> Term:
    n, k = _dims(rng)
    return _layer(False, n, k)


class _Cell:
    """egglog text of a recurrent cell's gate arithmetic over input pair type `p`: gate k's
    weights are rows [k*nh, (k+1)*nh) of PyTorch's stacked weight_ih / weight_hh / biases."""

    def __init__(self, p: str, x_len: str, gates: int):
        self.p, self.v = p, "(TA s nh)"
        self.x_len, self.gates = x_len, gates

    def const(self, e: str, rows: str, cols: str | None, k: int) -> str:
        stacked = f"(TA s (* {self.gates} nh))" if cols is None else f"(TA (TA s {cols}) (* {self.gates} nh))"
        return f"(Const (App (Slice (* {k} nh) nh {stacked}) {e}) {self.p})"

    def mv(self, w: str, cols: str, k: int, operand: str) -> str:
        return (f"(Comp (MVMul (TP (TA (TA s {cols}) nh) (TA s {cols}))) "
                f"(Fork {self.const(w, 'nh', cols, k)} {operand}))")

    def op2(self, op: str, f: str, g: str, t: str | None = None) -> str:
        t = t or self.v
        return f"(Comp ({op} (TP {t} {t})) (Fork {f} {g}))"

    def op1(self, op: str, f: str) -> str:
        return f"(Comp ({op} {self.v}) {f})"

    def gate_in(self, k: int, x: str) -> str:
        return self.op2("VVAdd", self.mv("wi", self.x_len, k, x), self.const("bi", "nh", None, k))

    def gate_h(self, k: int, h: str) -> str:
        return self.op2("VVAdd", self.mv("wh", "nh", k, h), self.const("bh", "nh", None, k))


def _gru_rhs() -> str:
    p = "(TP (TA s ni) (TA s nh))"
    c = _Cell(p, "ni", 3)
    x, h = f"(Fst {p})", f"(Snd {p})"
    r = c.op1("VVSigm", c.op2("VVAdd", c.gate_in(0, x), c.gate_h(0, h)))
    z = c.op1("VVSigm", c.op2("VVAdd", c.gate_in(1, x), c.gate_h(1, h)))
    n = c.op1("VVTanh", c.op2("VVAdd", c.gate_in(2, x), c.op2("VVMul", r, c.gate_h(2, h))))
    return c.op2("VVAdd", n, c.op2("VVMul", z, c.op2("VVSub", h, n)))


def _lstm_rhs() -> str:
    p = "(TP (TA s ni) (TP (TA s nh) (TA s nh)))"
    c = _Cell(p, "ni", 4)
    st = "(TP (TA s nh) (TA s nh))"
    x, h, cc = f"(Fst {p})", f"(Comp (Fst {st}) (Snd {p}))", f"(Comp (Snd {st}) (Snd {p}))"
    g = [c.op2("VVAdd", c.gate_in(k, x), c.gate_h(k, h)) for k in range(4)]
    i, f, cand, o = c.op1("VVSigm", g[0]), c.op1("VVSigm", g[1]), c.op1("VVTanh", g[2]), c.op1("VVSigm", g[3])
    c2 = c.op2("VVAdd", c.op2("VVMul", f, cc), c.op2("VVMul", i, cand))
    return f"(Fork {c.op2('VVMul', o, c.op1('VVTanh', c2))} {c2})"


def _rnn_rhs(nonlinearity: str) -> str:
    """act(W_ih x + b_ih + W_hh h + b_hh) over the pair (x, h), act the cell's nonlinearity."""
    p = "(TP (TA s ni) (TA s nh))"
    v = "(TA s nh)"

    def mv(w: str, cols: str, operand: str) -> str:
        return f"(Comp (MVMul (TP (TA (TA s {cols}) nh) (TA s {cols}))) (Fork (Const {w} {p}) {operand}))"

    def add(f: str, g: str) -> str:
        return f"(Comp (VVAdd (TP {v} {v})) (Fork {f} {g}))"

    gate_x = add(mv("wi", "ni", f"(Fst {p})"), f"(Const bi {p})")
    pre = add(gate_x, add(mv("wh", "nh", f"(Snd {p})"), f"(Const bh {p})"))
    return f"(Comp ({RNN_NONLINEARITIES[nonlinearity]} {v}) {pre})"


def _rnn_example(nonlinearity: str):
    def example(rng: np.random.Generator) -> Term:
        ni, nh = int(rng.integers(1, 6)), int(rng.integers(1, 6))
        s = ts("f32")
        ws = [T("Var", "Wi", tensor_type("f32", (nh, ni))), T("Var", "Wh", tensor_type("f32", (nh, nh))),
              T("Var", "bi", ta(s, nh)), T("Var", "bh", ta(s, nh))]
        return T("RNNCell", *ws, nonlinearity, T("TP", ta(s, ni), ta(s, nh)))

    return example


def _batched_example(bias: bool):
    def example(rng: np.random.Generator) -> Term:
        n, k, o = int(rng.integers(1, 5)), int(rng.integers(1, 6)), int(rng.integers(1, 6))
        return T("Map", _layer(bias, o, k), n)

    return example


def _banded_example(resident: int, bias: bool):
    def example(rng: np.random.Generator) -> Term:
        k, o = int(rng.integers(2, 4)), 4
        rows = resident // 4 // (o + k)
        return T("Map", _layer(bias, o, k), rows + int(rng.integers(1, rows + 2)))

    return example


def _cell_example(op: str):
    def example(rng: np.random.Generator) -> Term:
        ni, nh = int(rng.integers(1, 6)), int(rng.integers(1, 6))
        gates = 3 if op == "GRUCell" else 4
        s = ts("f32")
        ws = [T("Var", "Wi", tensor_type("f32", (gates * nh, ni))), T("Var", "Wh", tensor_type("f32", (gates * nh, nh))),
              T("Var", "bi", ta(s, gates * nh)), T("Var", "bh", ta(s, gates * nh))]
        state = ta(s, nh) if op == "GRUCell" else T("TP", ta(s, nh), ta(s, nh))
        return T(op, *ws, T("TP", ta(s, ni), state))

    return example


def band_rules(resident: int = 1 << 20) -> list[Rule]:
    """A batch of rows in bands whose rows and results take at most a quarter of `resident`
    elements: the target's memory sizes decide. Whether the weights fit on chip does not: with
    weights that do not, a band runs weight-stationary, one pass over the weights per band; with
    pinned weights, a band's products of one weight tile run back to back, so its accumulation
    steps hide the adds' latency (VTA's 3x3 convolution 16->32 + ReLU: 132,956 cycles row by
    row, 16,852 in bands, where the rule needed weights larger than the chip)."""
    return [
        Rule(
            "batched-linear-bands",
            "dsl",
            tuple(
                rewrite(
                    f"(Map ({layer} (TA s k)) n)",
                    "(Comp (Slice 0 n (TA (TA s o) (* r nb))) (Comp (Join (TA (TA (TA s o) r) nb)) "
                    f"(Comp (Map (Map ({layer} (TA s k)) r) nb) (Comp (Split r (TA (TA s k) (* r nb))) "
                    "(Pad 0 (- (* r nb) n) (TA (TA s k) n))))))",
                    "dsl",
                    ["(= (TA (TA s k) o) (ty w))", f"(= r (/ {resident // 4} (+ o k)))", "(>= r 2)", "(< r n)",
                     "(= nb (/ (+ n (- r 1)) r))"],
                )
                for layer in ("Linear w b", "LinearNB w")
            ),
            f"bands of r = {resident // 4} / (k + o) rows (a quarter of the result memory: the rest holds "
            f"weight blocks, copies and outputs), at least 2 and fewer than the rows, padded to whole bands",
            "Linear over n rows = Linear over bands of r rows (the last band padded with zero rows, their "
            "results dropped): each band's rows and results fit on chip, so each band's GEMM can run "
            "weight-stationary (mmmul-weight-stationary-tiles)",
            _banded_example(resident, True),
            _banded_example(resident, False),
        ),
    ]


def dsl_rules() -> list[Rule]:
    """Fully connected layers become a matrix-vector product plus a bias (a batch of rows: a
    GEMM); cells become their gate arithmetic. The same for every target."""
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
        Rule(
            "batched-linear-to-gemm",
            "dsl",
            (
                rewrite(
                    "(Map (Linear w b (TA s k)) n)",
                    "(Comp (Map (Comp (VVAdd (TP u u)) (Fork (Id u) (Const b u))) n) "
                    "(Comp (MMMul (TP (TA (TA s k) n) (TA (TA s o) k))) "
                    "(Fork (Id (TA (TA s k) n)) (Const (App (Transpose (TA (TA s k) o)) w) (TA (TA s k) n)))))",
                    "dsl",
                    ["(= u (ty b))", "(= (TA (TA s k) o) (ty w))"],
                ),
                rewrite(
                    "(Map (LinearNB w (TA s k)) n)",
                    "(Comp (MMMul (TP (TA (TA s k) n) (TA (TA s o) k))) "
                    "(Fork (Id (TA (TA s k) n)) (Const (App (Transpose (TA (TA s k) o)) w) (TA (TA s k) n))))",
                    "dsl",
                    ["(= (TA (TA s k) o) (ty w))"],
                ),
            ),
            "none",
            "Linear(W, b) over the rows X of a batch (or the windows of a convolution) = X . W^T, then + b per "
            "row: one GEMM, which tiling rules may run weight-stationary",
            _batched_example(True),
            _batched_example(False),
        ),
        Rule(
            "mmmul-to-mvmul-rows",
            "dsl",
            (rewrite(
                "(MMMul (TP (TA (TA s k) m) (TA (TA s n) k)))",
                "(Comp (Map (Comp (MVMul (TP (TA (TA s k) n) (TA s k))) (Fork (Comp (Transpose (TA (TA s n) k)) "
                "(Snd (TP (TA s k) (TA (TA s n) k)))) (Fst (TP (TA s k) (TA (TA s n) k))))) m) "
                "(DistR (TP (TA (TA s k) m) (TA (TA s n) k))))",
                "dsl"),),
            "none",
            "A . B = Map over the rows a of A of MVMul(transpose B, a): a GEMM is matrix-vector products",
            _mmmul_example,
        ),
        Rule(
            "grucell-to-gates",
            "dsl",
            (rewrite("(GRUCell wi wh bi bh (TP (TA s ni) (TA s nh)))", _gru_rhs(), "dsl"),),
            "none",
            "GRUCell = r, z, n gates from row blocks of the stacked weights; h' = n + z (h - n) "
            "(n appears twice: one e-class, computed once by codegen)",
            _cell_example("GRUCell"),
        ),
        Rule(
            "lstmcell-to-gates",
            "dsl",
            (rewrite("(LSTMCell wi wh bi bh (TP (TA s ni) (TP (TA s nh) (TA s nh))))", _lstm_rhs(), "dsl"),),
            "none",
            "LSTMCell = i, f, g, o gates from row blocks of the stacked weights; c' = f c + i g, h' = o tanh(c')",
            _cell_example("LSTMCell"),
        ),
        Rule(
            "rnncell-to-gates",
            "dsl",
            tuple(rewrite(f'(RNNCell wi wh bi bh "{act}" (TP (TA s ni) (TA s nh)))', _rnn_rhs(act), "dsl")
                  for act in RNN_NONLINEARITIES),
            "none",
            "RNNCell = act(W_ih x + b_ih + W_hh h + b_hh), act tanh or relu (its nonlinearity)",
            *(_rnn_example(act) for act in RNN_NONLINEARITIES),
        ),
    ]
