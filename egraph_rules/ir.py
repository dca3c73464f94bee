"""The liftsat IR: types, values and point-free functions, one schema for Python and egglog.

Three sorts. `Ty` is a type (scalar element type, array of n, pair). `E` is a value: a named
input or weight (`Var`), a function applied to a value (`App`), or a pair. `F` is a point-free
function: Lift's patterns (Map, Reduce, Split, Join, Zip, Transpose, Slide, Pad ...), combinators
that replace lambdas (Comp, Fork, Fst, Snd, Const, DistR), arithmetic, layers, memory moves and
device operators. Every leaf function carries its input type, so every F e-class has exactly one
input and one output type and rewrite rules can check shapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Union

Arg = Union["Term", int, float, str]

#: element types and their widths in bytes
DTYPE_BYTES: dict[str, int] = {"f32": 4, "f16": 2, "f8": 1, "i32": 4, "i8": 1}

#: RNNCell's nonlinearities and the elementwise function each one is
RNN_NONLINEARITIES: dict[str, str] = {"tanh": "VVTanh", "relu": "VVRelu"}

#: elementwise operators on one vector, and on two vectors of one type
ELEMENTWISE_UNARY_OPS: tuple[str, ...] = ("VVRelu", "VVTanh", "VVSigm")
ELEMENTWISE_BINARY_OPS: tuple[str, ...] = ("VVAdd", "VVMul", "VVSub", "VVMax")

#: elementwise binary operators that are associative and commutative: a reduction with one of
#: them may be split into partial reductions and its elements reordered
ASSOC_COMM_OPS: tuple[str, ...] = ("VVAdd", "VVMul", "VVMax")

#: each of them with its identity element: a reduction may start from a vector of it
REDUCTION_IDENTITY: dict[str, float] = {"VVAdd": 0.0, "VVMul": 1.0, "VVMax": -math.inf}

#: constructor name -> (sort, argument sorts); the single source for egglog and Python
SCHEMA: dict[str, tuple[str, tuple[str, ...]]] = {
    # types
    "TS": ("Ty", ("String",)),
    "TA": ("Ty", ("Ty", "i64")),
    "TP": ("Ty", ("Ty", "Ty")),
    # values
    "Var": ("E", ("String", "Ty")),
    "App": ("E", ("F", "E")),
    "Pair": ("E", ("E", "E")),
    # a constant of type t: a vector of k ones then zeros, or an n x n matrix whose diagonal is
    # that vector (codegen zeroes padding lanes with it)
    "Mask": ("E", ("i64", "Ty")),
    # a constant of type t with every element the given f64 (-1 negates by a multiply)
    "Fill": ("E", ("f64", "Ty")),
    # combinators
    "Id": ("F", ("Ty",)),
    "Comp": ("F", ("F", "F")),
    "Fork": ("F", ("F", "F")),
    "Fst": ("F", ("Ty",)),
    "Snd": ("F", ("Ty",)),
    "Const": ("F", ("E", "Ty")),
    # Lift patterns
    "Map": ("F", ("F", "i64")),
    "Reduce": ("F", ("F", "Ty")),
    # (init, [a]n) -> f(...f(f(init, a0), a1)..., a(n-1)): a loop carrying a state (RNN over time)
    "Fold": ("F", ("F", "Ty")),
    "Split": ("F", ("i64", "Ty")),
    "Join": ("F", ("Ty",)),
    "Transpose": ("F", ("Ty",)),
    "Zip": ("F", ("Ty",)),
    "DistR": ("F", ("Ty",)),
    "Pad": ("F", ("i64", "i64", "Ty")),
    # PadWith l r fill: Pad with `fill` (an f64, -inf for max pooling) instead of zeros; a
    # separate constructor, so that rules relying on zero padding never match it
    "PadWith": ("F", ("i64", "i64", "f64", "Ty")),
    "Slice": ("F", ("i64", "i64", "Ty")),
    # Slide size step: the windows of `size` consecutive elements starting every `step` elements
    # (a stencil's neighbourhoods; windows overlap when step < size)
    "Slide": ("F", ("i64", "i64", "Ty")),
    "Concat": ("F", ("Ty",)),
    # arithmetic (binary ones take a pair)
    "VVAdd": ("F", ("Ty",)),
    "VVMul": ("F", ("Ty",)),
    "VVSub": ("F", ("Ty",)),
    "VVMax": ("F", ("Ty",)),
    "MVMul": ("F", ("Ty",)),
    "MMMul": ("F", ("Ty",)),
    "VVRelu": ("F", ("Ty",)),
    "VVTanh": ("F", ("Ty",)),
    "VVSigm": ("F", ("Ty",)),
    # layers (DSL level): x -> W x + b, x -> W x
    "Linear": ("F", ("E", "E", "Ty")),
    "LinearNB": ("F", ("E", "Ty")),
    # recurrent cells, PyTorch layouts: weight_ih, weight_hh, bias_ih, bias_hh (gates stacked);
    # GRUCell: (x, h) -> h'; LSTMCell: (x, (h, c)) -> (h', c')
    "GRUCell": ("F", ("E", "E", "E", "E", "Ty")),
    "LSTMCell": ("F", ("E", "E", "E", "E", "Ty")),
    # vanilla RNN cell, PyTorch layout, nonlinearity "tanh" or "relu": (x, h) -> h'
    "RNNCell": ("F", ("E", "E", "E", "E", "String", "Ty")),
    # address spaces: move to a named on-chip memory, to DRAM, to the output buffer; Restage
    # moves a value already in the memory a named memory is loaded from (its staging memory)
    # on into it, without going back to DRAM
    "ToChip": ("F", ("String", "Ty")),
    "Restage": ("F", ("String", "Ty")),
    "ToDram": ("F", ("Ty",)),
    "ToOutput": ("F", ("Ty",)),
    # device operator: name, input type, output type
    "Dev": ("F", ("String", "Ty", "Ty")),
    # a device operator whose result is written to the output as it is computed (its store
    # chained to it: Comp(ToOutput u, Dev name t u)), so a loop's stores stream behind its ops
    "DevOut": ("F", ("String", "Ty", "Ty")),
}



class IRTypeError(ValueError):
    """A term whose shapes or types do not fit together."""


@dataclass(frozen=True)
class Term:
    """An immutable IR term: a constructor name and its arguments (terms, ints, strings)."""

    op: str
    args: tuple[Arg, ...]

    def __post_init__(self) -> None:
        if self.op not in SCHEMA:
            raise IRTypeError(f"unknown IR constructor {self.op!r}")
        sorts = SCHEMA[self.op][1]
        if len(sorts) != len(self.args):
            raise IRTypeError(f"{self.op} takes {len(sorts)} arguments, got {len(self.args)}")
        for sort, a in zip(sorts, self.args):
            ok = (
                (sort == "i64" and isinstance(a, int) and not isinstance(a, bool))
                or (sort == "f64" and isinstance(a, float) and not math.isnan(a))
                or (sort == "String" and isinstance(a, str))
                or (isinstance(a, Term) and SCHEMA[a.op][0] == sort)
            )
            if not ok:
                raise IRTypeError(f"{self.op}: argument {a!r} is not of sort {sort}")

    def __hash__(self) -> int:
        return self._hash

    @cached_property
    def _hash(self) -> int:
        """Computed once: terms are deep and are dictionary keys everywhere (codegen's caches,
        extraction's tables), so hashing them afresh each time dominated compile time."""
        return hash((self.op, self.args))

    @property
    def sort(self) -> str:
        return SCHEMA[self.op][0]

    def __repr__(self) -> str:
        return self.sexpr

    @cached_property
    def sexpr(self) -> str:
        """The term in egglog syntax."""
        return "(" + " ".join([self.op, *(arg_sexpr(a) for a in self.args)]) + ")"

    def walk(self):
        """Every sub-term, this one first."""
        yield self
        for a in self.args:
            if isinstance(a, Term):
                yield from a.walk()


def arg_sexpr(a: Arg) -> str:
    """An argument in egglog syntax (a float as Python's repr, which egglog reads: -inf, 1e+20)."""
    if isinstance(a, Term):
        return a.sexpr
    if isinstance(a, str):
        return '"' + a.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(a) if isinstance(a, float) else str(a)


def primitive_value(text: str) -> int | float | str:
    """A primitive (i64, f64 or String) as egglog prints it, back as a Python value."""
    if text.startswith('"'):
        return text[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    try:
        return int(text)
    except ValueError:
        return float(text)


def T(op: str, *args: Arg) -> Term:
    """Build a term, checking constructor name, arity and argument sorts."""
    return Term(op, tuple(args))


# ---------------------------------------------------------------- types


def ts(dtype: str) -> Term:
    """Scalar type of a named element type (f32, f16, f8, i32, i8)."""
    if dtype not in DTYPE_BYTES:
        raise IRTypeError(f"unknown element type {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    return T("TS", dtype)


def ta(elem: Term, n: int) -> Term:
    """Array of n elements."""
    if n <= 0:
        raise IRTypeError(f"array length must be positive, got {n}")
    return T("TA", elem, n)


def tp(a: Term, b: Term) -> Term:
    """Pair type."""
    return T("TP", a, b)


def tensor_type(dtype: str, shape: tuple[int, ...] | list[int]) -> Term:
    """Nested array type for a row-major tensor shape."""
    t = ts(dtype)
    for n in reversed(list(shape)):
        t = ta(t, n)
    return t


def shape_of(t: Term) -> tuple[int, ...]:
    """Shape of an array-of-scalars type ((), for a scalar)."""
    dims = []
    while t.op == "TA":
        dims.append(t.args[1])
        t = t.args[0]
    if t.op != "TS":
        raise IRTypeError(f"{t} is not a tensor of scalars")
    return tuple(dims)


def dtype_name(t: Term) -> str:
    """Element type of a tensor type."""
    while t.op == "TA":
        t = t.args[0]
    if t.op != "TS":
        raise IRTypeError(f"{t} is not a tensor of scalars")
    return t.args[0]


def numel(t: Term) -> int:
    """Number of scalars in a value of this type."""
    if t.op == "TS":
        return 1
    if t.op == "TA":
        return t.args[1] * numel(t.args[0])
    return numel(t.args[0]) + numel(t.args[1])


def nbytes(t: Term) -> int:
    """Bytes of a value of this type."""
    if t.op == "TS":
        return DTYPE_BYTES[t.args[0]]
    if t.op == "TA":
        return t.args[1] * nbytes(t.args[0])
    return nbytes(t.args[0]) + nbytes(t.args[1])


def _arr(t: Term, what: str) -> tuple[Term, int]:
    if t.op != "TA":
        raise IRTypeError(f"{what} expects an array, got {t}")
    return t.args[0], t.args[1]


def _pair(t: Term, what: str) -> tuple[Term, Term]:
    if t.op != "TP":
        raise IRTypeError(f"{what} expects a pair, got {t}")
    return t.args[0], t.args[1]


def _vec(t: Term, what: str) -> tuple[Term, int]:
    e, n = _arr(t, what)
    if e.op != "TS":
        raise IRTypeError(f"{what} expects a vector of scalars, got {t}")
    return e, n


def fin(f: Term) -> Term:
    """Input type of a function."""
    if f.op == "Comp":
        return fin(f.args[1])
    if f.op == "Fork":
        return fin(f.args[0])
    if f.op == "Map":
        return ta(fin(f.args[0]), f.args[1])
    for a in f.args:
        if isinstance(a, Term) and a.sort == "Ty":
            return a
    raise IRTypeError(f"{f.op} has no input type")


def fout(f: Term) -> Term:  # noqa: C901 - one case per constructor reads best as one table
    """Output type of a function, checking that its parts fit together."""
    op, a = f.op, f.args
    if op == "Id":
        return a[0]
    if op == "Comp":
        if fout(a[1]) != fin(a[0]):
            raise IRTypeError(f"composition mismatch: {fout(a[1])} fed to a function of {fin(a[0])}")
        return fout(a[0])
    if op == "Fork":
        if fin(a[0]) != fin(a[1]):
            raise IRTypeError(f"Fork branches take {fin(a[0])} and {fin(a[1])}")
        return tp(fout(a[0]), fout(a[1]))
    if op in ("Fst", "Snd"):
        x, y = _pair(a[0], op)
        return x if op == "Fst" else y
    if op == "Const":
        return ty(a[0])
    if op == "Map":
        return ta(fout(a[0]), a[1])
    if op == "Reduce":
        e, _ = _arr(a[1], "Reduce")
        if fin(a[0]) != tp(e, e) or fout(a[0]) != e:
            raise IRTypeError(f"Reduce operator {a[0].op} does not combine two {e}")
        return e
    if op == "Split":
        e, m = _arr(a[1], "Split")
        k = a[0]
        if k <= 0 or m % k:
            raise IRTypeError(f"Split {k} does not divide length {m}")
        return ta(ta(e, k), m // k)
    if op == "Join":
        inner, m = _arr(a[0], "Join")
        e, k = _arr(inner, "Join")
        return ta(e, k * m)
    if op == "Transpose":
        inner, n = _arr(a[0], "Transpose")
        e, m = _arr(inner, "Transpose")
        return ta(ta(e, n), m)
    if op == "Zip":
        x, y = _pair(a[0], "Zip")
        (xe, n), (ye, m) = _arr(x, "Zip"), _arr(y, "Zip")
        if n != m:
            raise IRTypeError(f"Zip of lengths {n} and {m}")
        return ta(tp(xe, ye), n)
    if op == "DistR":
        x, c = _pair(a[0], "DistR")
        xe, n = _arr(x, "DistR")
        return ta(tp(xe, c), n)
    if op in ("Pad", "PadWith"):
        e, n = _arr(a[-1], op)
        if a[0] < 0 or a[1] < 0:
            raise IRTypeError(f"{op} by negative amount {a[0]}, {a[1]}")
        return ta(e, a[0] + n + a[1])
    if op == "Slice":
        e, n = _arr(a[2], "Slice")
        if a[0] < 0 or a[1] <= 0 or a[0] + a[1] > n:
            raise IRTypeError(f"Slice [{a[0]}, {a[0] + a[1]}) out of length {n}")
        return ta(e, a[1])
    if op == "Slide":
        e, n = _arr(a[2], "Slide")
        if a[0] <= 0 or a[1] <= 0 or a[0] > n:
            raise IRTypeError(f"Slide of windows of {a[0]} every {a[1]} over length {n}")
        return ta(ta(e, a[0]), (n - a[0]) // a[1] + 1)
    if op == "Fold":
        acc, xs = _pair(a[1], "Fold")
        e, _ = _arr(xs, "Fold")
        if fin(a[0]) != tp(acc, e) or fout(a[0]) != acc:
            raise IRTypeError(f"Fold step {a[0].op} does not map ({acc}, {e}) to {acc}")
        return acc
    if op == "Concat":
        x, y = _pair(a[0], "Concat")
        (xe, n), (ye, m) = _arr(x, "Concat"), _arr(y, "Concat")
        if xe != ye:
            raise IRTypeError(f"Concat of arrays of {xe} and {ye}")
        return ta(xe, n + m)
    if op in ("GRUCell", "LSTMCell"):
        x, state = _pair(a[4], op)
        h = state if op == "GRUCell" else _pair(state, op)[0]
        gates = 3 if op == "GRUCell" else 4
        (_, nx), (_, nh) = _vec(x, op), _vec(h, op)
        want = [tensor_type(dtype_name(h), (gates * nh, nx)), tensor_type(dtype_name(h), (gates * nh, nh)),
                ta(h.args[0], gates * nh), ta(h.args[0], gates * nh)]
        for what, e, w in zip(("weight_ih", "weight_hh", "bias_ih", "bias_hh"), a[:4], want):
            if ty(e) != w:
                raise IRTypeError(f"{op} {what} is {ty(e)}, expected {w}")
        if op == "LSTMCell" and state.args[1] != h:
            raise IRTypeError(f"LSTMCell cell state {state.args[1]} does not match hidden state {h}")
        return state
    if op == "RNNCell":
        x, h = _pair(a[5], op)
        (_, nx), (_, nh) = _vec(x, op), _vec(h, op)
        want = [tensor_type(dtype_name(h), (nh, nx)), tensor_type(dtype_name(h), (nh, nh)), h, h]
        for what, e, w in zip(("weight_ih", "weight_hh", "bias_ih", "bias_hh"), a[:4], want):
            if ty(e) != w:
                raise IRTypeError(f"RNNCell {what} is {ty(e)}, expected {w}")
        if a[4] not in RNN_NONLINEARITIES:
            raise IRTypeError(f"RNNCell nonlinearity {a[4]!r} is not one of {', '.join(RNN_NONLINEARITIES)}")
        return h
    if op in ELEMENTWISE_BINARY_OPS:
        x, y = _pair(a[0], op)
        _vec(x, op)
        if x != y:
            raise IRTypeError(f"{op} of {x} and {y}")
        return x
    if op in ELEMENTWISE_UNARY_OPS:
        _vec(a[0], op)
        return a[0]
    if op == "MVMul":
        m, v = _pair(a[0], op)
        row, n = _arr(m, op)
        s, k = _vec(row, op)
        if v != ta(s, k):
            raise IRTypeError(f"MVMul of a {n}x{k} matrix and {v}")
        return ta(s, n)
    if op == "MMMul":
        x, y = _pair(a[0], op)
        xr, n = _arr(x, op)
        s, k = _vec(xr, op)
        yr, k2 = _arr(y, op)
        s2, m = _vec(yr, op)
        if k != k2 or s != s2:
            raise IRTypeError(f"MMMul of {n}x{k} and {k2}x{m}")
        return ta(ta(s, m), n)
    if op in ("Linear", "LinearNB"):
        w = ty(a[0])
        t = a[-1]
        out = fout(T("MVMul", tp(w, t)))
        if op == "Linear" and ty(a[1]) != out:
            raise IRTypeError(f"Linear bias {ty(a[1])} does not match output {out}")
        return out
    if op in ("ToChip", "Restage", "ToDram", "ToOutput"):
        return a[-1]
    if op in ("Dev", "DevOut"):
        return a[2]
    raise IRTypeError(f"{op} is not a function")


def ty(e: Term) -> Term:
    """Type of a value term."""
    if e.op == "Var":
        return e.args[1]
    if e.op == "Pair":
        return tp(ty(e.args[0]), ty(e.args[1]))
    if e.op == "Mask":
        t = e.args[1]
        _vec(t.args[0] if t.op == "TA" and t.args[0].op == "TA" else t, "Mask")
        if t.args[0].op == "TA" and t.args[0].args[1] != t.args[1]:
            raise IRTypeError(f"a matrix Mask must be square, got {t}")
        if not 0 <= e.args[0] <= e.args[1].args[1]:
            raise IRTypeError(f"Mask of {e.args[0]} ones in {e.args[1]}")
        return e.args[1]
    if e.op == "Fill":
        shape_of(e.args[1])  # a tensor of scalars
        return e.args[1]
    if e.op == "App":
        f, x = e.args
        if fin(f) != ty(x):
            raise IRTypeError(f"{f.op} expects {fin(f)} but is applied to {ty(x)}")
        return fout(f)
    raise IRTypeError(f"{e.op} is not a value")


# ---------------------------------------------------------------- egglog declarations


def egglog_declarations() -> str:
    """The egglog datatype declarations of the IR sorts."""
    lines = ["(datatype Ty"]
    lines += [f"  ({name} {' '.join(args)})" for name, (s, args) in SCHEMA.items() if s == "Ty"]
    lines[-1] += ")"
    lines.append("(datatype*")
    for sort in ("E", "F"):
        ctors = [f"({name} {' '.join(args)})" for name, (s, args) in SCHEMA.items() if s == sort]
        lines.append(f"  ({sort} " + "\n     ".join(ctors) + ")")
    lines[-1] += ")"
    return "\n".join(lines)


def lifted(t: Term, depth: int, make: Callable[[Term], Term]) -> Term:
    """make(element type) applied `depth` array levels inside a value of type t (a Map per level)."""
    if depth == 0:
        return make(t)
    return T("Map", lifted(t.args[0], depth - 1, make), t.args[1])


def comp(*fs: Term) -> Term:
    """Right-nested composition f1 . f2 . ... . fn (fn applied first)."""
    if not fs:
        raise IRTypeError("empty composition")
    out = fs[-1]
    for f in reversed(fs[:-1]):
        out = T("Comp", f, out)
    return out
