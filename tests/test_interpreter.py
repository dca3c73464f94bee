"""The reference interpreter against direct numpy, constructor by constructor, and the type
functions against the values: `fout(f)` is the shape of `f` applied to a value of `fin(f)`."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egraph_rules.interpreter import Interpreter, random_value
from egraph_rules.ir import IRTypeError, T, Term, comp, fin, fout, ta, tensor_type, tp, ts, ty
from liftsat.targets import get_target

F32 = ts("f32")
SMALL = settings(max_examples=8, deadline=None)
dims = st.integers(1, 5)


def V(n: int) -> Term:
    return ta(F32, n)


def M(n: int, k: int) -> Term:
    return tensor_type("f32", (n, k))


def rng_for(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def run(f: Term, x, env=None, meanings=None):
    return Interpreter(env or {}, meanings).apply(f, x)


def matches_type(v, t: Term) -> bool:
    """Whether a value has the structure and shape of type t."""
    if t.op == "TS":
        return isinstance(v, (np.ndarray, np.generic)) and np.shape(v) == ()
    if t.op == "TP":
        return isinstance(v, tuple) and len(v) == 2 and matches_type(v[0], t.args[0]) and matches_type(v[1], t.args[1])
    elem, n = t.args
    if isinstance(v, np.ndarray):
        return v.ndim >= 1 and v.shape[0] == n and all(matches_type(x, elem) for x in v)
    return isinstance(v, list) and len(v) == n and all(matches_type(x, elem) for x in v)


# ---------------------------------------------------------------- values


def test_var_pair_and_app_values():
    x, y = np.arange(3, dtype=np.float32), np.ones(2, np.float32)
    interp = Interpreter({"x": x, "y": y})
    pair = interp.value(T("Pair", T("Var", "x", V(3)), T("Var", "y", V(2))))
    assert isinstance(pair, tuple) and pair[0] is x and pair[1] is y
    np.testing.assert_array_equal(interp.value(T("App", T("VVRelu", V(3)), T("Var", "x", V(3)))), x)


def test_missing_variable_is_an_error():
    with pytest.raises(IRTypeError, match="no value"):
        Interpreter({}).value(T("Var", "x", V(3)))


def test_unknown_device_op_is_an_error():
    with pytest.raises(IRTypeError, match="no meaning"):
        run(T("Dev", "nope", V(2), V(2)), np.ones(2, np.float32))


# ---------------------------------------------------------------- combinators


def test_combinators():
    x = np.array([-1.0, 2.0, -3.0], np.float32)
    relu, tanh = T("VVRelu", V(3)), T("VVTanh", V(3))
    np.testing.assert_array_equal(run(T("Id", V(3)), x), x)
    np.testing.assert_allclose(run(T("Comp", tanh, relu), x), np.tanh(np.maximum(x, 0)))
    a, b = run(T("Fork", relu, tanh), x)
    np.testing.assert_allclose(a, np.maximum(x, 0))
    np.testing.assert_allclose(b, np.tanh(x))
    assert run(T("Fst", tp(V(3), V(3))), (a, b)) is a
    assert run(T("Snd", tp(V(3), V(3))), (a, b)) is b
    w = np.full(4, 7.0, np.float32)
    np.testing.assert_array_equal(run(T("Const", T("Var", "w", V(4)), V(3)), x, {"w": w}), w)


def test_comp_applies_right_to_left():
    x = np.array([-2.0, 3.0], np.float32)
    f = comp(T("VVTanh", V(2)), T("VVRelu", V(2)), T("Pad", 1, 0, V(1)), T("Slice", 0, 1, V(2)))
    np.testing.assert_allclose(run(f, x), np.tanh(np.maximum(np.array([0.0, -2.0]), 0)))


def test_memory_moves_are_identities():
    x = rng_for().standard_normal(4).astype(np.float32)
    for f in (T("ToChip", "bw.mrf", V(4)), T("ToDram", V(4)), T("ToOutput", V(4))):
        np.testing.assert_array_equal(run(f, x), x)


# ---------------------------------------------------------------- Lift patterns


@SMALL
@given(n=dims, k=dims, seed=st.integers(0, 1000))
def test_patterns_against_numpy(n, k, seed):
    rng = rng_for(seed)
    x = rng.standard_normal(n * k).astype(np.float32)
    m = x.reshape(n, k)
    np.testing.assert_array_equal(run(T("Split", k, V(n * k)), x), m)
    np.testing.assert_array_equal(run(T("Join", M(n, k)), m), x)
    np.testing.assert_array_equal(run(T("Transpose", M(n, k)), m), m.T)
    np.testing.assert_allclose(run(T("Map", T("VVRelu", V(k)), n), m), np.maximum(m, 0))
    np.testing.assert_allclose(run(T("Reduce", T("VVAdd", tp(V(k), V(k))), M(n, k)), m), m.sum(axis=0), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_array_equal(run(T("Pad", 2, 1, V(n * k)), x), np.concatenate([[0, 0], x, [0]]))
    np.testing.assert_array_equal(run(T("Pad", 1, 2, M(n, k)), m), np.pad(m, ((1, 2), (0, 0))))
    fill = float(np.float32(rng.standard_normal()))  # exact in the float32 array
    np.testing.assert_array_equal(run(T("PadWith", 2, 1, fill, V(n * k)), x), np.concatenate([[fill, fill], x, [fill]]))
    np.testing.assert_array_equal(run(T("PadWith", 0, 1, -np.inf, M(n, k)), m),
                                  np.concatenate([m, np.full((1, k), -np.inf, np.float32)]))
    np.testing.assert_array_equal(run(T("Slice", 1, n * k, V(n * k + 2)), np.concatenate([[9], x, [9]])), x)


def test_pad_with_fills_only_the_padding():
    """PadWith pads with its fill (here -inf, max pooling's) and keeps the values, at the dimension
    its Map reaches: each row of an image padded on both sides, every channel vector filled."""
    img = np.arange(12, dtype=np.float32).reshape(2, 2, 3)  # [H][W][C]
    out = run(T("Map", T("PadWith", 1, 1, -np.inf, M(2, 3)), 2), img)
    assert out.shape == (2, 4, 3) and out.dtype == np.float32
    np.testing.assert_array_equal(out[:, 1:3], img)
    assert np.isneginf(out[:, [0, 3]]).all()
    with pytest.raises(IRTypeError, match="PadWith applies to arrays of scalars"):
        run(T("PadWith", 1, 0, 2.0, ta(tp(F32, F32), 2)), [(np.float32(1), np.float32(2))] * 2)


def test_fill_is_a_constant_of_its_type():
    """Fill v t: every element v, in t's shape and dtype; its type is t, and only tensors of
    scalars can be filled."""
    fill = T("Fill", -1.0, M(2, 3))
    out = Interpreter({}).value(fill)
    assert out.shape == (2, 3) and out.dtype == np.float32 and (out == -1).all()
    assert ty(fill) == M(2, 3)
    with pytest.raises(IRTypeError, match="not a tensor of scalars"):
        ty(T("Fill", 0.0, tp(V(2), V(2))))


def test_zip_and_distr():
    a, b = np.arange(3, dtype=np.float32), np.arange(3, 6, dtype=np.float32)
    zipped = run(T("Zip", tp(V(3), V(3))), (a, b))
    assert isinstance(zipped, list) and [tuple(map(float, p)) for p in zipped] == [(0, 3), (1, 4), (2, 5)]
    m, c = np.arange(6, dtype=np.float32).reshape(3, 2), np.ones(4, np.float32)
    dist = run(T("DistR", tp(M(3, 2), V(4))), (m, c))
    assert len(dist) == 3
    for i, (row, const) in enumerate(dist):
        np.testing.assert_array_equal(row, m[i])
        assert const is c


def test_map_over_pairs_gives_a_list_and_reduce_folds_left():
    a, b = np.arange(4, dtype=np.float32), np.arange(4, 8, dtype=np.float32)
    f = comp(T("Map", T("Fork", T("Snd", tp(F32, F32)), T("Fst", tp(F32, F32))), 4), T("Zip", tp(V(4), V(4))))
    swapped = run(f, (a, b))
    assert isinstance(swapped, list) and [(float(p), float(q)) for p, q in swapped] == list(zip(b, a))
    # the fold order shows with operators that keep one side: Snd keeps the last row, Fst the first
    last = run(T("Reduce", T("Snd", tp(V(2), V(2))), M(3, 2)), np.arange(6, dtype=np.float32).reshape(3, 2))
    np.testing.assert_array_equal(last, [4, 5])
    first = run(T("Reduce", T("Fst", tp(V(2), V(2))), M(3, 2)), np.arange(6, dtype=np.float32).reshape(3, 2))
    np.testing.assert_array_equal(first, [0, 1])


# ---------------------------------------------------------------- arithmetic and layers


@SMALL
@given(n=dims, k=dims, seed=st.integers(0, 1000))
def test_arithmetic_against_numpy(n, k, seed):
    rng = rng_for(seed)
    a, b = (rng.standard_normal(k).astype(np.float32) for _ in range(2))
    w = rng.standard_normal((n, k)).astype(np.float32)
    y = rng.standard_normal((k, 3)).astype(np.float32)
    np.testing.assert_allclose(run(T("VVAdd", tp(V(k), V(k))), (a, b)), a + b)
    np.testing.assert_allclose(run(T("VVMul", tp(V(k), V(k))), (a, b)), a * b)
    np.testing.assert_allclose(run(T("VVRelu", V(k)), a), np.maximum(a, 0))
    np.testing.assert_allclose(run(T("VVTanh", V(k)), a), np.tanh(a), rtol=1e-6)
    np.testing.assert_allclose(run(T("VVSigm", V(k)), a), 1 / (1 + np.exp(-a.astype(np.float64))), rtol=1e-5)
    np.testing.assert_allclose(run(T("MVMul", tp(M(n, k), V(k))), (w, a)), w.astype(np.float64) @ a, rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_allclose(run(T("MMMul", tp(M(n, k), M(k, 3))), (w, y)), w.astype(np.float64) @ y,
                               rtol=1e-4, atol=1e-5)
    bias = rng.standard_normal(n).astype(np.float32)
    env = {"W": w, "b": bias}
    wv, bv = T("Var", "W", M(n, k)), T("Var", "b", V(n))
    np.testing.assert_allclose(run(T("Linear", wv, bv, V(k)), a, env), w.astype(np.float64) @ a + bias,
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(run(T("LinearNB", wv, V(k)), a, env), w.astype(np.float64) @ a, rtol=1e-4, atol=1e-5)


def test_elementwise_keeps_float32():
    x = np.array([-1.0, 0.5], np.float32)
    for op in ("VVRelu", "VVTanh", "VVSigm"):
        assert run(T(op, V(2)), x).dtype == np.float32


def test_device_ops_run_their_meaning():
    target = get_target("brainwave", 4)
    meanings = {op.name: op.meaning for op in target.device_ops()}
    rng = rng_for(3)
    for op in target.device_ops():
        x = random_value(fin(op.meaning), rng)
        np.testing.assert_allclose(run(op.term, x, meanings=meanings), run(op.meaning, x), rtol=1e-6)


# ---------------------------------------------------------------- types agree with values


def _nested_functions(n: int, k: int, m: int) -> list[Term]:
    """Functions of every constructor, nested, all well typed."""
    v, mat = V(k), M(n, k)
    pm = tp(mat, mat)
    return [
        T("Split", k, V(n * k)),
        comp(T("Join", M(n, k)), T("Transpose", M(k, n))),
        comp(T("Transpose", M(k, n)), T("Split", n, V(n * k))),
        comp(T("Map", T("Split", 1, V(k)), n), T("Split", k, V(n * k))),
        comp(T("Map", T("VVAdd", tp(v, v)), n), T("Zip", pm)),
        T("Zip", pm),
        T("DistR", tp(mat, V(m))),
        comp(T("Map", T("Fst", tp(v, V(m))), n), T("DistR", tp(mat, V(m)))),
        comp(T("Map", comp(T("VVMul", tp(V(m), V(m))), T("Fork", T("Snd", tp(v, V(m))), T("Snd", tp(v, V(m))))), n),
             T("DistR", tp(mat, V(m)))),
        comp(T("Slice", 1, n, V(n + 2)), T("Pad", 2, 0, V(n))),
        T("Pad", 1, 3, mat),
        T("Map", T("Pad", 0, m, v), n),
        T("Map", T("PadWith", 1, m, -1.5, v), n),
        T("Map", T("Slice", k - 1, 1, v), n),
        T("Reduce", T("VVAdd", tp(v, v)), mat),
        T("Reduce", T("VVMul", tp(V(m), V(m))), M(n, m)),
        comp(T("Reduce", T("VVAdd", tp(V(n), V(n))), M(k, n)), T("Transpose", mat)),
        T("Fork", T("Id", mat), T("Transpose", mat)),
        comp(T("MVMul", tp(mat, v)), T("Fork", T("Id", mat), comp(T("VVRelu", v), T("Reduce", T("VVAdd", tp(v, v)), mat)))),
        comp(T("MMMul", tp(mat, M(k, m))), T("Fork", T("Id", mat), T("Const", T("Var", "Y", M(k, m)), mat))),
        T("Map", T("Map", T("Id", F32), k), n),
        comp(T("ToOutput", V(n * k)), T("Join", mat), T("ToChip", "bw.vrf", mat)),
    ]


@SMALL
@given(n=dims, k=dims, m=dims, seed=st.integers(0, 1000))
def test_fout_is_the_shape_of_the_value(n, k, m, seed):
    rng = rng_for(seed)
    env = {"Y": random_value(M(k, m), rng)}
    for f in _nested_functions(n, k, m):
        x = random_value(fin(f), rng)
        assert matches_type(x, fin(f)), f"random_value does not give a value of {fin(f)}"
        out = run(f, x, env)
        assert matches_type(out, fout(f)), f"{f} gives {out!r}, not a value of {fout(f)}"


@SMALL
@given(n=dims, k=dims, seed=st.integers(0, 1000))
def test_ty_of_application_matches_value(n, k, seed):
    rng = rng_for(seed)
    x = T("Var", "x", V(n * k))
    e = T("App", comp(T("Map", T("VVSigm", V(k)), n), T("Split", k, V(n * k))), x)
    val = Interpreter({"x": random_value(V(n * k), rng)}).value(e)
    assert ty(e) == M(n, k)
    assert matches_type(val, ty(e))


def test_matches_type_rejects_wrong_shapes():
    assert not matches_type(np.zeros(3, np.float32), V(4))
    assert not matches_type(np.zeros((2, 3), np.float32), M(3, 2))
    assert not matches_type([(np.zeros(2), np.zeros(2))], ta(tp(V(2), V(2)), 2))
    assert matches_type([(np.zeros(2), np.zeros(3))], ta(tp(V(2), V(3)), 1))


@pytest.mark.parametrize("dtype, np_dtype", [("f32", np.float32), ("f16", np.float16), ("i32", np.int32),
                                             ("i8", np.int32)])
def test_random_value_dtypes(dtype, np_dtype):
    v = random_value(tensor_type(dtype, (2, 3)), rng_for())
    assert v.shape == (2, 3) and v.dtype == np_dtype
    if dtype.startswith("i"):
        assert v.min() >= -8 and v.max() < 8
