"""IR terms and types: constructor validation, type functions and their errors, shape helpers."""

from __future__ import annotations

import pytest

from egraph_rules.ir import (SCHEMA, IRTypeError, T, Term, comp, egglog_declarations, fin, fout, nbytes, numel,
                             shape_of, ta, tensor_type, tp, ts, ty)

F32 = ts("f32")


def V(n: int) -> Term:
    return ta(F32, n)


def M(n: int, k: int) -> Term:
    return tensor_type("f32", (n, k))


@pytest.mark.parametrize("build, message", [
    (lambda: T("Nope", 1), "unknown IR constructor"),
    (lambda: T("Split", 2), "takes 2 arguments"),
    (lambda: T("Split", "2", V(4)), "not of sort i64"),
    (lambda: T("Split", True, V(4)), "not of sort i64"),
    (lambda: T("Map", V(3), 2), "not of sort F"),
    (lambda: T("App", T("Var", "x", V(2)), T("Var", "x", V(2))), "not of sort F"),
    (lambda: T("Var", 3, V(2)), "not of sort String"),
    (lambda: T("PadWith", 1, 1, 0, V(2)), "not of sort f64"),
    (lambda: T("PadWith", 1, 1, float("nan"), V(2)), "not of sort f64"),
    (lambda: ts("f64"), "unknown element type"),
    (lambda: ta(F32, 0), "must be positive"),
    (lambda: ta(F32, -3), "must be positive"),
    (lambda: comp(), "empty composition"),
])
def test_invalid_terms_are_rejected(build, message):
    with pytest.raises(IRTypeError, match=message):
        build()


def test_terms_are_immutable_values():
    a, b = T("Split", 2, V(4)), T("Split", 2, V(4))
    assert a == b and hash(a) == hash(b)
    with pytest.raises(AttributeError):
        a.op = "Join"  # type: ignore[misc]


def test_sexpr_escapes_strings():
    t = T("Var", 'a"b\\c', V(2))
    assert t.sexpr == '(Var "a\\"b\\\\c" (TA (TS "f32") 2))'
    assert repr(t) == t.sexpr


def test_walk_visits_every_subterm_first_to_last():
    t = T("Comp", T("VVRelu", V(2)), T("Id", V(2)))
    assert [s.op for s in t.walk()] == ["Comp", "VVRelu", "TA", "TS", "Id", "TA", "TS"]


def test_comp_is_right_nested_and_applies_last_first():
    f, g, h = T("VVRelu", V(2)), T("VVTanh", V(2)), T("VVSigm", V(2))
    assert comp(f) == f
    assert comp(f, g, h) == T("Comp", f, T("Comp", g, h))


def test_shape_helpers():
    t = tensor_type("f16", (3, 4, 5))
    assert shape_of(t) == (3, 4, 5)
    assert shape_of(ts("i8")) == ()
    assert numel(t) == 60 and nbytes(t) == 120
    assert numel(tp(V(3), ts("i8"))) == 4 and nbytes(tp(V(3), ts("i8"))) == 13
    with pytest.raises(IRTypeError):
        shape_of(tp(V(2), V(2)))


@pytest.mark.parametrize("f, expected_in, expected_out", [
    (T("Split", 3, V(12)), V(12), M(4, 3)),
    (T("Join", M(4, 3)), M(4, 3), V(12)),
    (T("Transpose", M(4, 3)), M(4, 3), M(3, 4)),
    (T("Zip", tp(V(3), M(3, 2))), tp(V(3), M(3, 2)), ta(tp(F32, V(2)), 3)),
    (T("DistR", tp(M(4, 2), V(5))), tp(M(4, 2), V(5)), ta(tp(V(2), V(5)), 4)),
    (T("Pad", 1, 2, V(3)), V(3), V(6)),
    (T("PadWith", 2, 0, -float("inf"), M(3, 2)), M(3, 2), M(5, 2)),
    (T("Slice", 1, 2, V(3)), V(3), V(2)),
    (T("Map", T("VVRelu", V(3)), 5), M(5, 3), M(5, 3)),
    (T("Reduce", T("VVAdd", tp(V(3), V(3))), M(5, 3)), M(5, 3), V(3)),
    (T("MVMul", tp(M(4, 3), V(3))), tp(M(4, 3), V(3)), V(4)),
    (T("MMMul", tp(M(4, 3), M(3, 2))), tp(M(4, 3), M(3, 2)), M(4, 2)),
    (T("Fork", T("Id", V(2)), T("VVTanh", V(2))), V(2), tp(V(2), V(2))),
    (T("Fst", tp(V(2), V(3))), tp(V(2), V(3)), V(2)),
    (T("Snd", tp(V(2), V(3))), tp(V(2), V(3)), V(3)),
    (T("Const", T("Var", "w", V(7)), V(2)), V(2), V(7)),
    (T("Linear", T("Var", "W", M(4, 3)), T("Var", "b", V(4)), V(3)), V(3), V(4)),
    (T("LinearNB", T("Var", "W", M(4, 3)), V(3)), V(3), V(4)),
    (T("ToChip", "bw.mrf", M(2, 2)), M(2, 2), M(2, 2)),
    (T("Dev", "bw.v_relu", V(4), V(4)), V(4), V(4)),
    (comp(T("Join", M(4, 3)), T("Split", 3, V(12))), V(12), V(12)),
])
def test_fin_and_fout(f, expected_in, expected_out):
    assert fin(f) == expected_in
    assert fout(f) == expected_out


@pytest.mark.parametrize("f, message", [
    (T("Split", 5, V(12)), "does not divide"),
    (T("Split", 0, V(12)), "does not divide"),
    (T("Join", V(12)), "expects an array"),
    (T("Transpose", V(3)), "expects an array"),
    (T("Zip", tp(V(3), V(4))), "Zip of lengths"),
    (T("Zip", V(3)), "expects a pair"),
    (T("Pad", -1, 0, V(3)), "negative"),
    (T("PadWith", 0, -2, 1.5, V(3)), "PadWith by negative"),
    (T("Slice", 2, 2, V(3)), "out of length"),
    (T("Slice", 0, 0, V(3)), "out of length"),
    (T("VVAdd", tp(V(3), V(4))), "VVAdd of"),
    (T("VVRelu", M(2, 2)), "vector of scalars"),
    (T("MVMul", tp(M(4, 3), V(4))), "MVMul of a 4x3 matrix"),
    (T("MMMul", tp(M(4, 3), M(2, 2))), "MMMul of 4x3 and 2x2"),
    (T("Reduce", T("VVAdd", tp(V(2), V(2))), M(5, 3)), "does not combine"),
    (T("Comp", T("VVRelu", V(3)), T("VVRelu", V(2))), "composition mismatch"),
    (T("Fork", T("VVRelu", V(3)), T("VVRelu", V(2))), "Fork branches"),
    (T("Linear", T("Var", "W", M(4, 3)), T("Var", "b", V(3)), V(3)), "bias"),
])
def test_fout_rejects_ill_typed_functions(f, message):
    with pytest.raises(IRTypeError, match=message):
        fout(f)


def test_ty_checks_applications():
    x = T("Var", "x", V(3))
    assert ty(T("App", T("VVRelu", V(3)), x)) == V(3)
    assert ty(T("Pair", x, T("Var", "y", V(2)))) == tp(V(3), V(2))
    with pytest.raises(IRTypeError, match="expects"):
        ty(T("App", T("VVRelu", V(4)), x))
    with pytest.raises(IRTypeError, match="not a value"):
        ty(T("Id", V(3)))


def test_egglog_declarations_cover_the_schema():
    text = egglog_declarations()
    for name, (_sort, args) in SCHEMA.items():
        assert f"({name} {' '.join(args)})" in text


@pytest.mark.parametrize("fill, text", [(-float("inf"), "-inf"), (1e20, "1e+20"), (-0.5, "-0.5"), (0.0, "0.0")])
def test_fill_values_print_as_egglog_floats(fill, text):
    """A PadWith's fill is an f64 in egglog: written as a float literal, never an integer."""
    assert T("PadWith", 1, 0, fill, V(2)).sexpr == f"(PadWith 1 0 {text} (TA (TS \"f32\") 2))"
