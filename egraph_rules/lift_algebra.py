"""Lift's algebra of layouts, reductions and stencils in point-free form: transposes, split and
join through transposes and zips, partial and reordered reductions, interchanges, slide tiling.

Every rule keeps array lengths it finds or divides them by a tile size passed in (the selected
targets' native sizes), never by an arbitrary divisor, so the sizes saturation can create are
bounded. Lift rules with no counterpart here: Gather/Scatter (and ReorderWithStride as an index
function) do not exist in this IR, so the strided reorder is written with Split, Transpose and
Join; Reduce has no initial value and the IR no sequential reduce, so reduceMapFusion (to
ReduceSeq) and partialReduceToReduce have nothing to rewrite to; lengths are positive, so there
are no empty maps to remove.

Five rules grew the e-graph without bound as first written and are in only with a guard each
(measured on a 256-channel 3x3 convolution on a 16-wide target, 4,042 e-nodes without them).
Transpose . Transpose = Id is one-directional and subsuming, and only in front of another stage,
never on a bare value (applied to values too, with apply-compose it made x = T (T x) and, with
splitTranspose and mapSplitTranspose, took that convolution to 82,045 e-nodes; guarded, all four
saturate there at 5,718). splitTranspose and mapSplitTranspose split only by a tile size, into
more than one tile, and only matrices of scalars. joinSwap runs right to left only (Map f . Join
to Join . Map (Map f)), which creates no new lengths; left to right it re-created every loop of a
batched FC layer at the flattened length (8,816 to 187,832 e-nodes). The general splitJoin
(Map f = Join . Map (Map f) . Split N) tiles only a map that is a stage of a composition (a Map
class holding a composition hides the chains it starts from the chain rules: 7x the cycles of a
convolution on cpu), whose body yields one N-element vector, of 2 to N tiles; without the body
guard, with the two above, a DeepBench GEMM (2048x32x2048) passed 31,968 e-nodes and 9 GB in one
step. Its reverse, Map (Map f) . Split k = Split k . Map f, unguarded took the GEMM 1760x16x1760
on VTA and on the systolic array past the machine's 24 GB; it is in only after a Slice, where it
moves an activation into the loop of padded bands (map-through-slice).
"""

from __future__ import annotations

from collections.abc import Callable

from egraph_rules.ir import ASSOC_COMM_OPS, T, Term, tensor_type, tp
from egraph_rules.rule_examples import mat, pick, vec
from egraph_rules.rules import Rule, chain_rewrites, rewrite

A = "algorithmic"


def _arr(elem: Term, *dims: int) -> Term:
    """Nested arrays of elem, outermost length first."""
    for n in reversed(dims):
        elem = T("TA", elem, n)
    return elem


# ---------------------------------------------------------------- transposes and interchanges


def _transposes() -> list[Rule]:
    def ex_tt(rng):
        n, m = pick(rng, 1, 4), pick(rng, 1, 4)
        relu = T("Map", T("VVRelu", vec(m)), n)
        return T("Comp", T("Transpose", mat(m, n)), T("Comp", T("Transpose", mat(n, m)), relu))

    def ex_mm(rng):
        n, m, p = pick(rng, 1, 4), pick(rng, 1, 4), pick(rng, 1, 3)
        return T("Comp", T("Map", T("Map", T("Pad", 0, 1, vec(p)), n), m), T("Transpose", _arr(vec(p), n, m)))

    def ex_mm_back(rng):
        n, m, p = pick(rng, 1, 4), pick(rng, 1, 4), pick(rng, 1, 3)
        return T("Comp", T("Transpose", _arr(vec(p + 1), n, m)), T("Map", T("Map", T("Pad", 0, 1, vec(p)), m), n))

    def ex_tj(rng):
        n, k, m = pick(rng, 1, 3), pick(rng, 1, 3), pick(rng, 1, 3)
        return T("Comp", T("Transpose", mat(k * n, m)), T("Join", tensor_type("f32", (n, k, m))))

    mm = "(Map (Map f n) m)"
    return [
        Rule("transpose-transpose", A, (rewrite(
            "(Comp (Transpose (TA (TA e n) m)) (Comp (Transpose (TA (TA e m) n)) f))", "f", A, subsume=True),),
             "one direction, subsuming its left side (never introduced, never matched again); only in front of "
             "another stage f, never on a bare value (with apply-compose, x = Transpose (Transpose x) made "
             "values' e-classes cyclic and, with map-split-transpose, grew a 256-channel 3x3 convolution on a "
             "16-wide target to 82,045 e-nodes)",
             "Transpose . Transpose . f = f: a simplification to the canonical form", ex_tt),
        Rule("map-map-interchange", A,
             chain_rewrites([mm, "(Transpose (TA (TA a m) n))"], ["(Transpose (TA (TA b m) n))", "(Map (Map f m) n)"],
                            A, ["(= b (fout f))"])
             + chain_rewrites(["(Transpose (TA (TA b n) m))", mm], ["(Map (Map f m) n)", "(Transpose (TA (TA a n) m))"],
                              A, ["(= a (fin f))"]),
             "none (point-free: the inner map's function does not see the outer element)",
             "Map(Map f) . Transpose = Transpose . Map(Map f), both ways: Lift's mapMapInterchange (which loop is "
             "outside)", ex_mm, ex_mm_back),
        Rule("transpose-join", A, chain_rewrites(
            ["(Transpose (TA (TA e m) kn))", "(Join (TA (TA (TA e m) k) n))"],
            ["(Map (Join (TA (TA e k) n)) m)", "(Transpose (TA (TA (TA e k) m) n))", "(Map (Transpose (TA (TA e m) k)) n)"],
            A), "none",
             "Transpose . Join = Map Join . Transpose . Map Transpose: a transpose moves inside a flattening",
             ex_tj),
    ]


# ---------------------------------------------------------------- split, join, zip


def _zips() -> list[Rule]:
    def ex_sz(rng):
        k, q = pick(rng, 1, 3), pick(rng, 1, 3)
        a, b = vec(2), vec(3)
        return T("Comp", T("Split", k, T("TA", tp(a, b), k * q)), T("Zip", tp(T("TA", a, k * q), T("TA", b, k * q))))

    def ex_swap(rng):
        k, m, p = pick(rng, 1, 3), pick(rng, 1, 3), pick(rng, 1, 3)
        return T("Comp", T("Map", T("Pad", 0, 1, vec(p)), k * m), T("Join", _arr(vec(p), m, k)))

    def ex_jz(rng):
        k, m = pick(rng, 1, 3), pick(rng, 1, 3)
        a, b = vec(2), vec(3)
        p = tp(_arr(a, m, k), _arr(b, m, k))
        joined = T("Fork", T("Comp", T("Join", _arr(a, m, k)), T("Fst", p)), T("Comp", T("Join", _arr(b, m, k)), T("Snd", p)))
        return T("Comp", T("Zip", tp(T("TA", a, k * m), T("TA", b, k * m))), joined)

    def ex_split_slice(rng):
        k, m, p = pick(rng, 1, 3), pick(rng, 1, 3), pick(rng, 1, 3)
        rows = k * m + pick(rng, 0, 3)
        return T("Comp", T("Map", T("Map", T("Pad", 0, 1, vec(p)), k), m),
                 T("Comp", T("Split", k, _arr(vec(p), k * m)), T("Slice", 0, k * m, _arr(vec(p), rows))))

    def ex_slice(rng):
        m, p = pick(rng, 1, 5), pick(rng, 1, 3)
        n = pick(rng, 1, m)
        return T("Comp", T("Map", T("Pad", 0, 1, vec(p)), n), T("Slice", 0, n, _arr(vec(p), m)))

    pab = "(TP (TA a n) (TA b n))"
    pjoin = "(TP (TA (TA a k) m) (TA (TA b k) m))"
    return [
        Rule("split-into-zip", A, chain_rewrites(
            ["(Split k (TA (TP a b) n))", f"(Zip {pab})"],
            ["(Map (Zip (TP (TA a k) (TA b k))) (/ n k))", "(Zip (TP (TA (TA a k) (/ n k)) (TA (TA b k) (/ n k))))",
             f"(Fork (Comp (Split k (TA a n)) (Fst {pab})) (Comp (Split k (TA b n)) (Snd {pab})))"], A),
             "k divides the length (the Split's own condition)",
             "Split k . Zip = Map Zip . Zip . (Split k x Split k): Lift's splitIntoZip", ex_sz),
        Rule("join-through-zip", A, chain_rewrites(
            ["(Zip zt)", "(Fork (Comp (Join (TA (TA a k) m)) f) (Comp (Join (TA (TA b k2) m2)) g))"],
            ["(Join (TA (TA (TP a b) k) m))", "(Map (Zip (TP (TA a k) (TA b k))) m)", f"(Zip {pjoin})", "(Fork f g)"], A,
            # lengths compared after matching: shared type variables across the branches make
            # egglog's join slow (seconds on a convolution's e-graph)
            ["(= k k2)", "(= m m2)"]),
             "both operands are joined from rows of the same length",
             "Zip . (Join x Join) = Join . Map Zip . Zip: Lift's joinFromZip", ex_jz),
        Rule("join-map-swap", A, chain_rewrites(
            ["(Map f km)", "(Join (TA (TA a k) m))"], ["(Join (TA (TA b k) m))", "(Map (Map f k) m)"], A,
            ["(= km (* k m))", "(= b (fout f))"]),
             "one direction only: a loop over a flattened array becomes loops over its rows (no new lengths)",
             "Map f . Join = Join . Map (Map f): Lift's joinSwap, from right to left", ex_swap),
        Rule("map-through-slice", A, chain_rewrites(
            ["(Map f n)", "(Slice 0 n (TA e m))"], ["(Slice 0 n (TA b m))", "(Map f m)"], A, ["(= b (fout f))"])
            + chain_rewrites(
            ["(Map (Map f k) m)", "(Split k (TA e n))", "(Slice 0 n (TA e p))"],
            ["(Split k (TA b n))", "(Slice 0 n (TA b p))", "(Map f p)"], A, ["(= b (fout f))"]),
             "one direction only: a loop over the kept rows (or over rows of them) becomes a loop over all of "
             "them (no new lengths)",
             "Map f . Slice(0, n) = Slice(0, n) . Map f, and Map (Map f) . Split k . Slice(0, n) = Split k . "
             "Slice(0, n) . Map f: f on the dropped rows too (a loop over padded bands then fuses with the loop "
             "that makes them)", ex_slice, ex_split_slice),
    ]


# ---------------------------------------------------------------- tiled by a native size


def _tiled(tile: int) -> list[Rule]:
    N = tile

    def ex_interchange(rng):
        p, n = pick(rng, 1, 3), pick(rng, 1, 4)
        return T("Map", T("Reduce", T("VVSub", tp(vec(p), vec(p))), T("TA", vec(p), n)), N)

    def ex_reduce(rng):
        p = pick(rng, 1, 3)
        op = ASSOC_COMM_OPS[pick(rng, 0, len(ASSOC_COMM_OPS) - 1)]
        return T("Reduce", T(op, tp(vec(p), vec(p))), T("TA", vec(p), N * pick(rng, 2, 3)))

    def ex_slide(rng):
        k, s = pick(rng, 1, 3), pick(rng, 1, 2)
        windows = N * pick(rng, 2, 3)
        return T("Slide", k, s, vec((windows - 1) * s + k + pick(rng, 0, s - 1)))

    def ex_split_transpose(rng):
        n, q = pick(rng, 1, 3), pick(rng, 2, 3)
        return T("Comp", T("Split", N, mat(N * q, n)), T("Transpose", mat(n, N * q)))

    def ex_map_split_transpose(rng):
        m, q = pick(rng, 1, 3), pick(rng, 2, 3)
        return T("Comp", T("Map", T("Split", N, vec(N * q)), m), T("Transpose", mat(N * q, m)))

    def ex_split_join(rng):
        n = N * pick(rng, 2, N)
        return T("Comp", T("Map", T("VVTanh", vec(N)), n), T("Map", T("VVRelu", vec(N)), n))

    def red(op: str, length: str | int) -> str:
        return f"(Reduce ({op} (TP t t)) (TA t {length}))"

    def reduction(name: str, rhs: Callable[[str], str], needs: str, doc: str) -> Rule:
        """One rewrite per associative and commutative operator, for lengths of several tiles."""
        text = tuple(rewrite(red(op, "n"), rhs(op), A, [f"(= 0 (% n {N}))", f"(> n {N})", f"(<= n {N * N})"])
                     for op in ASSOC_COMM_OPS)
        return Rule(f"{name}/{N}", A, text, f"operator {needs} ({', '.join(ASSOC_COMM_OPS)}); length divisible by "
                    f"the tile size {N}, longer than it and at most {N}^2 (one level of partial reductions: "
                    f"recursive splits with the interchange grew a GEMM's e-graph six-fold)", doc, ex_reduce)

    def across_transpose(name: str, lhs: list[str], rhs: list[str], length: str, what: str, doc: str,
                         example: Callable) -> Rule:
        """A split by the tile size moved across a transpose of a matrix of scalars, when it makes
        more than one tile (Lift's splitTranspose and mapSplitTranspose)."""
        return Rule(f"{name}/{N}", A, chain_rewrites(lhs, rhs, A, [f"(> {length} {N})", "(= e (TS d))"]),
                    f"a matrix of scalars; {what} by the tile size {N} into more than one tile", doc, example)

    count = "(+ 1 (/ (- n k) s))"
    span = f"(+ (* {N} s) (- k s))"
    tiles = f"(Comp (Join (TA (TA b {N}) (/ n {N}))) (Comp (Map (Map f {N}) (/ n {N})) {{}}))"
    split = f"(Split {N} (TA a n))"
    map_when = [f"(= 0 (% n {N}))", f"(> n {N})", f"(<= n {N * N})", f"(= b (TA (TS d) {N}))", "(= b (fout f))",
                "(= a (fin f))"]
    return [
        across_transpose("split-transpose", [f"(Split {N} (TA (TA e n) m))", "(Transpose (TA (TA e m) n))"],
                         [f"(Map (Transpose (TA (TA e {N}) n)) (/ m {N}))",
                          f"(Transpose (TA (TA (TA e {N}) (/ m {N})) n))", f"(Map (Split {N} (TA e m)) n)"],
                         "m", "the transposed rows split",
                         f"Split {N} . Transpose = Map Transpose . Transpose . Map (Split {N}): Lift's splitTranspose",
                         ex_split_transpose),
        across_transpose("map-split-transpose", [f"(Map (Split {N} (TA e n)) m)", "(Transpose (TA (TA e m) n))"],
                         [f"(Transpose (TA (TA (TA e {N}) m) (/ n {N})))",
                          f"(Map (Transpose (TA (TA e m) {N})) (/ n {N}))", f"(Split {N} (TA (TA e m) n))"],
                         "n", "its rows split",
                         f"Map (Split {N}) . Transpose = Transpose . Map Transpose . Split {N}: Lift's "
                         f"mapSplitTranspose", ex_map_split_transpose),
        Rule(f"map-split-join/{N}", A, (
            rewrite("(Comp (Map f n) rest__)", tiles.format(f"(Comp {split} rest__)"), A, map_when),
            rewrite("(Comp g (Map f n))", f"(Comp g {tiles.format(split)})", A, map_when)),
             f"the map's length a multiple of the tile size {N}, from 2 to {N} tiles (one level); each iteration "
             f"yields one {N}-element vector; only a map that is a stage of a composition (a map's own e-class "
             f"holding a composition would hide the chains it starts from the chain rules)",
             f"Map f = Join . Map (Map f) . Split {N}: Lift's splitJoin, tiles of a native size", ex_split_join),
        reduction("partial-reduce-split",
                  lambda op: f"(Comp {red(op, f'(/ n {N})')} (Comp (Map {red(op, N)} (/ n {N})) (Split {N} (TA t n))))",
                  "associative", f"Reduce f = Reduce f . Map (Reduce f) . Split {N}: partial reductions of {N} "
                  f"consecutive elements, then their results (Lift's partialReduce and partialReduceSplitJoin)"),
        reduction("reduce-reorder-stride",
                  lambda op: f"(Comp {red(op, N)} (Comp (Map {red(op, f'(/ n {N})')} {N}) "
                             f"(Comp (Transpose (TA (TA t {N}) (/ n {N}))) (Split {N} (TA t n)))))",
                  "associative and commutative", f"Reduce f = Reduce f . Map (Reduce f) . Transpose . Split {N}: "
                  f"{N} partial reductions of the elements {N} apart (Lift's partialReduceReorder with "
                  f"ReorderWithStride {N})"),
        Rule(f"map-reduce-interchange/{N}", A, (rewrite(
            f"(Map (Reduce f (TA e n)) {N})",
            f"(Comp (Reduce (Comp (Map f {N}) (Zip (TP (TA e {N}) (TA e {N})))) (TA (TA e {N}) n)) "
            f"(Transpose (TA (TA e n) {N})))", A),),
             f"the map has the tile size {N} (any operator: each column is reduced in the same order)",
             f"Map (Reduce f) = Reduce (Map f . Zip) . Transpose: {N} reductions become one reduction of "
             f"{N}-element rows, a native-width vector operation (Lift's mapReduceInterchange; after "
             f"reduce-reorder-stride, the vectorized reduction)", ex_interchange),
        Rule(f"slide-tiling/{N}", A, (rewrite(
            "(Slide k s (TA e n))",
            f"(Comp (Join (TA (TA (TA e k) {N}) (/ {count} {N}))) (Comp (Map (Slide k s (TA e {span})) (/ {count} {N})) "
            f"(Slide {span} (* {N} s) (TA e n))))",
            A, [f"(= 0 (% {count} {N}))", f"(> {count} {N})"]),),
             f"the window count divisible by the tile size {N}, larger than it; tiles advance u = {N} x step "
             f"(so u >= step and the step divides u)",
             f"Slide n s = Join . Map (Slide n s) . Slide (u+n-s) u with u = {N} s: tiles of {N} windows each "
             f"(Lift's slideTiling)", ex_slide),
    ]


def layout_algebra_rules() -> list[Rule]:
    """The size-free layout algebra: transposes and Split/Join through Zip (the same for every
    target)."""
    return _transposes() + _zips()


def tiled_algebra_rules(tile_sizes: tuple[int, ...]) -> list[Rule]:
    """For each tile size, the tiled partial and reordered reductions, map-reduce interchange
    and slide tiling."""
    return [r for n in sorted(set(tile_sizes)) for r in _tiled(n)]
