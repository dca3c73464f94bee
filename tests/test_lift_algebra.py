"""The Lift algebra rules' guards and bounds: tiled rules fire only at the tile sizes passed in,
only for the operators and lengths their side conditions allow, and saturation of the whole
algebra reaches a fixpoint (their soundness is checked in test_rules_property.py)."""

from __future__ import annotations

from egraph_rules.algorithmic_rules import algorithmic_rules
from egraph_rules.ir import T, Term, comp, fin, ta, tensor_type, tp, ts
from egraph_rules.algorithmic_rules import common_algorithmic_rules
from egraph_rules.lift_algebra import layout_algebra_rules, tiled_algebra_rules
from egraph_rules.saturate import Budget, Saturator, SaturationStats
from frontend.spatial import to_hwc

N = 4
F32 = ts("f32")


def V(n: int) -> Term:
    return ta(F32, n)


def run(fn: Term, tiles: tuple[int, ...] = (N,)) -> SaturationStats:
    """Saturate fn applied to an input under the algorithmic rules for these tile sizes."""
    sat = Saturator(algorithmic_rules(tiles))
    sat.add("root", T("App", fn, T("Var", "x", fin(fn))))
    return sat.run(Budget(nodes=20_000, iterations=30))


def fired(stats: SaturationStats, name: str) -> bool:
    return stats.matches_per_rule.get(name, 0) > 0


def reduce_of(op: str, n: int, width: int = 2) -> Term:
    return T("Reduce", T(op, tp(V(width), V(width))), ta(V(width), n))


def test_reductions_split_only_associative_operators():
    assert fired(run(reduce_of("VVAdd", N * N)), f"partial-reduce-split/{N}")
    assert fired(run(reduce_of("VVMax", N * N)), f"reduce-reorder-stride/{N}")
    sub = run(reduce_of("VVSub", N * N))
    assert not fired(sub, f"partial-reduce-split/{N}") and not fired(sub, f"reduce-reorder-stride/{N}")


def test_reductions_split_only_by_a_tile_size_that_divides():
    odd = run(reduce_of("VVAdd", 3 * 5))
    assert not fired(odd, f"partial-reduce-split/{N}")
    one_tile = run(reduce_of("VVAdd", N))
    assert not fired(one_tile, f"partial-reduce-split/{N}") and not fired(one_tile, f"reduce-reorder-stride/{N}")
    assert "partial-reduce-split/3" not in run(reduce_of("VVAdd", 3 * 3 * 3)).matches_per_rule


def test_slide_tiling_needs_whole_tiles_of_windows():
    whole = T("Slide", 3, 2, V((2 * N - 1) * 2 + 3))     # 2N windows of 3, step 2
    assert fired(run(whole), f"slide-tiling/{N}")
    partial = T("Slide", 3, 2, V((2 * N) * 2 + 3))       # 2N + 1 windows
    assert not fired(run(partial), f"slide-tiling/{N}")


def test_reductions_split_one_level_only():
    """A reduction of up to N^2 elements splits into N-element partial reductions (consecutive
    and strided, interchanged into a vector reduction) and saturates; a longer one is left whole."""
    stats = run(reduce_of("VVAdd", N * N))
    assert stats.saturated, stats.stop_reason
    assert fired(stats, f"map-reduce-interchange/{N}")
    long = run(reduce_of("VVAdd", N ** 3))
    assert not fired(long, f"partial-reduce-split/{N}") and not fired(long, f"reduce-reorder-stride/{N}")


def test_layout_algebra_saturates_on_a_convolution_layout():
    """CHW -> HWC, flattened to pixels, transposed back to channel rows, rows tiled: the size-free
    layout rules (transposes through joins) reach a fixpoint, creating no new lengths."""
    c, h, w = 3, 2, N
    hwc = to_hwc(tensor_type("f32", (c, h, w)))
    pixels = T("Join", tensor_type("f32", (h, w, c)))
    fn = comp(T("Map", T("Split", N, V(h * w)), c), T("Transpose", tensor_type("f32", (h * w, c))), pixels, hwc)
    stats = run(fn)
    assert stats.saturated, stats.stop_reason
    assert fired(stats, "transpose-join")


def test_size_free_rules_are_shared_and_tiled_ones_come_per_size():
    """The common algorithmic rules depend on no tile size (they are instantiated once, whatever
    the targets); the tiled ones come per size."""
    shared = common_algorithmic_rules()
    assert {r.name for r in layout_algebra_rules()} <= {r.name for r in shared}
    assert not [r.name for r in shared if "/" in r.name]
    assert {r.name for r in tiled_algebra_rules((4, 8))} >= {f"slide-tiling/{n}" for n in (4, 8)}
    assert all(r.name.endswith(("/4", "/8")) for r in tiled_algebra_rules((4, 8)))


def equal_in_egraph(lhs: Term, rhs: Term) -> bool:
    """Saturate lhs (a value) under the algorithmic rules at tile size N; whether rhs, which must
    be in the e-graph, is in lhs's e-class."""
    sat = Saturator(algorithmic_rules((N,)))
    sat.add("root", lhs)
    stats = sat.run(Budget(nodes=20_000, iterations=30))
    assert stats.saturated, stats.stop_reason
    graph = sat.serialize({"lhs": lhs, "rhs": rhs}, stats)
    return graph.roots["lhs"] == graph.roots["rhs"]


def x_of(t: Term) -> Term:
    return T("Var", "x", t)


def ty_of(x: Term) -> Term:
    return x.args[1]


def test_transpose_transpose_in_front_of_a_stage_is_that_stage():
    x = x_of(tensor_type("f32", (2, 3)))
    relu = T("Map", T("VVRelu", V(3)), 2)
    twice = T("App", comp(T("Transpose", tensor_type("f32", (3, 2))), T("Transpose", ty_of(x)), relu), x)
    assert equal_in_egraph(twice, T("App", relu, x))


def test_transpose_transpose_leaves_a_bare_value_alone():
    """The guard: x = Transpose (Transpose x) would make the value's e-class cyclic."""
    x = x_of(tensor_type("f32", (2, 3)))
    twice = T("App", T("Transpose", tensor_type("f32", (3, 2))), T("App", T("Transpose", ty_of(x)), x))
    assert not equal_in_egraph(twice, x)


def test_split_transpose_moves_the_split_before_the_transpose():
    n, m = 3, 2 * N
    x = x_of(tensor_type("f32", (n, m)))
    lhs = T("App", comp(T("Split", N, tensor_type("f32", (m, n))), T("Transpose", ty_of(x))), x)
    rhs = T("App", comp(T("Map", T("Transpose", tensor_type("f32", (n, N))), m // N),
                        T("Transpose", tensor_type("f32", (n, m // N, N))),
                        T("Map", T("Split", N, V(m)), n)), x)
    assert equal_in_egraph(lhs, rhs)


def test_map_split_transpose_moves_the_split_before_the_transpose():
    n, m = 2 * N, 3
    x = x_of(tensor_type("f32", (n, m)))
    lhs = T("App", comp(T("Map", T("Split", N, V(n)), m), T("Transpose", ty_of(x))), x)
    rhs = T("App", comp(T("Transpose", tensor_type("f32", (n // N, m, N))),
                        T("Map", T("Transpose", tensor_type("f32", (N, m))), n // N),
                        T("Split", N, ty_of(x))), x)
    assert equal_in_egraph(lhs, rhs)


def test_join_map_swap_loops_over_the_rows_of_a_flattened_array():
    k, m = 2, 3
    x = x_of(tensor_type("f32", (m, k, 5)))
    lhs = T("App", comp(T("Map", T("VVRelu", V(5)), k * m), T("Join", ty_of(x))), x)
    rhs = T("App", comp(T("Join", ty_of(x)), T("Map", T("Map", T("VVRelu", V(5)), k), m)), x)
    assert equal_in_egraph(lhs, rhs)


def test_map_split_join_tiles_a_loop_stage_of_native_vectors():
    n = 2 * N
    x = x_of(tensor_type("f32", (n, N)))
    relu = T("Map", T("VVRelu", V(N)), n)
    lhs = T("App", comp(T("Map", T("VVTanh", V(N)), n), relu), x)
    rhs = T("App", comp(T("Join", tensor_type("f32", (n // N, N, N))), T("Map", T("Map", T("VVTanh", V(N)), N), n // N),
                        T("Split", N, ty_of(x)), relu), x)
    assert equal_in_egraph(lhs, rhs)


def test_map_split_join_leaves_loops_of_other_lengths_and_bodies_alone():
    """Not a stage of a composition, not a native vector per iteration, or more than N tiles."""
    for fn in (T("Map", T("VVRelu", V(N)), 2 * N),
               comp(T("Map", T("VVRelu", V(3)), 2 * N), T("Id", tensor_type("f32", (2 * N, 3)))),
               comp(T("Map", T("VVRelu", V(N)), N ** 3), T("Id", tensor_type("f32", (N ** 3, N))))):
        assert not fired(run(fn), f"map-split-join/{N}")
