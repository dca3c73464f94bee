"""Layers given as PyTorch-style constructor calls become one IR term, weights, and an independent
numpy reference.

`parse_layer("Linear(1024, 1000, bias=False)")` reads the call with Python's `ast` (never
`eval`); names and arguments follow PyTorch. `build_model` applies the layers in order, like
`nn.Sequential`, to an input of shape (batch, features).
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field

import numpy as np

from egraph_rules.ir import RNN_NONLINEARITIES, T, Term, comp, fout, shape_of, ta, tensor_type, tp, ts, ty
from frontend.spatial import (Stages, Window, add_images, block_diagonal, chw_to_hwc, conv, conv_reference,
                              depthwise_conv, elementwise, pool, pool_reference, to_chw, to_hwc)


class LayerError(ValueError):
    """A layer, its arguments or the input shape are not valid; the message says which."""


@dataclass(frozen=True)
class LayerSpec:
    """A parsed constructor call."""

    name: str
    args: tuple
    kwargs: tuple[tuple[str, object], ...]

    def __str__(self) -> str:
        parts = [str(a) if isinstance(a, LayerSpec) else repr(a) for a in self.args]
        parts += [f"{k}={v!r}" for k, v in self.kwargs]
        return f"{self.name}({', '.join(parts)})"


#: layer name -> (positional parameter names, keyword parameters with defaults)
SIGNATURES: dict[str, tuple[tuple[str, ...], dict[str, object]]] = {
    "Linear": (("in_features", "out_features"), {"bias": True}),
    "ReLU": ((), {"inplace": False}),
    "Tanh": ((), {}),
    "Sigmoid": ((), {}),
    "MatMul": (("in_features", "out_features"), {"a_t": False, "b_t": False}),
    "GRUCell": (("input_size", "hidden_size"), {"bias": True}),
    "LSTMCell": (("input_size", "hidden_size"), {"bias": True}),
    "Conv2d": (("in_channels", "out_channels", "kernel_size"),
               {"stride": 1, "padding": 0, "dilation": 1, "groups": 1, "bias": True, "padding_mode": "zeros"}),
    "MaxPool2d": (("kernel_size",), {"stride": None, "padding": 0, "dilation": 1, "return_indices": False,
                                     "ceil_mode": False}),
    "AvgPool2d": (("kernel_size",), {"stride": None, "padding": 0, "ceil_mode": False, "count_include_pad": True,
                                     "divisor_override": None}),
    "RNNCell": (("input_size", "hidden_size"), {"bias": True, "nonlinearity": "tanh"}),
    "GRU": (("input_size", "hidden_size"), {"num_layers": 1, "bias": True, "batch_first": False}),
    "LSTM": (("input_size", "hidden_size"), {"num_layers": 1, "bias": True, "batch_first": False}),
    "RNN": (("input_size", "hidden_size"), {"num_layers": 1, "nonlinearity": "tanh", "bias": True,
                                            "batch_first": False}),
    "Flatten": ((), {"start_dim": 1, "end_dim": -1}),
    # y = x + f(x), f the layers given (calls, not literals; parse_layer reads them)
    "Residual": ((), {}),
}
#: layers over images (N x C x H x W inputs); activations work on both kinds of input
SPATIAL = {"Conv2d", "MaxPool2d", "AvgPool2d"}
CELLS = {"GRUCell": 3, "LSTMCell": 4, "RNNCell": 1}
#: recurrent layers over time (input TxBxF) and the cell each one steps
SEQUENCES = {"GRU": "GRUCell", "LSTM": "LSTMCell", "RNN": "RNNCell"}
#: string arguments and the values they take
CHOICES: dict[str, tuple[str, ...]] = {"nonlinearity": tuple(RNN_NONLINEARITIES), "padding_mode": ("zeros",)}
#: window sizes of image layers: an int or a pair (rows, columns), checked by parse_window
WINDOW = {"kernel_size", "stride", "padding", "dilation"}
#: dimension indices (negative ones count from the end), checked by the layer that takes them
DIMS = {"start_dim", "end_dim"}
ACTIVATIONS = {"ReLU": ("VVRelu", lambda x: np.maximum(x, 0)), "Tanh": ("VVTanh", np.tanh),
               "Sigmoid": ("VVSigm", lambda x: 1 / (1 + np.exp(-x)))}


def parse_layer(text: str) -> LayerSpec:
    """Parse one constructor call such as `Linear(1024, 1000)`; literals only, except the layers
    a Residual wraps, which are calls themselves: `Residual(Linear(64, 64), ReLU())`."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise LayerError(f"cannot parse layer {text!r}: expected a call such as Linear(1024, 1000)") from None
    return _call(node, text)


def _call(node: ast.expr, text: str) -> LayerSpec:
    """The layer of one call node of `text`."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise LayerError(f"layer {text!r} is not a constructor call such as Linear(1024, 1000)")
    name = node.func.id
    if name not in SIGNATURES:
        raise LayerError(f"unknown layer {name!r}; known layers: {', '.join(SIGNATURES)}")
    if name == "Residual":
        if node.keywords or not node.args:
            raise LayerError(f"Residual takes the layers of its branch, e.g. Residual(Linear(64, 64), ReLU()), "
                             f"got {text!r}")
        for a in node.args:
            if not isinstance(a, ast.Call):
                raise LayerError(f"Residual: its arguments must be layer calls such as ReLU(), got {ast.unparse(a)!r}")
        return LayerSpec(name, tuple(_call(a, text) for a in node.args), ())
    try:
        args = tuple(ast.literal_eval(a) for a in node.args)
        kwargs = tuple((k.arg, ast.literal_eval(k.value)) for k in node.keywords)
    except ValueError:
        raise LayerError(f"{name}: arguments must be literal numbers, booleans or strings in {text!r}") from None
    if any(k is None for k, _ in kwargs):
        raise LayerError(f"{name}: **kwargs are not accepted")
    return LayerSpec(name, args, kwargs)


def bind(spec: LayerSpec) -> dict[str, object]:
    """The layer's parameters by name, checked against its PyTorch signature (a Residual's are
    its branch's layers)."""
    if spec.name == "Residual":
        return {"layers": spec.args}
    positional, defaults = SIGNATURES[spec.name]
    if len(spec.args) > len(positional) + len(defaults):
        raise LayerError(f"{spec.name} takes {len(positional)} positional arguments "
                         f"({', '.join(positional) or 'none'}), got {len(spec.args)}")
    names = list(positional) + list(defaults)
    params: dict[str, object] = dict(zip(names, spec.args))
    for k, v in spec.kwargs:
        if k not in names:
            raise LayerError(f"{spec.name} has no argument {k!r}")
        if k in params:
            raise LayerError(f"{spec.name}: argument {k!r} given twice")
        params[k] = v
    missing = [p for p in positional if p not in params]
    if missing:
        raise LayerError(f"{spec.name} is missing {', '.join(missing)}")
    for k, v in defaults.items():
        params.setdefault(k, v)
    for p in positional:
        if p in WINDOW:  # an int or a pair, checked with the other window sizes
            continue
        v = params[p]
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise LayerError(f"{spec.name}: {p} must be a positive integer, got {v!r}")
    for k, d in defaults.items():
        if k in WINDOW:
            continue
        if k in DIMS:
            if not isinstance(params[k], int) or isinstance(params[k], bool):
                raise LayerError(f"{spec.name}: {k} must be an integer, got {params[k]!r}")
            continue
        if isinstance(d, bool) and not isinstance(params[k], bool):
            raise LayerError(f"{spec.name}: {k} must be True or False, got {params[k]!r}")
        if isinstance(d, str) and params[k] not in CHOICES[k]:
            raise LayerError(f"{spec.name}: {k} must be one of {', '.join(map(repr, CHOICES[k]))}, got {params[k]!r}")
        if isinstance(d, int) and not isinstance(d, bool) and (not isinstance(params[k], int)
                                                                or isinstance(params[k], bool) or params[k] <= 0):
            raise LayerError(f"{spec.name}: {k} must be a positive integer, got {params[k]!r}")
    return params


def parse_shape(text: str) -> tuple[int, ...]:
    """Parse an input shape: `1x1024` (BxF), `50x16x512` (TxBxF, for GRU, LSTM, RNN) or
    `1x3x224x224` (NxCxHxW, for image layers)."""
    try:
        dims = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        raise LayerError(f"input shape {text!r} is not of the form BxF, TxBxF or NxCxHxW, e.g. 1x1024") from None
    if len(dims) not in (2, 3, 4) or any(d <= 0 for d in dims):
        raise LayerError(f"input shape {text!r} must be two positive sizes BxF (batch x features), "
                         f"three, TxBxF (time x batch x features), for GRU, LSTM and RNN, "
                         f"or four, NxCxHxW, for image layers")
    return dims


@dataclass
class Model:
    """A layer stack as one IR program term, with its values and an independent reference."""

    layers: list[LayerSpec]
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    term: Term
    env: dict[str, np.ndarray]
    reference: np.ndarray | None
    macs: int
    weight_bytes: int
    io_bytes: int
    dtype: str = "f32"
    weights: list[str] = field(default_factory=list)


#: the largest tensor (elements) the functional simulation will hold
MAX_ELEMENTS = 1 << 28


def _check_size(what: str, *dims: int) -> None:
    if math.prod(dims) > MAX_ELEMENTS:
        raise LayerError(f"{what} of {' x '.join(map(str, dims))} elements is larger than the "
                         f"{MAX_ELEMENTS} elements liftsat simulates")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _cell_reference(kind: str, x: np.ndarray, state, w_ih, w_hh, b_ih, b_hh, nonlinearity: str = "tanh"):
    """PyTorch's documented GRUCell / LSTMCell / RNNCell equations, batched, in float64."""
    h = state if kind != "LSTMCell" else state[0]
    n_h = h.shape[1]
    gi, gh = x @ w_ih.T + b_ih, h @ w_hh.T + b_hh
    if kind == "RNNCell":
        return np.tanh(gi + gh) if nonlinearity == "tanh" else np.maximum(gi + gh, 0)
    if kind == "GRUCell":
        r = _sigmoid(gi[:, :n_h] + gh[:, :n_h])
        z = _sigmoid(gi[:, n_h : 2 * n_h] + gh[:, n_h : 2 * n_h])
        n = np.tanh(gi[:, 2 * n_h :] + r * gh[:, 2 * n_h :])
        return (1 - z) * n + z * h
    g = gi + gh
    i, f = _sigmoid(g[:, :n_h]), _sigmoid(g[:, n_h : 2 * n_h])
    c2 = f * state[1] + i * np.tanh(g[:, 2 * n_h : 3 * n_h])
    return np.stack([_sigmoid(g[:, 3 * n_h :]) * np.tanh(c2), c2])


class _Builder:
    """Collects the stages, weights and reference of a layer stack, one layer at a time."""

    def __init__(self, batch: int, feats: int, rng: np.random.Generator | None, dtype: str):
        """rng None: build the term only, with no values (for compile-time studies)."""
        self.batch, self.width, self.feats, self.rng, self.dtype = batch, feats, feats, rng, dtype
        self.s = ts(dtype)
        self.env: dict[str, np.ndarray] = {}
        self.weights: list[str] = []
        self.stages: list[Term] = []
        self.macs = self.wbytes = 0
        self.state: tuple[str, Term, object] | None = None  # (kind, per-row state type, value)
        self.chw: tuple[int, int, int] | None = None  # (C, H, W) of a flattened image a Linear has not yet read

    def weight(self, name: str, shape: tuple[int, ...], bound: float) -> Term:
        if self.rng is not None:
            self.env[name] = self.rng.uniform(-bound, bound, shape).astype(np.float32)
        self.weights.append(name)
        self.wbytes += math.prod(shape) * 4
        return T("Var", name, tensor_type(self.dtype, shape))

    def linear(self, key: str, where: str, p: dict, ref: np.ndarray | None) -> np.ndarray | None:
        """A Linear layer on the current features; after the Flatten of an image, whose features
        are in pixel-major (HWC) order, the weight's columns, given in PyTorch's channel-major
        (CHW) order, are reordered to match by the host when it lays the weight out."""
        out, width = p["out_features"], self.width
        _check_size(f"{where}: the weight", out, width)
        _check_size(f"{where}: the output", self.batch, out)
        bound = 1 / math.sqrt(width)
        wv = self.weight(f"W{key}", (out, width), bound)
        if ref is not None:
            ref = ref @ self.env[f"W{key}"].T.astype(np.float64)
        if self.chw is not None:
            wv = T("App", T("Map", chw_to_hwc(ty(wv).args[0], *self.chw), out), wv)
            self.chw = None
        if p["bias"]:
            bv = self.weight(f"b{key}", (out,), bound)
            if ref is not None:
                ref = ref + self.env[f"b{key}"]
            self.stages.append(T("Linear", wv, bv, ta(self.s, width)))
        else:
            self.stages.append(T("LinearNB", wv, ta(self.s, width)))
        self.macs += self.batch * out * width
        self.width = out
        return ref

    def cell_term(self, i: int, spec: LayerSpec, p: dict) -> tuple[Term, Term, object]:
        """A cell's IR function over (x, state), its per-row state type, and a random initial
        state of every batch row (h, or the pair (h, c) for an LSTM)."""
        kind = SEQUENCES.get(spec.name, spec.name)
        gates = CELLS[kind]
        n_i, n_h = p["input_size"], p["hidden_size"]
        _check_size(f"layer {i + 1} {spec}: the weight", gates * n_h, max(n_i, n_h))
        bound = 1 / math.sqrt(n_h)
        ws = [self.weight(f"Wih{i}", (gates * n_h, n_i), bound), self.weight(f"Whh{i}", (gates * n_h, n_h), bound)]
        for name in (f"bih{i}", f"bhh{i}"):
            if p["bias"]:
                ws.append(self.weight(name, (gates * n_h,), bound))
            else:  # PyTorch's bias=False is a zero bias
                if self.rng is not None:
                    self.env[name] = np.zeros(gates * n_h, np.float32)
                ws.append(T("Var", name, ta(self.s, gates * n_h)))
        h_t = ta(self.s, n_h)
        state_t = h_t if kind != "LSTMCell" else tp(h_t, h_t)
        states = [self.rng.standard_normal((self.batch, n_h)).astype(np.float32) if self.rng is not None else None
                  for _ in range(2 if kind == "LSTMCell" else 1)]
        value = states[0] if kind != "LSTMCell" else tuple(states)
        extra = (p["nonlinearity"],) if kind == "RNNCell" else ()
        self.macs += self.batch * gates * n_h * (n_i + n_h)
        self.width = n_h
        return T(kind, *ws, *extra, tp(ta(self.s, n_i), state_t)), state_t, value

    def cell_weights(self, i: int) -> list[np.ndarray]:
        """The float64 weights of the cell of layer i: weight_ih, weight_hh, bias_ih, bias_hh."""
        return [self.env[n].astype(np.float64) for n in (f"Wih{i}", f"Whh{i}", f"bih{i}", f"bhh{i}")]

    def cell(self, i: int, spec: LayerSpec, p: dict, ref: np.ndarray) -> object:
        if self.state is not None:
            raise LayerError(f"layer {i + 1} {spec}: only one recurrent cell per layer stack is supported")
        cell, state_t, value = self.cell_term(i, spec, p)
        self.state = (spec.name, state_t, value)
        pair_t = tp(ta(self.s, self.feats), state_t)
        feed = T("Fork", comp(*reversed(self.stages), T("Fst", pair_t)), T("Snd", pair_t))
        self.stages = [T("Comp", cell, feed)]
        if ref is None:
            return None
        return _cell_reference(spec.name, ref, value, *self.cell_weights(i), p.get("nonlinearity", "tanh"))


def _where(key: str, spec: LayerSpec) -> str:
    """How errors name a layer: its position (a branch layer's as 2.1) and its call."""
    return f"layer {'.'.join(str(int(k) + 1) for k in key.split('.'))} {spec}"


def _nested(layers: list[LayerSpec]):
    """Every layer of a stack, those inside a Residual's branch included."""
    for spec in layers:
        yield spec
        if spec.name == "Residual":
            yield from _nested(list(spec.args))


def _changed_by(where: str, branch: tuple, shapes: list[str]) -> None:
    """Raise unless a residual branch ends with the shape of its input (shapes: the input's,
    then after each branch layer), naming the last branch layer that changed it."""
    if shapes[-1] != shapes[0]:
        last = max(j for j in range(len(branch)) if shapes[j + 1] != shapes[j])
        raise LayerError(f"{where}: the branch must keep the shape of its input, {shapes[0]}, but "
                         f"{branch[last]} makes it {shapes[-1]}")


def _feature_layer(b: _Builder, key: str, spec: LayerSpec, ref: object) -> object:
    """Add one layer over feature vectors (one row of the batch) to the stages; returns the
    reference after it."""
    where = _where(key, spec)
    p = bind(spec)
    expects = p.get("in_features", p.get("input_size"))
    if expects is not None and expects != b.width:
        raise LayerError(f"{where}: expects {expects} input features, but receives {b.width}")
    if b.state is not None and b.state[0] == "LSTMCell":
        raise LayerError(f"{where}: LSTMCell returns (h, c) and must be the last layer")
    inside = "." in key
    if spec.name == "Linear":
        return b.linear(key, where, p, ref)
    if spec.name == "Flatten":
        if p["start_dim"] not in (1, -1) or p["end_dim"] not in (1, -1):
            raise LayerError(f"{where}: a BxF input has dimensions 0 and 1; only start_dim=1, end_dim=-1 "
                             f"(which leaves it as it is) is supported")
        return ref
    if spec.name == "Residual":
        if b.chw is not None:
            raise LayerError(f"{where}: a Residual right after Flatten is not supported; put a Linear between them")
        t, outer = ta(b.s, b.width), b.stages
        b.stages, shapes, branch = [], [f"{b.width} features"], ref
        for j, sub in enumerate(spec.args):
            branch = _feature_layer(b, f"{key}.{j}", sub, branch)
            shapes.append(f"{b.width} features")
        _changed_by(where, spec.args, shapes)
        f = comp(*reversed(b.stages)) if b.stages else T("Id", t)
        b.stages = outer
        b.stages.append(T("Comp", T("VVAdd", tp(t, t)), T("Fork", T("Id", t), f)))
        return None if ref is None else ref + branch
    if spec.name in CELLS and not inside:
        return b.cell(int(key), spec, p, ref)
    if spec.name not in ACTIVATIONS:
        raise LayerError(f"{where}: a {spec.name} layer cannot be inside a Residual")
    op, fn = ACTIVATIONS[spec.name]
    b.stages.append(T(op, ta(b.s, b.width)))
    return fn(ref) if ref is not None else None


def _gemm_model(spec: LayerSpec, stored: tuple[int, int], rng: np.random.Generator | None, dtype: str) -> Model:
    """C = op(A) . op(B) (DeepBench's convention): A is the input, stored K x M when a_t; B is a
    weight, stored N x K when b_t."""
    p = bind(spec)
    k, n = p["in_features"], p["out_features"]
    if (stored[0] if p["a_t"] else stored[1]) != k:
        raise LayerError(f"{spec}: input stored as {stored[0]}x{stored[1]} has no dimension of "
                         f"{k} features where {'a_t' if p['a_t'] else 'the layout'} puts it")
    m = stored[1] if p["a_t"] else stored[0]
    b_stored = (n, k) if p["b_t"] else (k, n)
    _check_size(f"{spec}: the weight", *b_stored)
    _check_size(f"{spec}: the output", m, n)
    a_term = T("Var", "x", tensor_type(dtype, stored))
    if p["a_t"]:
        a_term = T("App", T("Transpose", tensor_type(dtype, stored)), a_term)
    # each row of op(A) goes through a bias-free Linear layer whose n x k weight is op(B)^T, so a
    # GEMM gets every rule a batched Linear layer has (pinned weights, bands, weight-stationary)
    w_term = T("Var", "B", tensor_type(dtype, b_stored))
    if not p["b_t"]:
        w_term = T("App", T("Transpose", tensor_type(dtype, b_stored)), w_term)
    row = ta(ts(dtype), k)
    program = comp(T("ToOutput", tensor_type(dtype, (m, n))), T("Map", T("LinearNB", w_term, row), m))
    env: dict[str, np.ndarray] = {}
    ref = None
    if rng is not None:
        env = {"x": rng.standard_normal(stored).astype(np.float32),
               "B": rng.uniform(-1 / math.sqrt(k), 1 / math.sqrt(k), b_stored).astype(np.float32)}
        a64, b64 = env["x"].astype(np.float64), env["B"].astype(np.float64)
        ref = ((a64.T if p["a_t"] else a64) @ (b64.T if p["b_t"] else b64)).astype(np.float32)
    return Model([spec], stored, (m, n), T("App", program, a_term), env, ref, m * n * k, k * n * 4,
                 (m * k + m * n) * 4, dtype, ["B"])


def parse_window(where: str, p: dict) -> Window:
    """The window sizes of a conv or pool layer as pairs, each checked (stride None: the kernel)."""
    sizes = {}
    for name, least in (("kernel_size", 1), ("stride", 1), ("padding", 0), ("dilation", 1)):
        v = p.get(name, 1)  # AvgPool2d has no dilation
        if v is None:
            v = sizes["kernel_size"]
        pair = (v, v) if isinstance(v, int) and not isinstance(v, bool) else v
        if (not isinstance(pair, tuple) or len(pair) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= least for x in pair)):
            raise LayerError(f"{where}: {name} must be an integer >= {least} or a pair of them, got {v!r}")
        sizes[name] = pair
    return Window(sizes["kernel_size"], sizes["stride"], sizes["padding"], sizes["dilation"])


def _image_layer(b: _Builder, s: Stages, key: str, spec: LayerSpec, ref: np.ndarray | None,
                 computed: bool) -> np.ndarray | None:
    """Add one layer over HWC images to the stages; returns the reference after it. `computed`:
    the layer's input is computed on chip (not the stack's input, which the host lays out)."""
    where = _where(key, spec)
    p = bind(spec)
    h, w, c = shape_of(s.t)
    if spec.name == "Residual":
        return _image_residual(b, s, key, spec, ref, computed)
    if spec.name in ACTIVATIONS:
        op, fn = ACTIVATIONS[spec.name]
        elementwise(s, op)
        return fn(ref) if ref is not None else None
    if spec.name not in SPATIAL:
        raise LayerError(f"{where}: a {spec.name} layer cannot take an image (its input is "
                         f"{c}x{h}x{w} channels x rows x columns)")
    win = parse_window(where, p)
    if spec.name == "MaxPool2d":
        for flag, ok in (("return_indices", False), ("ceil_mode", False)):
            if p[flag] != ok:
                raise LayerError(f"{where}: {flag}={p[flag]!r} is not supported")
        if any(2 * pad > k for pad, k in zip(win.padding, win.kernel)):
            raise LayerError(f"{where}: padding {win.padding[0]}x{win.padding[1]} is more than half the kernel "
                             f"{win.kernel[0]}x{win.kernel[1]} (PyTorch's limit for max pooling)")
    if spec.name == "AvgPool2d":
        if p["ceil_mode"] or p["divisor_override"] is not None or not p["count_include_pad"]:
            raise LayerError(f"{where}: only ceil_mode=False, count_include_pad=True and no divisor_override "
                             f"are supported")
        if win.dilation != (1, 1):
            raise LayerError(f"{where}: AvgPool2d has no dilation")
    groups = p.get("groups", 1)
    if spec.name == "Conv2d":
        if p["in_channels"] != c:
            raise LayerError(f"{where}: expects {p['in_channels']} input channels, but receives {c}")
        if not isinstance(groups, int) or isinstance(groups, bool) or groups <= 0:
            raise LayerError(f"{where}: groups must be a positive integer, got {groups!r}")
        if c % groups or p["out_channels"] % groups:
            raise LayerError(f"{where}: in_channels {c} and out_channels {p['out_channels']} must both be "
                             f"divisible by groups {groups}")
    depthwise = spec.name == "Conv2d" and groups == c == p["out_channels"] > 1
    if computed and (win.padding != (0, 0) or (spec.name == "Conv2d" and not depthwise and win.kernel != (1, 1))):
        raise LayerError(f"{where}: after another layer, only unpadded pooling, depthwise and 1x1 convolutions "
                         f"are supported (the host lays out padding and im2col matrices of the stack's input; "
                         f"codegen has no on-chip im2col yet)")
    oh, ow = win.out_size(h, 0), win.out_size(w, 1)
    if oh <= 0 or ow <= 0:
        raise LayerError(f"{where}: the {win.span(0)}x{win.span(1)} window (kernel {win.kernel[0]}x{win.kernel[1]}, "
                         f"dilation {win.dilation[0]}x{win.dilation[1]}) is larger than the padded input "
                         f"{h + 2 * win.padding[0]}x{w + 2 * win.padding[1]}")
    if spec.name != "Conv2d":
        kind = "max" if spec.name == "MaxPool2d" else "avg"
        scale = None
        if kind == "avg":
            scale = T("Var", f"scale{key}", ta(b.s, c))
            if b.rng is not None:
                b.env[f"scale{key}"] = np.full(c, 1 / (win.kernel[0] * win.kernel[1]), np.float32)
        pool(s, win, kind, scale, flat=not computed)
        return pool_reference(ref, win, kind) if ref is not None else None
    o, (kh, kw) = p["out_channels"], win.kernel
    _check_size(f"{where}: the im2col matrix", oh * ow, kh * kw * c)
    fan_in = c // groups * kh * kw
    wt = b.weight(f"W{key}", (o, c // groups, kh, kw), 1 / math.sqrt(fan_in))
    bt = b.weight(f"b{key}", (o,), 1 / math.sqrt(fan_in)) if p["bias"] else None
    if depthwise:
        depthwise_conv(s, win, wt, bt)
    else:
        conv(s, win, block_diagonal(wt, groups) if groups > 1 else wt, bt)
    b.macs += b.batch * o * oh * ow * fan_in
    if ref is None:
        return None
    return conv_reference(ref, b.env[f"W{key}"], b.env.get(f"b{key}"), win, groups)


def _image_residual(b: _Builder, s: Stages, key: str, spec: LayerSpec, ref: np.ndarray | None,
                    computed: bool) -> np.ndarray | None:
    """y = x + f(x) on an image: the branch f built on its own stages from the same input, then
    the two images added pixel by pixel (their channel vectors)."""
    where, t = _where(key, spec), s.t

    def shape(u: Term) -> str:
        h, w, c = shape_of(u)
        return f"{c}x{h}x{w} (channels x rows x columns)"

    branch, shapes, val = Stages(t), [shape(t)], ref
    for j, sub in enumerate(spec.args):
        if sub.name == "Flatten":
            raise LayerError(f"{_where(f'{key}.{j}', sub)}: a Flatten cannot be inside a Residual (the branch must "
                             f"keep the shape of its input, {shape(t)})")
        val = _image_layer(b, branch, f"{key}.{j}", sub, val, computed or j > 0)
        shapes.append(shape(branch.t))
    _changed_by(where, spec.args, shapes)
    s.then(T("Comp", add_images(t), T("Fork", T("Id", t), comp(*reversed(branch.parts)))))
    return None if ref is None else ref + val


def _flatten(b: _Builder, s: Stages, i: int, spec: LayerSpec, rest: list[LayerSpec]) -> None:
    """Flatten(1, -1) of an image: when a Linear follows (after activations, which act on every
    element alike), its features are the image's [H][W][C] joined and that Linear reorders its
    weight's columns (b.chw); when none does, the image stays and the host reshapes the NCHW
    output it reads back."""
    where = _where(str(i), spec)
    p = bind(spec)
    if p["start_dim"] not in (1, -3) or p["end_dim"] not in (3, -1):
        raise LayerError(f"{where}: only start_dim=1, end_dim=-1 (each image to one vector of its C*H*W values) "
                         f"is supported on an NxCxHxW input")
    h, w, c = shape_of(s.t)
    after = next((later for later in rest if later.name not in ACTIVATIONS), None)
    if after is not None and after.name != "Linear":
        raise LayerError(f"{where}: after Flatten, the next layer other than an activation must be a Linear, "
                         f"got {after}")
    if after is not None:
        s.then(T("Join", s.t))
        s.then(T("Join", s.t))
        b.width, b.chw = c * h * w, (c, h, w)


def build_image_model(layers: list[LayerSpec], input_shape: tuple[int, ...], seed: int = 0, dtype: str = "f32",
                      values: bool = True) -> Model:
    """A stack of image layers (Conv2d, pooling, activations, residual blocks) on an N x C x H x W
    input, perhaps then Flatten and layers over features. Each image is turned to HWC by the
    host's layout; the stack works per image (a Map over the batch) and an image output is read
    back as NCHW."""
    if len(input_shape) != 4:
        raise LayerError(f"image layers need an input NxCxHxW, got {'x'.join(map(str, input_shape))}")
    n, c, h, w = input_shape
    _check_size("the input", n, c, h, w)
    rng = np.random.default_rng(seed) if values else None
    b = _Builder(n, c, rng, dtype)
    img = tensor_type(dtype, (c, h, w))
    s = Stages(img)
    s.then(to_hwc(img))
    x = rng.standard_normal(input_shape).astype(np.float32) if rng is not None else None
    ref = x.astype(np.float64) if x is not None else None
    flat = False  # whether a Flatten has run
    for i, spec in enumerate(layers):
        if len(shape_of(s.t)) == 1:  # flattened: layers over features
            if spec.name in CELLS:
                raise LayerError(f"{_where(str(i), spec)}: a recurrent cell after Flatten is not supported")
            ref = _feature_layer(b, str(i), spec, ref)
        elif spec.name == "Flatten":
            _flatten(b, s, i, spec, layers[i + 1 :])
            flat = True
            ref = None if ref is None else ref.reshape(n, -1)
        else:
            ref = _image_layer(b, s, str(i), spec, ref, i > 0)
    for f in b.stages:
        s.then(f)
    body = comp(*reversed(s.parts))
    if len(shape_of(s.t)) == 1:  # features: [batch][features] out
        out_shape: tuple[int, ...] = (n, b.width)
        back = []
    else:  # an image, read back as NCHW (flattened, when a Flatten ends the stack)
        oh, ow, oc = shape_of(s.t)
        _check_size("the output", n, oc, oh, ow)
        out_shape = (n, oc * oh * ow) if flat else (n, oc, oh, ow)
        back = [to_chw(s.t) if n == 1 else T("Map", to_chw(s.t), n)]
    if n == 1:
        program = comp(*back, T("ToOutput", s.t), body)
        xv = T("Var", "x", img)
    else:
        program = comp(*back, T("ToOutput", ta(s.t, n)), T("Map", body, n))
        xv = T("Var", "x", tensor_type(dtype, input_shape))
    env = b.env
    if x is not None:
        env["x"] = x if n > 1 else x[0]
    io = (math.prod(input_shape) + math.prod(out_shape)) * 4
    reference = ref.astype(np.float32) if ref is not None else None
    return Model(list(layers), tuple(input_shape), out_shape, T("App", program, xv), env, reference, b.macs,
                 b.wbytes, io, dtype, b.weights)


def _state_input(kind: str, state_t: Term, value: object, batch: int, env: dict[str, np.ndarray]) -> Term:
    """The value term of a cell's initial state over the batch (h; for an LSTM the pair (h, c),
    zipped per row at batch > 1), its values put in env (when there are values)."""
    names = ("h",) if kind != "LSTMCell" else ("h", "c")
    parts = (value,) if kind != "LSTMCell" else value
    row_t = state_t if kind != "LSTMCell" else state_t.args[0]
    terms = [T("Var", name, row_t if batch == 1 else ta(row_t, batch)) for name in names]
    for name, v in zip(names, parts):
        if v is not None:
            env[name] = v if batch > 1 else v[0]
    if kind != "LSTMCell":
        return terms[0]
    pair = T("Pair", *terms)
    return pair if batch == 1 else T("App", T("Zip", tp(ta(row_t, batch), ta(row_t, batch))), pair)


def _sequence_model(layers: list[LayerSpec], shape: tuple[int, ...], seed: int, dtype: str, values: bool) -> Model:
    """A recurrent layer over time (GRU, LSTM, RNN), input TxBxF: a Fold over the time steps
    whose step is the cell; returns the last hidden state h_T (for an LSTM, (h_T, c_T))."""
    recurrent = [s for s in layers if s.name in SEQUENCES]
    if not recurrent:
        raise LayerError(f"input shape {'x'.join(map(str, shape))} is TxBxF (time x batch x features), which only "
                         f"GRU, LSTM and RNN take; {layers[0]} takes BxF")
    spec = recurrent[0]
    if len(layers) != 1:
        raise LayerError(f"{spec}: a recurrent layer over time (GRU, LSTM, RNN) must be the only layer for now")
    p = bind(spec)
    if len(shape) != 3:
        raise LayerError(f"layer 1 {spec}: expects a TxBxF input (time x batch x features), "
                         f"got {len(shape)} dimensions {'x'.join(map(str, shape))}")
    if p["num_layers"] != 1:
        raise LayerError(f"layer 1 {spec}: num_layers={p['num_layers']} is not supported yet (one layer)")
    if p["batch_first"]:
        raise LayerError(f"layer 1 {spec}: batch_first=True is not supported; give the input as TxBxF")
    steps, batch, feats = shape
    if p["input_size"] != feats:
        raise LayerError(f"layer 1 {spec}: expects {p['input_size']} input features, but receives {feats}")
    _check_size("the input", steps, batch, feats)
    rng = np.random.default_rng(seed) if values else None
    b = _Builder(batch, feats, rng, dtype)
    kind = SEQUENCES[spec.name]
    x = rng.standard_normal((steps, batch, feats)).astype(np.float32) if rng is not None else None
    cell, state_t, value = b.cell_term(0, spec, p)
    x_row = ta(b.s, feats)
    pair_t = tp(state_t, x_row)
    step = T("Comp", cell, T("Fork", T("Snd", pair_t), T("Fst", pair_t)))
    if batch > 1:
        step = T("Comp", T("Map", step, batch), T("Zip", tp(ta(state_t, batch), ta(x_row, batch))))
    env = b.env
    init = _state_input(kind, state_t, value, batch, env)
    xs = T("Var", "x", ta(x_row if batch == 1 else ta(x_row, batch), steps))
    if x is not None:
        env["x"] = x if batch > 1 else x[:, 0, :]
    fold = T("Fold", step, tp(ty(init), ty(xs)))
    program = comp(T("ToOutput", fout(fold)), fold)
    n_h = p["hidden_size"]
    states = 2 if kind == "LSTMCell" else 1
    out_shape = (2, batch, n_h) if kind == "LSTMCell" else (batch, n_h)
    reference = None
    if x is not None:
        ref: object = value if kind != "LSTMCell" else np.stack(value)
        for t in range(steps):
            ref = _cell_reference(kind, x[t].astype(np.float64), ref, *b.cell_weights(0), p.get("nonlinearity", "tanh"))
        reference = np.asarray(ref, dtype=np.float32)
    io = (steps * batch * feats + states * batch * n_h + math.prod(out_shape)) * 4
    return Model(list(layers), shape, out_shape, T("App", program, T("Pair", init, xs)), env, reference,
                 b.macs * steps, b.wbytes, io, dtype, b.weights)


def build_model(layers: list[str | LayerSpec], input_shape: tuple[int, ...], seed: int = 0, dtype: str = "f32",
                values: bool = True) -> Model:
    """Build the program term App(ToOutput . layers, input) from layer calls (text or parsed).
    Batch 1 is a vector program; larger batches map the per-row stack over the rows. A recurrent
    cell's state (h, or (h, c)) is a second input, random like the first; LSTMCell returns
    (h', c') and must come last."""
    layers = [parse_layer(s) if isinstance(s, str) else s for s in layers]
    if not layers:
        raise LayerError("no layers given")
    if not isinstance(seed, int) or seed < 0:
        raise LayerError(f"seed must be a non-negative integer, got {seed!r}")
    if len(input_shape) == 3 or any(spec.name in SEQUENCES for spec in layers):
        return _sequence_model(list(layers), tuple(input_shape), seed, dtype, values)
    if any(spec.name in SPATIAL for spec in _nested(layers)) or len(input_shape) == 4:
        return build_image_model(layers, tuple(input_shape), seed, dtype, values)
    if len(input_shape) != 2:
        raise LayerError(f"input shape {input_shape} must be (batch, features)")
    batch, feats = input_shape
    _check_size("the input", batch, feats)
    rng = np.random.default_rng(seed) if values else None
    if any(spec.name == "MatMul" for spec in layers):
        if len(layers) != 1:
            raise LayerError("MatMul (a GEMM) must be the only layer")
        return _gemm_model(layers[0], (batch, feats), rng, dtype)
    b = _Builder(batch, feats, rng, dtype)
    x = rng.standard_normal((batch, feats)).astype(np.float32) if rng is not None else None
    ref: object = x.astype(np.float64) if x is not None else None
    for i, spec in enumerate(layers):
        ref = _feature_layer(b, str(i), spec, ref)
    body = comp(*reversed(b.stages))
    row_out = fout(body)
    x_row = ta(b.s, feats)
    env = b.env
    if x is not None:
        env["x"] = x if batch > 1 else x[0]
    if b.state is None:
        xv = T("Var", "x", x_row if batch == 1 else tensor_type(dtype, (batch, feats)))
    else:
        kind, state_t, value = b.state
        xv_ = T("Var", "x", x_row if batch == 1 else ta(x_row, batch))
        sv = _state_input(kind, state_t, value, batch, env)
        xv = T("Pair", xv_, sv) if batch == 1 else T("App", T("Zip", tp(ta(x_row, batch), ta(state_t, batch))),
                                                     T("Pair", xv_, sv))
    if batch == 1:
        program = comp(T("ToOutput", row_out), body)
    else:
        program = comp(T("ToOutput", ta(row_out, batch)), T("Map", body, batch))
    out_shape = (2, batch, b.width) if b.state is not None and b.state[0] == "LSTMCell" else (batch, b.width)
    io = (batch * feats + math.prod(out_shape)) * 4
    reference = np.asarray(ref, dtype=np.float32) if ref is not None else None
    return Model(list(layers), tuple(input_shape), out_shape, T("App", program, xv), env,
                 reference, b.macs, b.wbytes, io, dtype, b.weights)

