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
