"""The frontend: PyTorch-style layer calls and input shapes, accepted and rejected; the model
term, weights and reference against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egraph_rules.interpreter import Interpreter
from egraph_rules.ir import ta, tensor_type, ts, ty
from frontend.layers import LayerError, LayerSpec, bind, build_model, parse_layer, parse_shape

# ---------------------------------------------------------------- parse_layer and bind


@pytest.mark.parametrize("text, expected", [
    ("Linear(1024, 1000)", {"in_features": 1024, "out_features": 1000, "bias": True}),
    ("  Linear(4, 2, bias=False) ", {"in_features": 4, "out_features": 2, "bias": False}),
    ("Linear(4, 2, False)", {"in_features": 4, "out_features": 2, "bias": False}),
    ("Linear(in_features=4, out_features=2)", {"in_features": 4, "out_features": 2, "bias": True}),
    ("Linear(out_features=2, in_features=4)", {"in_features": 4, "out_features": 2, "bias": True}),
    ("ReLU()", {"inplace": False}),
    ("ReLU(inplace=True)", {"inplace": True}),
    ("Tanh()", {}),
    ("Sigmoid()", {}),
    ("Flatten()", {"start_dim": 1, "end_dim": -1}),
    ("Flatten(1, -1)", {"start_dim": 1, "end_dim": -1}),
])
def test_accepted_layers(text, expected):
    spec = parse_layer(text)
    assert isinstance(spec, LayerSpec)
    assert bind(spec) == expected


def test_residual_reads_its_branch_as_layer_calls():
    spec = parse_layer("Residual(Linear(64, 64), ReLU())")
    assert bind(spec) == {"layers": (parse_layer("Linear(64, 64)"), parse_layer("ReLU()"))}
    assert str(spec) == "Residual(Linear(64, 64), ReLU())"
    assert str(parse_layer("Residual(Residual(Conv2d(8, 8, 3, padding=1)), Tanh())")) == \
        "Residual(Residual(Conv2d(8, 8, 3, padding=1)), Tanh())"


def test_layer_spec_prints_as_a_call():
    assert str(parse_layer("Linear(1024,1000)")) == "Linear(1024, 1000)"
    assert str(parse_layer("Linear(4, 2, bias=False)")) == "Linear(4, 2, bias=False)"
    assert str(parse_layer("ReLU()")) == "ReLU()"


@pytest.mark.parametrize("text, message", [
    ("Conv3d(3, 4)", "unknown layer 'Conv3d'"),
    ("Conv2d(3, 4)", "Conv2d is missing kernel_size"),
    ("relu()", "unknown layer"),
    ("nn.ReLU()", "not a constructor call"),
    ("Linear", "not a constructor call"),
    ("Linear(4, 2)(x)", "not a constructor call"),
    ("Linear(4, 2", "cannot parse"),
    ("", "cannot parse"),
    ("Linear(4, 2); ReLU()", "cannot parse"),
    ("Linear(x, 3)", "literal"),
    ("Linear(*[4, 2])", "literal"),
    ("Linear(10**3, 3)", "literal"),
    ("Linear(**{'bias': True})", r"\*\*kwargs"),
    ("Residual()", "Residual takes the layers of its branch"),
    ("Residual(ReLU(), inplace=True)", "Residual takes the layers of its branch"),
    ("Residual(3)", "Residual: its arguments must be layer calls such as ReLU\\(\\), got '3'"),
    ("Residual(Conv3d(3, 4))", "unknown layer 'Conv3d'"),
    ("Residual(Linear(x, 3))", "literal"),
    ("Linear(ReLU(), 3)", "literal"),
    ("Flatten(start_dim=1.5)", "start_dim must be an integer, got 1.5"),
])
def test_rejected_by_parse_or_bind(text, message):
    with pytest.raises(LayerError, match=message):
        bind(parse_layer(text))


@pytest.mark.parametrize("text, message", [
    ("Linear(4)", "missing out_features"),
    ("Linear()", "missing in_features, out_features"),
    ("Linear(4, 2, True, 1)", "takes 2 positional arguments"),
    ("Tanh(1)", "takes 0 positional arguments"),
    ("Linear(4, 2, bias=1)", "bias must be True or False"),
    ("Linear(4, 2, 3)", "bias must be True or False"),
    ("ReLU(1)", "inplace must be True or False"),
    ("Linear(4, 2, weight=1)", "no argument 'weight'"),
    ("Linear(4, 2, in_features=4)", "given twice"),
    ("Linear(0, 3)", "in_features must be a positive integer"),
    ("Linear(3, 0)", "out_features must be a positive integer"),
    ("Linear(-3, 3)", "in_features must be a positive integer"),
    ("Linear(3, -1)", "out_features must be a positive integer"),
    ("Linear(True, 3)", "in_features must be a positive integer"),
    ("Linear(1.5, 3)", "in_features must be a positive integer"),
    ("Linear('4', 3)", "in_features must be a positive integer"),
    ("Linear([4], 3)", "in_features must be a positive integer"),
])
def test_wrong_arguments_are_rejected(text, message):
    with pytest.raises(LayerError, match=message):
        bind(parse_layer(text))


@pytest.mark.parametrize("template", [
    "Linear(__import__('os').system('touch {p}'), 3)",
    "Linear(4, open('{p}', 'w').write('x'))",
    "Linear(4, 2, bias=open('{p}', 'w').close())",
    "ReLU(inplace=[open('{p}', 'w') for _ in 'x'])",
    "Linear(*open('{p}', 'w'))",
])
def test_code_in_arguments_is_rejected_without_running(template, tmp_path):
    marker = tmp_path / "executed"
    with pytest.raises(LayerError):
        bind(parse_layer(template.format(p=marker)))
    assert not marker.exists(), "the layer text was executed"


def test_import_call_is_rejected():
    with pytest.raises(LayerError, match="literal"):
        parse_layer("Linear(__import__('os'), 3)")


# ---------------------------------------------------------------- parse_shape


@pytest.mark.parametrize("text, shape", [("1x1024", (1, 1024)), ("16x64", (16, 64)), ("2X3", (2, 3))])
def test_accepted_shapes(text, shape):
    assert parse_shape(text) == shape


@pytest.mark.parametrize("text", ["1024", "1x2x3x4x5", "2x0x4", "0x4", "4x0", "-1x4", "1x-4", "axb", "1x", "x4", "",
                                  "1.5x3", "1*1024", "1,1024"])
def test_rejected_shapes(text):
    with pytest.raises(LayerError, match="input shape"):
        parse_shape(text)


# ---------------------------------------------------------------- build_model


def _numpy_forward(specs, model):
    """The layer stack in plain numpy (float64), from the model's weights."""
    x = model.env["x"].astype(np.float64)
    x = x.reshape(model.input_shape)
    for i, spec in enumerate(specs):
        p = bind(spec)
        if spec.name == "Linear":
            x = x @ model.env[f"W{i}"].astype(np.float64).T
            if p["bias"]:
                x = x + model.env[f"b{i}"]
        elif spec.name == "ReLU":
            x = np.maximum(x, 0)
        elif spec.name == "Tanh":
            x = np.tanh(x)
        else:
            x = 1 / (1 + np.exp(-x))
    return x


STACKS = [
    ["Linear(8, 5)"],
    ["Linear(8, 5, bias=False)", "Tanh()"],
    ["Linear(8, 6)", "ReLU()", "Linear(6, 3)", "Sigmoid()"],
    ["ReLU()"],
    ["Sigmoid()", "Linear(8, 2, bias=False)"],
]


@pytest.mark.parametrize("texts", STACKS, ids=lambda t: "+".join(t))
@pytest.mark.parametrize("batch", [1, 3])
def test_reference_is_numpy(texts, batch):
    specs = [parse_layer(t) for t in texts]
    model = build_model(specs, (batch, 8), seed=5)
    expected = _numpy_forward(specs, model)
    assert model.reference.shape == expected.shape == model.output_shape
    np.testing.assert_allclose(model.reference, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("texts", STACKS, ids=lambda t: "+".join(t))
@pytest.mark.parametrize("batch", [1, 3])
def test_model_term_means_the_reference(texts, batch):
    model = build_model([parse_layer(t) for t in texts], (batch, 8), seed=2)
    width = model.output_shape[1]
    assert ty(model.term) == (ta(ts("f32"), width) if batch == 1 else tensor_type("f32", (batch, width)))
    value = np.asarray(Interpreter(model.env).value(model.term)).reshape(model.output_shape)
    np.testing.assert_allclose(value, model.reference, rtol=1e-4, atol=1e-5)


def test_model_statistics():
    model = build_model([parse_layer("Linear(8, 6)"), parse_layer("ReLU()"), parse_layer("Linear(6, 3, bias=False)")],
                        (4, 8))
    assert model.output_shape == (4, 3)
    assert model.macs == 4 * (8 * 6 + 6 * 3)
    assert model.weight_bytes == (8 * 6 + 6 + 6 * 3) * 4
    assert model.io_bytes == (4 * 8 + 4 * 3) * 4
    assert model.weights == ["W0", "b0", "W2"]
    assert model.env["W0"].shape == (6, 8) and model.env["W0"].dtype == np.float32
    assert model.env["x"].shape == (4, 8)


def test_batch_one_input_is_a_vector():
    model = build_model([parse_layer("Linear(8, 6)")], (1, 8))
    assert model.env["x"].shape == (8,)
    assert model.reference.shape == (1, 6)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_seed_determines_everything(seed):
    specs = [parse_layer("Linear(8, 4)"), parse_layer("Tanh()")]
    a, b = build_model(specs, (2, 8), seed=seed), build_model(specs, (2, 8), seed=seed)
    assert a.term == b.term
    assert a.env.keys() == b.env.keys()
    for k in a.env:
        np.testing.assert_array_equal(a.env[k], b.env[k])
    c = build_model(specs, (2, 8), seed=seed + 1)
    assert not np.array_equal(a.env["W0"], c.env["W0"])


@pytest.mark.parametrize("batch", [1, 3])
def test_residual_reference_is_numpy(batch):
    """Residual(Linear, ReLU) then Linear, in plain numpy from the model's weights: y = x + f(x)."""
    m = build_model([parse_layer("Residual(Linear(8, 8), ReLU())"), parse_layer("Linear(8, 3)")], (batch, 8), seed=4)
    x = m.env["x"].astype(np.float64).reshape(batch, 8)
    y = x + np.maximum(x @ m.env["W0.0"].astype(np.float64).T + m.env["b0.0"], 0)
    y = y @ m.env["W1"].astype(np.float64).T + m.env["b1"]
    np.testing.assert_allclose(m.reference, y, rtol=1e-6, atol=1e-6)
    value = np.asarray(Interpreter(m.env).value(m.term)).reshape(m.output_shape)
    np.testing.assert_allclose(value, m.reference, rtol=1e-4, atol=1e-5)
    assert m.weights == ["W0.0", "b0.0", "W1", "b1"]


def test_flatten_of_features_leaves_them():
    a = build_model([parse_layer("Flatten()"), parse_layer("Linear(8, 3)")], (2, 8), seed=1)
    b = build_model([parse_layer("Linear(8, 3)")], (2, 8), seed=1)
    assert ty(a.term) == ty(b.term)
    np.testing.assert_array_equal(a.reference, b.reference)


@pytest.mark.parametrize("texts, shape, message", [
    (["Residual(Linear(8, 4))"], (1, 8), r"layer 1 Residual\(Linear\(8, 4\)\): the branch must keep the shape of "
                                          r"its input, 8 features, but Linear\(8, 4\) makes it 4 features"),
    (["ReLU()", "Residual(Linear(8, 4), ReLU(), Tanh())"], (1, 8), "layer 2 .* Linear\\(8, 4\\) makes it 4 features"),
    (["Residual(Linear(7, 8))"], (1, 8), r"layer 1.1 Linear\(7, 8\): expects 7 input features, but receives 8"),
    (["Residual(GRUCell(8, 8))"], (1, 8), r"layer 1.1 GRUCell\(8, 8\): a GRUCell layer cannot be inside a Residual"),
    (["Residual(MatMul(8, 8))"], (1, 8), "MatMul layer cannot be inside a Residual"),
    (["Flatten(0)"], (2, 8), "only start_dim=1, end_dim=-1"),
    (["Linear(16, 4)"], (1, 8), "expects 16 input features, but receives 8"),
    (["Linear(8, 4)", "Linear(8, 2)"], (1, 8), "layer 2"),
    ([], (1, 8), "no layers"),
    (["ReLU()"], (1, 2, 3), "ReLU\\(\\) takes BxF"),
    (["ReLU()"], (1, 2, 3, 4, 5), "must be \\(batch, features\\)"),
    (["Linear(0, 4)"], (1, 8), "positive integer"),
])
def test_build_model_rejects(texts, shape, message):
    with pytest.raises(LayerError, match=message):
        build_model([parse_layer(t) for t in texts], shape)
