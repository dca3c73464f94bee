"""DSL rules: layers rewritten into Lift patterns and arithmetic."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import numpy as np

from egraph_rules.ir import RNN_NONLINEARITIES, T, Term, numel, ta, tensor_type, ts
from egraph_rules.rules import Rule, chain, rewrite, shared_rewrite


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
        self.p, self.n, self.v = p, "nh", "(TA s nh)"
        self.x_len, self.gates = x_len, gates

    def const(self, e: str, cols: str | None, k: int) -> str:
        stacked = f"(TA s (* {self.gates} nh))" if cols is None else f"(TA (TA s {cols}) (* {self.gates} nh))"
        return f"(Const (App (Slice (* {k} nh) nh {stacked}) {e}) {self.p})"

    def mv(self, w: str, cols: str, k: int, operand: str) -> str:
        return (f"(Comp (MVMul (TP (TA (TA s {cols}) {self.n}) (TA s {cols}))) "
                f"(Fork {self.const(w, cols, k)} {operand}))")

    def op2(self, op: str, f: str, g: str, t: str | None = None) -> str:
        t = t or self.v
        return f"(Comp ({op} (TP {t} {t})) (Fork {f} {g}))"

    def op1(self, op: str, f: str) -> str:
        return f"(Comp ({op} {self.v}) {f})"

    def gate_in(self, k: int, x: str) -> str:
        return self.op2("VVAdd", self.mv("wi", self.x_len, k, x), self.const("bi", None, k))

    def gate_h(self, k: int, h: str) -> str:
        return self.op2("VVAdd", self.mv("wh", "nh", k, h), self.const("bh", None, k))


def _gru_rhs() -> str:
    p = "(TP (TA s ni) (TA s nh))"
    c = _Cell(p, "ni", 3)
    x, h = f"(Fst {p})", f"(Snd {p})"
    r = c.op1("VVSigm", c.op2("VVAdd", c.gate_in(0, x), c.gate_h(0, h)))
    z = c.op1("VVSigm", c.op2("VVAdd", c.gate_in(1, x), c.gate_h(1, h)))
    n = c.op1("VVTanh", c.op2("VVAdd", c.gate_in(2, x), c.op2("VVMul", r, c.gate_h(2, h))))
    return c.op2("VVAdd", n, c.op2("VVMul", z, c.op2("VVSub", h, n)))


class _BlockCell(_Cell):
    """egglog text of the gate arithmetic of a block of k hidden units of a cell: its input `p`
    is (((wi_j, wh_j), ((bi_j, bh_j), c_j)), (x, h)), gate g's weights rows [g*k, (g+1)*k) of
    the block's stacked rows wi_j, wh_j, bi_j, bh_j."""

    def __init__(self, k: int, gates: int):
        self.n, self.v, self.gates, self.x_len = str(k), f"(TA s {k})", gates, "ni"
        rows = gates * k
        self.wi, self.wh, self.b = f"(TA (TA s ni) {rows})", f"(TA (TA s nh) {rows})", f"(TA s {rows})"
        self.weights = f"(TP (TP {self.wi} {self.wh}) (TP (TP {self.b} {self.b}) {self.v}))"
        self.p = f"(TP {self.weights} (TP (TA s ni) (TA s nh)))"

    def part(self, path: str) -> str:
        """The part of the input at `path`, a string of 'f' (Fst) and 's' (Snd), outermost first."""
        w, ws, bs = self.weights, f"(TP {self.wi} {self.wh})", f"(TP (TP {self.b} {self.b}) {self.v})"
        types = {"": self.p, "f": w, "s": "(TP (TA s ni) (TA s nh))", "ff": ws, "fs": bs, "fsf": f"(TP {self.b} {self.b})"}
        stages = [f"({'Fst' if d == 'f' else 'Snd'} {types[path[:i]]})" for i, d in enumerate(path)]
        return chain(list(reversed(stages)), None)

    def const(self, e: str, cols: str | None, k: int) -> str:
        stacked = self.b if cols is None else self.wi if e == "wi" else self.wh
        path = {"wi": "fff", "wh": "ffs", "bi": "fsff", "bh": "fsfs"}[e]
        return f"(Comp (Slice {k * int(self.n)} {self.n} {stacked}) {self.part(path)})"


def _lstm_rhs() -> str:
    p = "(TP (TA s ni) (TP (TA s nh) (TA s nh)))"
    c = _Cell(p, "ni", 4)
    st = "(TP (TA s nh) (TA s nh))"
    x, h, cc = f"(Fst {p})", f"(Comp (Fst {st}) (Snd {p}))", f"(Comp (Snd {st}) (Snd {p}))"
    g = [c.op2("VVAdd", c.gate_in(k, x), c.gate_h(k, h)) for k in range(4)]
    i, f, cand, o = c.op1("VVSigm", g[0]), c.op1("VVSigm", g[1]), c.op1("VVTanh", g[2]), c.op1("VVSigm", g[3])
    c2 = c.op2("VVAdd", c.op2("VVMul", f, cc), c.op2("VVMul", i, cand))
    return f"(Fork {c.op2('VVMul', o, c.op1('VVTanh', c2))} {c2})"


def _by_block(elem: str, k: int, first: int, gates: int, stacked: int) -> str:
    """Host re-indexing of a stacked weight or bias (`stacked` gates of nh rows of type `elem`) to
    the rows of gates first .. first + gates - 1 in nh/k blocks, block j the rows [j*k, (j+1)*k)
    of every one of those gates, gate by gate."""
    start, rows = {0: "0", 3: "nh3"}[first], {1: "nh", 3: "nh3"}[gates]  # nh3 = 3 nh, nh4 = 4 nh, nb = nh / k
    parts = [f"(Map (Join (TA (TA {elem} {k}) {gates})) nb)", f"(Transpose (TA (TA (TA {elem} {k}) nb) {gates}))",
             f"(Map (Split {k} (TA {elem} nh)) {gates})", f"(Split nh (TA {elem} {rows}))"]
    if gates != stacked:
        parts.append(f"(Slice {start} {rows} (TA {elem} nh{stacked}))")
    return chain(parts, None)


def _blocked(k: int, inp: str, parts: tuple[str, str, str], first: int, gates: int, stacked: int,
             body: Callable[[_BlockCell], str]) -> str:
    """A function of `inp` computing an nh-vector as a Map over blocks of k hidden units: block j
    gets rows [j*k, (j+1)*k) of gates first .. first + gates - 1 of the weights stacked for
    `stacked` gates, block j of the vector parts[2], and the whole x and h (parts[0], parts[1]);
    body(cell) is its arithmetic (cell: a _BlockCell); the blocks' results are joined."""
    x, h, c = parts
    cell = _BlockCell(k, gates)
    v = cell.v

    def weights(e: str, row: str | None) -> str:
        elem = "s" if row is None else f"(TA s {row})"
        return f"(Const (App {_by_block(elem, k, first, gates, stacked)} {e}) {inp})"

    def zipped(a: str, b: str, ta_: str, tb: str) -> str:
        return f"(Comp (Zip (TP (TA {ta_} nb) (TA {tb} nb))) (Fork {a} {b}))"

    ws = zipped(weights("wi", "ni"), weights("wh", "nh"), cell.wi, cell.wh)
    bs = zipped(zipped(weights("bi", None), weights("bh", None), cell.b, cell.b),
                f"(Comp (Split {k} (TA s nh)) {c})", f"(TP {cell.b} {cell.b})", v)
    blocks = zipped(ws, bs, f"(TP {cell.wi} {cell.wh})", f"(TP (TP {cell.b} {cell.b}) {v})")
    return chain([f"(Join (TA {v} nb))", f"(Map {body(cell)} nb)",
                  f"(DistR (TP (TA {cell.weights} nb) (TP (TA s ni) (TA s nh))))", f"(Fork {blocks} (Fork {x} {h}))"],
                 None)


def _lstm_blocks_rhs(k: int) -> str:
    """An LSTM cell block by block of k hidden units: c' = f c + i g from a Map over blocks of
    gates i, f, g and c, then h' = o tanh(c') from a Map over blocks of gate o and c' (no value
    spans the hidden size but c' and h')."""
    p, st = "(TP (TA s ni) (TP (TA s nh) (TA s nh)))", "(TP (TA s nh) (TA s nh))"
    pc = f"(TP {p} (TA s nh))"

    def c_body(c: _BlockCell) -> str:
        x, h, cc = c.part("sf"), c.part("ss"), c.part("fss")
        g = [c.op2("VVAdd", c.gate_in(i, x), c.gate_h(i, h)) for i in range(3)]
        return c.op2("VVAdd", c.op2("VVMul", c.op1("VVSigm", g[1]), cc),
                     c.op2("VVMul", c.op1("VVSigm", g[0]), c.op1("VVTanh", g[2])))

    def h_body(c: _BlockCell) -> str:
        x, h, c2 = c.part("sf"), c.part("ss"), c.part("fss")
        o = c.op1("VVSigm", c.op2("VVAdd", c.gate_in(0, x), c.gate_h(0, h)))
        return c.op2("VVMul", o, c.op1("VVTanh", c2))

    c_new = _blocked(k, p, (f"(Fst {p})", f"(Comp (Fst {st}) (Snd {p}))", f"(Comp (Snd {st}) (Snd {p}))"), 0, 3, 4,
                     c_body)
    h_new = _blocked(k, pc, (f"(Comp (Fst {p}) (Fst {pc}))", f"(Comp (Fst {st}) (Comp (Snd {p}) (Fst {pc})))",
                             f"(Snd {pc})"), 3, 1, 4, h_body)
    return f"(Fork (Comp {h_new} (Fork (Id {p}) {c_new})) {c_new})"


def _gru_blocks_rhs(k: int) -> str:
    """A GRU cell block by block of k hidden units: h' = n + z (h - n) from a Map over blocks of
    gates r, z, n and h (every gate's arithmetic is per hidden unit)."""
    p = "(TP (TA s ni) (TA s nh))"

    def body(c: _BlockCell) -> str:
        x, h, hj = c.part("sf"), c.part("ss"), c.part("fss")
        r = c.op1("VVSigm", c.op2("VVAdd", c.gate_in(0, x), c.gate_h(0, h)))
        z = c.op1("VVSigm", c.op2("VVAdd", c.gate_in(1, x), c.gate_h(1, h)))
        n = c.op1("VVTanh", c.op2("VVAdd", c.gate_in(2, x), c.op2("VVMul", r, c.gate_h(2, h))))
        return c.op2("VVAdd", n, c.op2("VVMul", z, c.op2("VVSub", hj, n)))

    return _blocked(k, p, (f"(Fst {p})", f"(Snd {p})", f"(Snd {p})"), 0, 3, 3, body)


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


def _banded_example(bias: bool, resident: int, apart: tuple[int, int] | None = None):
    """A Linear of o = 4 outputs over more rows than one band holds: a band of `band_rules`'
    quarter of `resident`, or its wider band where rows and results are `apart`."""
    def example(rng: np.random.Generator) -> Term:
        k, o = int(rng.integers(2, 4)), 4
        r = resident // 4 // (o + k) if apart is None else min(apart[0] // k, apart[1] // o)
        return T("Map", _layer(bias, o, k), r + int(rng.integers(1, r + 2)))

    return example


def _cell(op: str, ni: int, nh: int) -> Term:
    """A GRUCell or LSTMCell of ni inputs and nh hidden units, weights named Wi, Wh, bi, bh."""
    gates = 3 if op == "GRUCell" else 4
    s = ts("f32")
    ws = [T("Var", "Wi", tensor_type("f32", (gates * nh, ni))), T("Var", "Wh", tensor_type("f32", (gates * nh, nh))),
          T("Var", "bi", ta(s, gates * nh)), T("Var", "bh", ta(s, gates * nh))]
    state = ta(s, nh) if op == "GRUCell" else T("TP", ta(s, nh), ta(s, nh))
    return T(op, *ws, T("TP", ta(s, ni), state))


def _cell_example(op: str):
    def example(rng: np.random.Generator) -> Term:
        return _cell(op, int(rng.integers(1, 6)), int(rng.integers(1, 6)))

    return example


def band_rules(resident: int = 1 << 20, apart: tuple[int, int] | None = None) -> list[Rule]:
    """A batch of rows in bands whose rows and results take at most a quarter of `resident`
    elements: the target's memory sizes decide. Where the matrix unit reads its rows from a
    memory apart from its results (`apart`: how many elements of each a band may take), a
    wider band is offered too, as many rows as both hold, where that is wider and at most twice
    the quarter (VTA's AlexNet conv3: bands of 14 rows, 2.10 M cycles, where 7 ran 3.53 M; wider
    still, the systolic 3x3 convolution's e-graph outgrew egglog 13.2's 10 s). Whether the
    weights fit on chip does not decide: with
    weights that do not, a band runs weight-stationary, one pass over the weights per band; with
    pinned weights, a band's products of one weight tile run back to back, so its accumulation
    steps hide the adds' latency (VTA's 3x3 convolution 16->32 + ReLU: 132,956 cycles row by
    row, 16,852 in bands, where the rule needed weights larger than the chip)."""
    #: (the guards naming the band size r, the `apart` room its examples are sized by)
    bands: list[tuple[list[str], tuple[int, int] | None]] = [([f"(= r (/ {resident // 4} (+ o k)))"], None)]
    also = ""
    if apart is not None:
        bands.append(([f"(= r (min (/ {apart[0]} k) (/ {apart[1]} o)))", f"(> (* r (+ o k)) {resident // 4})",
                       f"(<= (* r (+ o k)) {resident // 2})"], apart))
        also = (f"; where rows and results are apart, also r = min({apart[0]} / k, {apart[1]} / o) rows "
                f"(the rows' and the results' room), if r (k + o) is over the quarter and within half of {resident}")
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
                    ["(= (TA (TA s k) o) (ty w))", *size, "(>= r 2)", "(< r n)", "(= nb (/ (+ n (- r 1)) r))"],
                )
                for layer in ("Linear w b", "LinearNB w") for size, _ in bands
            ),
            f"bands of r = {resident // 4} / (k + o) rows (a quarter of the result memory: the rest holds "
            f"weight blocks, copies and outputs){also}, at least 2 and fewer than the rows, padded to whole bands",
            "Linear over n rows = Linear over bands of r rows (the last band padded with zero rows, their "
            "results dropped): each band's rows and results fit on chip, so each band's GEMM can run "
            "weight-stationary (mmmul-weight-stationary-tiles)",
            *(_banded_example(bias, resident, room) for _, room in bands for bias in (True, False)),
        ),
    ]


def _filling_example(op: str, fill: int, step: int, offset: int):
    """Cells whose gate vectors fill `fill` elements: nh = step * j + offset, nh at least
    fill / gates (an LSTM cell has 4 gates, a GRU cell 3) and less than twice that."""
    gates = _GATES[op]

    def example(rng: np.random.Generator) -> Term:
        least = max(1, -(-fill // gates // step))
        return _cell(op, int(rng.integers(1, 6)), step * int(rng.integers(least, 2 * least)) + offset)

    return example


#: how many gates each cell stacks in its weights
_GATES = {"LSTMCell": 4, "GRUCell": 3}
#: per cell: the e-graph pattern of its application, its lowering over whole gate vectors and
#: the one block by block of k hidden units, and what each computes
_CELLS = {
    "LSTMCell": ("(LSTMCell wi wh bi bh (TP (TA s ni) (TP (TA s nh) (TA s nh))))", _lstm_rhs, _lstm_blocks_rhs,
                 "LSTMCell = i, f, g, o gates from row blocks of the stacked weights; c' = f c + i g, h' = o tanh(c')",
                 "LSTMCell = c' = Join of a Map over blocks of k hidden units of f c + i g, then h' = Join of a Map "
                 "over blocks of o tanh(c')"),
    "GRUCell": ("(GRUCell wi wh bi bh (TP (TA s ni) (TA s nh)))", _gru_rhs, _gru_blocks_rhs,
                "GRUCell = r, z, n gates from row blocks of the stacked weights; h' = n + z (h - n) "
                "(n appears twice: one e-class, computed once by codegen)",
                "GRUCell = h' = Join of a Map over blocks of k hidden units of n + z (h - n)"),
}


def _block_sizes(resident: int, native: int) -> list[int]:
    """The block sizes of hidden units a cell may run in, largest first: resident/64,
    resident/128, ..., at least `native`."""
    ks: list[int] = []
    while resident // 64 >> len(ks) >= native:
        ks.append(resident // 64 >> len(ks))
    return ks


def blocks_only_when_asked(cell: Term, resident: int, native: int) -> bool:
    """Whether `cell_rules` lowers this GRUCell or LSTMCell term over whole gate vectors by
    default (they do not fill `resident` elements) but in blocks of hidden units when asked to
    (a block size divides its hidden size)."""
    state = cell.args[-1].args[1]
    nh = numel(state) // (2 if state.op == "TP" else 1)
    return _GATES[cell.op] * nh < resident and any(nh % k == 0 for k in _block_sizes(resident, native))


def cell_rules(resident: int, native: int, blocked: bool = False) -> list[Rule]:
    """GRU and LSTM cells lowered to their gate arithmetic: over whole gate vectors, or, where
    the gate vectors alone fill the result memory (`resident` elements; anywhere, when
    `blocked`: what a program that does not fit is compiled again with), block by block of k
    hidden units, k the largest of resident/64, resident/128, ... (at least `native`) dividing
    the hidden size. The two are exclusive: the systolic array's LSTM(4096) step over whole
    vectors needs 224 KiB of its 64 KiB accumulator, and the cost model, which checks one value
    at a time, would rank it first."""
    return [r for op in _CELLS for r in _cell_rules(op, resident, native, 0 if blocked else resident)]


@cache
def _cell_rules(op: str, resident: int, native: int, fill: int) -> tuple[Rule, ...]:
    """One cell's `cell_rules`, in blocks where its gates take at least `fill` elements; built
    once per size: writing and sharing the blocks' right-hand sides takes 20-46 ms, and every
    compile asks for each target's rules."""
    lhs, whole_rhs, blocks_rhs, whole_doc, blocks_doc = _CELLS[op]
    gates, name = _GATES[op], op.lower()
    ks = _block_sizes(resident, native)
    size = f"(* {gates} nh)"
    fills = f"(>= {size} {fill})"
    rhs = whole_rhs()
    whole = ((rewrite(lhs, rhs, "dsl", [f"(< {size} {fill})"]),
              rewrite(lhs, rhs, "dsl", [fills] + [f"(!= 0 (% nh {k}))" for k in ks])) if ks
             else (rewrite(lhs, rhs, "dsl"),))
    to_gates = Rule(
        f"{name}-to-gates", "dsl", whole,
        f"{gates} nh < {fill}, or no block size of {name}-hidden-blocks divides nh" if ks else "none",
        whole_doc, _cell_example(op), *((_filling_example(op, fill, 2 * ks[-1], 1),) if ks else ()),
    )
    if not ks:
        return (to_gates,)
    blocks = tuple(
        shared_rewrite(lhs, blocks_rhs(k), "dsl",
                       [fills, f"(= 0 (% nh {k}))"] + [f"(!= 0 (% nh {bigger}))" for bigger in ks[:i]]
                       + [f"(= nb (/ nh {k}))", "(= nh3 (* 3 nh))"] + (["(= nh4 (* 4 nh))"] if gates == 4 else []))
        for i, k in enumerate(ks))
    return (to_gates, Rule(
        f"{name}-hidden-blocks", "dsl", blocks,
        f"{gates} nh >= {fill} (the gate vectors fill the result memory), k the largest of "
        f"{', '.join(map(str, ks))} dividing nh",
        f"{blocks_doc}: block j's gates from rows [g nh + j k, g nh + (j+1) k) of each gate g of the stacked "
        "weights (laid out block by block by the host), with the whole x and h; every gate's arithmetic is per "
        "hidden unit",
        _filling_example(op, fill, native, 0),
    ))


def dsl_rules() -> list[Rule]:
    """Fully connected layers become a matrix-vector product plus a bias (a batch of rows: a
    GEMM); RNN cells become their gate arithmetic. The same for every target (a GRU or LSTM
    cell's lowering depends on the target's memory: `cell_rules`)."""
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
            "rnncell-to-gates",
            "dsl",
            tuple(rewrite(f'(RNNCell wi wh bi bh "{act}" (TP (TA s ni) (TA s nh)))', _rnn_rhs(act), "dsl")
                  for act in RNN_NONLINEARITIES),
            "none",
            "RNNCell = act(W_ih x + b_ih + W_hh h + b_hh), act tanh or relu (its nonlinearity)",
            *(_rnn_example(act) for act in RNN_NONLINEARITIES),
        ),
    ]
