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

from egraph_rules.ir import T, Term, comp, nbytes, ta, tensor_type, ts


class LayerError(ValueError):
    """A layer, its arguments or the input shape are not valid; the message says which."""


@dataclass(frozen=True)
class LayerSpec:
    """A parsed constructor call."""

    name: str
    args: tuple
    kwargs: tuple[tuple[str, object], ...]

    def __str__(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs]
        return f"{self.name}({', '.join(parts)})"


#: layer name -> (positional parameter names, keyword parameters with defaults)
SIGNATURES: dict[str, tuple[tuple[str, ...], dict[str, object]]] = {
    "Linear": (("in_features", "out_features"), {"bias": True}),
    "ReLU": ((), {"inplace": False}),
    "Tanh": ((), {}),
    "Sigmoid": ((), {}),
}
ACTIVATIONS = {"ReLU": ("VVRelu", lambda x: np.maximum(x, 0)), "Tanh": ("VVTanh", np.tanh),
               "Sigmoid": ("VVSigm", lambda x: 1 / (1 + np.exp(-x)))}


def parse_layer(text: str) -> LayerSpec:
    """Parse one constructor call such as `Linear(1024, 1000)`; literals only."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise LayerError(f"cannot parse layer {text!r}: expected a call such as Linear(1024, 1000)") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise LayerError(f"layer {text!r} is not a constructor call such as Linear(1024, 1000)")
    name = node.func.id
    if name not in SIGNATURES:
        raise LayerError(f"unknown layer {name!r}; known layers: {', '.join(SIGNATURES)}")
    try:
        args = tuple(ast.literal_eval(a) for a in node.args)
        kwargs = tuple((k.arg, ast.literal_eval(k.value)) for k in node.keywords)
    except ValueError:
        raise LayerError(f"{name}: arguments must be literal numbers or booleans in {text!r}") from None
    if any(k is None for k, _ in kwargs):
        raise LayerError(f"{name}: **kwargs are not accepted")
    return LayerSpec(name, args, kwargs)


def bind(spec: LayerSpec) -> dict[str, object]:
    """The layer's parameters by name, checked against its PyTorch signature."""
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
        v = params[p]
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise LayerError(f"{spec.name}: {p} must be a positive integer, got {v!r}")
    for k, d in defaults.items():
        if isinstance(d, bool) and not isinstance(params[k], bool):
            raise LayerError(f"{spec.name}: {k} must be True or False, got {params[k]!r}")
    return params


def parse_shape(text: str) -> tuple[int, ...]:
    """Parse an input shape such as `1x1024`."""
    try:
        dims = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        raise LayerError(f"input shape {text!r} is not of the form BxF, e.g. 1x1024") from None
    if len(dims) != 2 or any(d <= 0 for d in dims):
        raise LayerError(f"input shape {text!r} must be two positive sizes BxF (batch x features)")
    return dims


@dataclass
class Model:
    """A layer stack as one IR program term, with its values and an independent reference."""

    layers: list[LayerSpec]
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    term: Term
    env: dict[str, np.ndarray]
    reference: np.ndarray
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


def build_model(layers: list[LayerSpec], input_shape: tuple[int, ...], seed: int = 0, dtype: str = "f32") -> Model:
    """Build the program term App(ToOutput . layers, x); batch 1 is a vector program, larger
    batches map the per-row layer stack over the rows."""
    if not layers:
        raise LayerError("no layers given")
    if len(input_shape) != 2:
        raise LayerError(f"input shape {input_shape} must be (batch, features)")
    if not isinstance(seed, int) or seed < 0:
        raise LayerError(f"seed must be a non-negative integer, got {seed!r}")
    batch, feats = input_shape
    _check_size("the input", batch, feats)
    rng = np.random.default_rng(seed)
    s = ts(dtype)
    env: dict[str, np.ndarray] = {}
    x = rng.standard_normal((batch, feats)).astype(np.float32)
    ref = x.astype(np.float64)
    stages: list[Term] = []
    width, macs, wbytes = feats, 0, 0
    weights = []
    for i, spec in enumerate(layers):
        p = bind(spec)
        if spec.name == "Linear":
            if p["in_features"] != width:
                raise LayerError(f"layer {i + 1} {spec}: expects {p['in_features']} input features, "
                                 f"but receives {width}")
            out = p["out_features"]
            _check_size(f"layer {i + 1} {spec}: the weight", out, width)
            _check_size(f"layer {i + 1} {spec}: the output", batch, out)
            bound = 1 / math.sqrt(width)
            w = rng.uniform(-bound, bound, (out, width)).astype(np.float32)
            wname = f"W{i}"
            env[wname] = w
            weights.append(wname)
            wv = T("Var", wname, tensor_type(dtype, (out, width)))
            ref = ref @ w.T.astype(np.float64)
            if p["bias"]:
                b = rng.uniform(-bound, bound, out).astype(np.float32)
                env[f"b{i}"] = b
                weights.append(f"b{i}")
                ref = ref + b
                stages.append(T("Linear", wv, T("Var", f"b{i}", ta(s, out)), ta(s, width)))
            else:
                stages.append(T("LinearNB", wv, ta(s, width)))
            macs += batch * out * width
            wbytes += nbytes(tensor_type(dtype, (out, width))) + (out * 4 if p["bias"] else 0)
            width = out
        else:
            op, fn = ACTIVATIONS[spec.name]
            stages.append(T(op, ta(s, width)))
            ref = fn(ref)
    body = comp(*reversed(stages))
    env["x"] = x if batch > 1 else x[0]
    if batch == 1:
        program = comp(T("ToOutput", ta(s, width)), body)
        xv = T("Var", "x", ta(s, feats))
    else:
        program = comp(T("ToOutput", tensor_type(dtype, (batch, width))), T("Map", body, batch))
        xv = T("Var", "x", tensor_type(dtype, (batch, feats)))
    io = (batch * feats + batch * width) * 4
    return Model(list(layers), tuple(input_shape), (batch, width), T("App", program, xv), env,
                 ref.astype(np.float32), macs, wbytes, io, dtype, weights)
