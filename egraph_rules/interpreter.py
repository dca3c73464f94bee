"""Reference interpreter: evaluates every IR constructor with numpy; the ground truth for tests.

A value is a numpy array for an array of scalars, a tuple for a pair, and a list for an array
whose elements are pairs. Device operators are evaluated through their meaning (an IR function
given by the target), so one definition serves rules, interpreter and tests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from egraph_rules.ir import DTYPE_BYTES, RNN_NONLINEARITIES, IRTypeError, Term, dtype_name, shape_of

Value = np.ndarray | tuple | list

NUMPY_DTYPE = {"f32": np.float32, "f16": np.float16, "f8": np.float32, "i32": np.int32, "i8": np.int32}


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x))).astype(x.dtype)


UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "VVRelu": lambda x: np.maximum(x, 0).astype(x.dtype),
    "VVTanh": np.tanh,
    "VVSigm": _sigmoid,
}
BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "VVAdd": np.add,
    "VVMul": np.multiply,
    "VVSub": np.subtract,
    "VVMax": np.maximum,
    "MVMul": lambda m, v: m @ v,
    "MMMul": lambda a, b: a @ b,
}


def _stack(items: list[Value]) -> Value:
    if items and all(isinstance(i, (np.ndarray, np.generic)) for i in items):
        return np.stack(items)
    return list(items)


def _items(v: Value) -> list[Value]:
    return list(v) if isinstance(v, (list, np.ndarray)) else _fail(f"expected an array, got {type(v)}")


def _fail(msg: str):
    raise IRTypeError(msg)


def gru_cell(w_ih, w_hh, b_ih, b_hh, x, h):
    """PyTorch's GRUCell (gates r, z, n stacked in that order)."""
    gi, gh = w_ih @ x + b_ih, w_hh @ h + b_hh
    n_h = len(h)
    r = _sigmoid(gi[:n_h] + gh[:n_h])
    z = _sigmoid(gi[n_h : 2 * n_h] + gh[n_h : 2 * n_h])
    n = np.tanh(gi[2 * n_h :] + r * gh[2 * n_h :])
    return n + z * (h - n)


def lstm_cell(w_ih, w_hh, b_ih, b_hh, x, h, c):
    """PyTorch's LSTMCell (gates i, f, g, o stacked in that order)."""
    g = w_ih @ x + b_ih + w_hh @ h + b_hh
    n_h = len(h)
    i, f = _sigmoid(g[:n_h]), _sigmoid(g[n_h : 2 * n_h])
    cand, o = np.tanh(g[2 * n_h : 3 * n_h]), _sigmoid(g[3 * n_h :])
    c2 = f * c + i * cand
    return (o * np.tanh(c2), c2)


def rnn_cell(w_ih, w_hh, b_ih, b_hh, x, h, nonlinearity):
    """PyTorch's RNNCell: h' = act(W_ih x + b_ih + W_hh h + b_hh), act tanh or relu."""
    g = w_ih @ x + b_ih + w_hh @ h + b_hh
    return UNARY[RNN_NONLINEARITIES[nonlinearity]](g)


def relayout(f: Term, x: np.ndarray, axis: int = 0) -> np.ndarray | None:
    """f applied at dimension `axis` of an array, for functions that only re-lay data out
    (vectorized: the host prepares large weights this way); None where f is not one of them."""
    op, a = f.op, f.args
    sh = x.shape
    if op == "Split":
        return x.reshape(*sh[:axis], sh[axis] // a[0], a[0], *sh[axis + 1 :])
    if op == "Join":
        return x.reshape(*sh[:axis], sh[axis] * sh[axis + 1], *sh[axis + 2 :])
    if op == "Transpose":
        return np.swapaxes(x, axis, axis + 1)
    if op in ("Pad", "PadWith"):
        widths = [(0, 0)] * x.ndim
        widths[axis] = (a[0], a[1])
        return np.pad(x, widths, constant_values=a[2] if op == "PadWith" else 0)
    if op == "Slice":
        return x[(slice(None),) * axis + (slice(a[0], a[0] + a[1]),)]
    if op == "Slide":
        windows = np.lib.stride_tricks.sliding_window_view(x, a[0], axis=axis)[(slice(None),) * axis + (slice(None, None, a[1]),)]
        return np.moveaxis(windows, -1, axis + 1)
    if op in ("Id", "ToChip", "Restage", "ToDram", "ToOutput"):
        return x
    if op == "Map":
        return relayout(a[0], x, axis + 1)
    if op == "Comp":
        inner = relayout(a[1], x, axis)
        return None if inner is None else relayout(a[0], inner, axis)
    return None


class Interpreter:
    """Evaluates terms given values for the named variables and meanings for device ops."""

    def __init__(self, env: Mapping[str, np.ndarray], device_meanings: Mapping[str, Term] | None = None):
        self.env = env
        self.device_meanings = dict(device_meanings or {})

    def value(self, e: Term) -> Value:
        """Value of an E term."""
        if e.op == "Var":
            if e.args[0] not in self.env:
                raise IRTypeError(f"no value given for variable {e.args[0]!r}")
            return self.env[e.args[0]]
        if e.op == "Pair":
            return (self.value(e.args[0]), self.value(e.args[1]))
        if e.op == "Mask":
            k, t = e.args
            mask = (np.arange(t.args[1]) < k).astype(NUMPY_DTYPE[dtype_name(t)])
            return np.diag(mask) if t.args[0].op == "TA" else mask
        if e.op == "Fill":
            return np.full(shape_of(e.args[1]), e.args[0], NUMPY_DTYPE[dtype_name(e.args[1])])
        if e.op == "App":
            return self.apply(e.args[0], self.value(e.args[1]))
        raise IRTypeError(f"{e.op} is not a value")

    def apply(self, f: Term, x: Value) -> Value:  # noqa: C901 - one case per constructor
        """Apply function term f to value x."""
        op, a = f.op, f.args
        if isinstance(x, np.ndarray):
            fast = relayout(f, x, 0)
            if fast is not None:
                return fast
        if op in ("Id", "ToChip", "Restage", "ToDram", "ToOutput"):
            return x
        if op == "Comp":
            return self.apply(a[0], self.apply(a[1], x))
        if op == "Fork":
            return (self.apply(a[0], x), self.apply(a[1], x))
        if op == "Fst":
            return x[0]
        if op == "Snd":
            return x[1]
        if op == "Const":
            return self.value(a[0])
        if op == "Map":
            return _stack([self.apply(a[0], xi) for xi in _items(x)])
        if op == "Reduce":
            items = _items(x)
            acc = items[0]
            for xi in items[1:]:
                acc = self.apply(a[0], (acc, xi))
            return acc
        if op == "Fold":
            acc = x[0]
            for xi in _items(x[1]):
                acc = self.apply(a[0], (acc, xi))
            return acc
        if op == "Concat":
            return np.concatenate([x[0], x[1]])
        if op == "GRUCell":
            return gru_cell(*(self.value(w) for w in a[:4]), x[0], x[1])
        if op == "LSTMCell":
            return lstm_cell(*(self.value(w) for w in a[:4]), x[0], *x[1])
        if op == "RNNCell":
            return rnn_cell(*(self.value(w) for w in a[:4]), x[0], x[1], a[4])
        if op == "Split":
            items, k = _items(x), a[0]
            return _stack([_stack(items[i : i + k]) for i in range(0, len(items), k)])
        if op == "Join":
            return _stack([y for xi in _items(x) for y in _items(xi)])
        if op == "Transpose":
            rows = [_items(r) for r in _items(x)]
            return _stack([_stack([r[j] for r in rows]) for j in range(len(rows[0]))])
        if op == "Zip":
            return [(p, q) for p, q in zip(_items(x[0]), _items(x[1]), strict=True)]
        if op == "DistR":
            return [(p, x[1]) for p in _items(x[0])]
        if op in ("Pad", "PadWith"):
            raise IRTypeError(f"{op} applies to arrays of scalars")
        if op == "Slice":
            return x[a[0] : a[0] + a[1]]
        if op == "Slide":
            items = _items(x)
            return _stack([_stack(items[i : i + a[0]]) for i in range(0, len(items) - a[0] + 1, a[1])])
        if op in UNARY:
            return UNARY[op](x)
        if op in BINARY:
            return BINARY[op](x[0], x[1])
        if op == "Linear":
            return self.value(a[0]) @ x + self.value(a[1])
        if op == "LinearNB":
            return self.value(a[0]) @ x
        if op in ("Dev", "DevOut"):  # a stored value is the value
            if a[0] not in self.device_meanings:
                raise IRTypeError(f"no meaning known for device op {a[0]!r}")
            return self.apply(self.device_meanings[a[0]], x)
        raise IRTypeError(f"{op} is not a function")


def random_value(t: Term, rng: np.random.Generator) -> Value:
    """A random value of type t (normal floats, small integers)."""
    if t.op == "TP":
        return (random_value(t.args[0], rng), random_value(t.args[1], rng))
    dims, e = [], t
    while e.op == "TA":
        dims.append(e.args[1])
        e = e.args[0]
    if e.op == "TP":
        return [random_value(t.args[0], rng) for _ in range(t.args[1])]
    dtype = e.args[0]
    if dtype not in DTYPE_BYTES:
        raise IRTypeError(f"unknown element type {dtype}")
    if dtype.startswith("i"):
        return rng.integers(-8, 8, size=dims).astype(NUMPY_DTYPE[dtype])
    return rng.standard_normal(dims).astype(NUMPY_DTYPE[dtype])
