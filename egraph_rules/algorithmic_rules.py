"""Algorithmic rules: Lift's rewrites in point-free form, each guarded by its shape condition.

Tile sizes are not every divisor: they are the native sizes of the selected targets, passed in,
so saturation stays bounded (splitting never recurses below a native size).
"""

from __future__ import annotations

from egraph_rules.ir import ELEMENTWISE_BINARY_OPS, ELEMENTWISE_UNARY_OPS, REDUCTION_IDENTITY, T, Term, comp, fout, tp
from egraph_rules.lift_algebra import layout_algebra_rules, tiled_algebra_rules
from egraph_rules.rule_examples import mat, pick, var, vec
from egraph_rules.rules import Rule, chain, chain_rewrites, rewrite, tail_chain, tail_walk

#: how many stages a loop body may run after a move for the move to be hoisted out of the loop
HOIST_DEPTH = 3


# ---------------------------------------------------------------- structural identities


def _structural() -> list[Rule]:
    def ex_assoc(rng):
        n = pick(rng, 1, 6)
        return T("Comp", T("Comp", T("VVRelu", vec(n)), T("VVTanh", vec(n))), T("VVSigm", vec(n)))

    def ex_assoc_move(rng):
        n = pick(rng, 1, 6)
        return T("Comp", T("Comp", T("VVRelu", vec(n)), T("ToChip", "mem", vec(n))), T("VVSigm", vec(n)))

    def ex_assoc_view(rng):
        n, m = pick(rng, 1, 3), pick(rng, 1, 3)
        blocks = T("Comp", T("Map", T("Join", mat(m, n)), 2), T("Transpose", T("TA", mat(2, n), m)))
        return T("Comp", blocks, T("Map", T("Map", T("VVRelu", vec(n)), 2), m))

    def ex_assoc_moved_twice(rng):
        n = pick(rng, 1, 6)
        second = vec(n + pick(rng, 0, 1))
        pair = tp(vec(n), second)
        move = T("Fork", T("Comp", T("ToChip", "mem", vec(n)), T("Fst", pair)), T("Snd", pair))
        reader = T("Comp", T("VVRelu", second), T("Snd", pair))
        return T("Comp", T("Comp", reader, move), move)

    def ex_fork_dist(rng):
        n = pick(rng, 1, 6)
        return T("Comp", T("Fork", T("VVRelu", vec(n)), T("VVTanh", vec(n))), T("VVSigm", vec(n)))

    def ex_fst(rng):
        n = pick(rng, 1, 6)
        return T("Comp", T("Fst", tp(vec(n), vec(n))), T("Fork", T("VVRelu", vec(n)), T("Id", vec(n))))

    def ex_snd(rng):
        n = pick(rng, 1, 6)
        return T("Comp", T("Snd", tp(vec(n), vec(n))), T("Fork", T("VVRelu", vec(n)), T("VVTanh", vec(n))))

    def ex_id_left(rng):
        n = pick(rng, 1, 6)
        return T("Comp", T("Id", vec(n)), T("VVRelu", vec(n)))

    def ex_id_right(rng):
        n = pick(rng, 1, 6)
        return T("Comp", T("VVRelu", vec(n)), T("Id", vec(n)))

    def ex_fork_id(rng):
        n = pick(rng, 1, 6)
        return T("Fork", T("Fst", tp(vec(n), vec(n + 1))), T("Snd", tp(vec(n), vec(n + 1))))

    def ex_map_id(rng):
        return T("Map", T("Id", vec(pick(rng, 1, 4))), pick(rng, 1, 4))

    def ex_split_join(rng):
        k, m = pick(rng, 1, 4), pick(rng, 1, 4)
        return T("Comp", T("Split", k, vec(k * m)), T("Join", mat(m, k)))

    def ex_join_split(rng):
        k, m = pick(rng, 1, 4), pick(rng, 1, 4)
        return T("Comp", T("Join", mat(m, k)), T("Split", k, vec(k * m)))

    def ex_app_comp(rng):
        n = pick(rng, 1, 5)
        return T("App", T("VVRelu", vec(n)), T("App", T("VVTanh", vec(n)), var("x", vec(n))))

    def ex_app_id(rng):
        return T("App", T("Id", vec(3)), var("x", vec(3)))

    def ex_map_fusion(rng):
        n, m = pick(rng, 1, 4), pick(rng, 1, 4)
        return T("Comp", T("Map", T("VVRelu", vec(n)), m), T("Map", T("VVTanh", vec(n)), m))

    def ex_fold(rng):
        n, k = pick(rng, 1, 4), pick(rng, 1, 3)
        return T("Comp", T("Split", k, vec(n * k)), T("Const", var("W", vec(n * k)), vec(2)))

    def ex_fold_pad(rng):
        n = pick(rng, 1, 5)
        return T("Comp", T("Pad", 0, pick(rng, 1, 3), vec(n)), T("Const", var("W", vec(n)), vec(2)))

    def ex_fold_map_pad(rng):
        n, k = pick(rng, 1, 4), pick(rng, 1, 4)
        return T("Comp", T("Map", T("Pad", 0, pick(rng, 1, 3), vec(k)), n), T("Const", var("W", mat(n, k)), vec(2)))

    def ex_fold_chip(rng):
        n = pick(rng, 1, 5)
        return T("Comp", T("ToChip", "mem", vec(n)), T("Const", var("W", vec(n)), vec(2)))

    def ex_const_after(rng):
        k, m = pick(rng, 1, 3), pick(rng, 1, 3)
        return T("Comp", T("Const", var("W", vec(m)), vec(k * m)), T("Join", mat(m, k)))

    def ex_sub_same(rng):
        n = pick(rng, 1, 5)
        return T("VVSub", tp(vec(n), vec(n)))

    p = "(TP t t)"
    negated = f"(Comp (VVMul {p}) (Fork (Snd {p}) (Const (Fill -1.0 t) {p})))"
    a = "algorithmic"
    return [
        Rule("sub-as-negated-add", a, (rewrite(f"(VVSub {p})", f"(Comp (VVAdd {p}) (Fork (Fst {p}) {negated}))", a),),
             "none", "a - b = a + b * (-1 everywhere): targets without a subtraction (snowflake, systolic, VTA) "
             "run a GRU's h - n as an add and a multiply by a pinned constant", ex_sub_same),
        # subsuming hides (f . g) . h from every later match: a move the class of f . g gains
        # later (one hoisted out of a loop) is re-associated next to h through the `leftcomp`
        # record, where tochip-elide sees what it moves; and (f . m) . m, a move m hoisted out of
        # a loop and fused back in once more, is f . m even where both compositions are hidden
        # (without it, brainwave's Linear(1024, 1024) at batch 16 gained a move of its weights on
        # the input row's branch every third step and never saturated)
        Rule("compose-assoc", a, (
            f"(rule ((= p (Comp fg h)) (= fg (Comp f g))) ((leftcomp fg h p) (union p (Comp f (Comp g h))) "
            f"(subsume (Comp fg h))) :ruleset {a})",
            f"(rule ((leftcomp fg h p) (= fg (Comp f (ToChip sp t)))) ((union p (Comp f (Comp (ToChip sp t) h)))) "
            f":ruleset {a})",
            f"(rule ((leftcomp fg h p) (= fg (Comp (Map (Join t) n) g))) ((union p (Comp (Map (Join t) n) (Comp g h)))) "
            f":ruleset {a})",
            f"(rule ((leftcomp fg m p) (leftcomp f m fg) (ismove m)) ((union p fg)) :ruleset {a})"),
             "none",
             "(f . g) . h = f . (g . h); keeps compositions right-nested so chain rules see them (also for a move "
             "f . ToChip, or a Map of Join v . g, found in the class of f . g after (f . g) . h was re-associated: "
             "the rows a tiling rule joins from blocks of results, which a store then passes into the loop over "
             "blocks; and (f . m) . m = f . m for m a stage that moves one part of a pair on chip: moving twice is "
             "moving once)",
             ex_assoc, ex_assoc_move, ex_assoc_view, ex_assoc_moved_twice),
        Rule("fork-distribute", a, (rewrite("(Comp (Fork f g) h)", "(Fork (Comp f h) (Comp g h))", a),), "none",
             "Fork(f, g) . h = Fork(f . h, g . h)", ex_fork_dist),
        Rule("fst-of-fork", a, (rewrite("(Comp (Fst t) (Fork f g))", "f", a, subsume=True),), "none",
             "Fst . Fork(f, g) = f", ex_fst),
        Rule("snd-of-fork", a, (rewrite("(Comp (Snd t) (Fork f g))", "g", a, subsume=True),), "none",
             "Snd . Fork(f, g) = g", ex_snd),
        Rule("id-left", a, (rewrite("(Comp (Id t) f)", "f", a, subsume=True),), "none", "Id . f = f", ex_id_left),
        Rule("id-right", a, (rewrite("(Comp f (Id t))", "f", a, subsume=True),), "none", "f . Id = f", ex_id_right),
        Rule("fork-fst-snd", a, (rewrite("(Fork (Fst t) (Snd t))", "(Id t)", a),), "none",
             "Fork(Fst, Snd) = Id", ex_fork_id),
        Rule("map-id", a, (rewrite("(Map (Id t) n)", "(Id (TA t n))", a),), "none", "Map(Id) = Id", ex_map_id),
        Rule("apply-compose", a, (rewrite("(App f (App g x))", "(App (Comp f g) x)", a),), "none",
             "f (g x) = (f . g) x: values see the identities proven for functions", ex_app_comp),
        Rule("apply-id", a, (rewrite("(App (Id t) x)", "x", a, subsume=True),), "none", "Id x = x", ex_app_id),
        Rule("split-join", a, chain_rewrites(["(Split k (TA e km))", "(Join (TA (TA e k) m))"], ["(Id (TA (TA e k) m))"], a),
             "none", "Split k . Join = Id on arrays of k-element rows", ex_split_join),
        Rule("join-split", a, chain_rewrites(["(Join (TA (TA e k) m))", "(Split k t)"], ["(Id t)"], a),
             "none", "Join . Split k = Id", ex_join_split),
        # the two loops have the same length by typing (m = n); naming it once made egglog join
        # every pair of maps of equal length, the costliest search of all on GEMMs
        Rule("map-fusion", a, chain_rewrites(["(Map f n)", "(Map g m)"], ["(Map (Comp f g) n)"], a),
             "none", "Map f . Map g = Map (f . g): one loop instead of two", ex_map_fusion),
        Rule("fold-view-into-const", a, (rewrite("(Comp f (Const c t))", "(Const (App f c) t)", a, ["(isview f)"]),),
             "f only re-indexes", "view . Const c = Const (view c): re-indexing a constant is a constant", ex_fold),
        Rule("fold-pad-into-const", a,
             (rewrite("(Comp (Pad l r u) (Const c t))", "(Const (App (Pad l r u) c) t)", a),
              rewrite("(Comp (Map (Pad l r u) n) (Const c t))", "(Const (App (Map (Pad l r u) n) c) t)", a)),
             "none", "padding a constant is a (padded) constant, laid out by the host", ex_fold_pad, ex_fold_map_pad),
        Rule("fold-tochip-into-const", a,
             (rewrite("(Comp (ToChip sp u) (Const c t))", "(Const (App (ToChip sp u) c) t)", a),),
             "none", "a constant moved on chip once is a chip-resident (pinned) constant", ex_fold_chip),
        Rule("const-ignores-input", a, (rewrite("(Comp (Const c t) v)", "(Const c u)", a, ["(isview v)", "(= u (fin v))"]),),
             "v only re-indexes", "Const c . v = Const c: a constant ignores its input, so a re-indexing of it is dead",
             ex_const_after),
    ]


# ---------------------------------------------------------------- tiling and padding


def _stationary_tiles(N: int, pad_k: bool, pad_o: bool, bias: bool = False) -> list[str]:
    """The stages of the right-hand side of mmmul-weight-stationary-tiles: (A [n][k], B [k][o]) ->
    [n][o] as a Map over the o/N blocks j of output columns of (the sum over the k/N column tiles t
    of (a Map over the rows a of A of MVMul(tile (j, t), slice t of a))); k padded to whole tiles
    when `pad_k`; when `pad_o`, o too (B's zero columns give zero results, sliced off each row).
    With `bias`, of the GEMM and a constant row b added to every result row (`u` its type): each
    block's rows get b's block j added in the loop over blocks (padded with zeros when `pad_o`)."""
    def arr(e: str, n: str) -> str:
        return f"(TA {e} {n})"

    pad = f"(% (- {N} (% k {N})) {N})"
    kp = f"(+ k {pad})" if pad_k else "k"
    pad_out = f"(% (- {N} (% o {N})) {N})"
    op = f"(+ o {pad_out})" if pad_o else "o"
    kt, blocks = f"(/ {kp} {N})", f"(/ {op} {N})"
    v = arr("s", str(N))
    tile, rows = arr(v, str(N)), arr(v, "n")
    p = f"(TP {arr(arr('s', 'k'), 'n')} {arr(arr('s', 'o'), 'k')})"
    # A as [kt][n][N] (slice t of every row), B as tiles [op/N][kt][N][N] (tile (j, t): B^T's rows
    # jN.. and columns tN..)
    xs = [f"(Transpose {arr(arr(v, kt), 'n')})", f"(Map (Split {N} {arr('s', kp)}) n)"]
    ws = [f"(Map (Transpose {arr(arr(v, kt), str(N))}) {blocks})", f"(Map (Map (Split {N} {arr('s', kp)}) {N}) {blocks})",
          f"(Split {N} {arr(arr('s', kp), op)})"]
    if pad_k:
        xs.append(f"(Map (Pad 0 {pad} {arr('s', 'k')}) n)")
    if pad_o:  # B^T's rows padded, as a per-row program pads a weight's rows (mvmul-pad-rows)
        ws += [f"(Map (Pad 0 {pad} {arr('s', 'k')}) {op})"] * pad_k + [
            f"(Pad 0 {pad_out} {arr(arr('s', 'k'), 'o')})", f"(Transpose {arr(arr('s', 'o'), 'k')})"]
    else:
        ws += [f"(Transpose {arr(arr('s', 'o'), kp)})"] + [f"(Pad 0 {pad} {arr(arr('s', 'o'), 'k')})"] * pad_k
    row_in, tile_in = f"(TP {v} {tile})", f"(TP {tile} {rows})"
    mv = chain([f"(MVMul (TP {tile} {v}))", f"(Fork (Snd {row_in}) (Fst {row_in}))"], None)
    per_tile = chain([f"(Map {mv} n)", f"(DistR (TP {rows} {tile}))", f"(Fork (Snd {tile_in}) (Fst {tile_in}))"], None)
    tiles_j, xs_t = arr(tile, kt), arr(rows, kt)
    add_rows = chain([f"(Map (VVAdd (TP {v} {v})) n)", f"(Zip (TP {rows} {rows}))"], None)
    per_block = chain([f"(Reduce {add_rows} {xs_t})", f"(Map {per_tile} {kt})", f"(Zip (TP {tiles_j} {xs_t}))"], None)
    sliced = [f"(Map (Slice 0 o {arr('s', op)}) n)"] if pad_o else []
    weights = chain(ws, f"(Snd {p})")
    block_t = tiles_j  # what each block pairs with A's slices: its tiles (and, with bias, its block of b)
    if bias:  # each block's element: ((its tiles, its block of b), A's slices)
        b_padded = f"(App (Pad 0 {pad_out} u) b)" if pad_o else "b"
        b_blocks = f"(Const (App (Split {N} {arr('s', op)}) {b_padded}) {p})"
        with_b = f"(TP {tiles_j} {v})"
        elem = f"(TP {with_b} {xs_t})"
        per_block = chain([f"(Map (VVAdd (TP {v} {v})) n)", f"(DistR (TP {rows} {v}))",
                           f"(Fork (Comp {per_block} (Fork (Comp (Fst {with_b}) (Fst {elem})) (Snd {elem}))) "
                           f"(Comp (Snd {with_b}) (Fst {elem})))"], None)
        weights = chain([f"(Zip (TP {arr(tiles_j, blocks)} {arr(v, blocks)}))", f"(Fork {weights} {b_blocks})"], None)
        block_t = with_b
    return [*sliced, f"(Map (Join {arr(v, blocks)}) n)", f"(Transpose {arr(rows, blocks)})",
            f"(Map {per_block} {blocks})", f"(DistR (TP {arr(block_t, blocks)} {xs_t}))",
            f"(Fork {weights} {chain(xs, f'(Fst {p})')})"]


def _tiling(n_: int, resident: int, pinnable: int) -> list[Rule]:
    a = "algorithmic"
    N = n_

    def _mv(n, k):
        return T("MVMul", tp(mat(n, k), vec(k)))

    def ex_rows(rng):
        return _mv(N * pick(rng, 2, 3), pick(rng, 1, 5))

    def ex_cols(rng):
        return _mv(pick(rng, 1, 5), N * pick(rng, 2, 3))

    def ex_pad_rows(rng):
        return _mv(N * pick(rng, 0, 2) + pick(rng, 1, N - 1), pick(rng, 1, 5))

    def ex_pad_cols(rng):
        return _mv(pick(rng, 1, 5), N * pick(rng, 0, 2) + pick(rng, 1, N - 1))

    def ex_unary(rng):
        return T(ELEMENTWISE_UNARY_OPS[pick(rng, 0, len(ELEMENTWISE_UNARY_OPS) - 1)], vec(N * pick(rng, 2, 4)))

    def ex_binary(rng):
        n = N * pick(rng, 2, 4)
        return T(ELEMENTWISE_BINARY_OPS[pick(rng, 0, len(ELEMENTWISE_BINARY_OPS) - 1)], tp(vec(n), vec(n)))

    def ex_unary_pad(rng):
        return T(ELEMENTWISE_UNARY_OPS[pick(rng, 0, len(ELEMENTWISE_UNARY_OPS) - 1)], vec(N * pick(rng, 0, 2) + pick(rng, 1, N - 1)))

    def ex_binary_pad(rng):
        n = N * pick(rng, 0, 2) + pick(rng, 1, N - 1)
        return T(ELEMENTWISE_BINARY_OPS[pick(rng, 0, len(ELEMENTWISE_BINARY_OPS) - 1)], tp(vec(n), vec(n)))

    def ex_reduce_pad(rng):
        n = N * pick(rng, 0, 2) + pick(rng, 1, N - 1)
        op = T(ELEMENTWISE_BINARY_OPS[pick(rng, 0, len(ELEMENTWISE_BINARY_OPS) - 1)], tp(vec(n), vec(n)))
        return T("Reduce", op, T("TA", vec(n), pick(rng, 2, 4)))

    def ex_slice_unary(rng):
        n2 = N * pick(rng, 1, 3)
        n = pick(rng, 1, n2 - 1) if n2 > 1 else 1
        return T("Comp", T("VVRelu", vec(n)), T("Slice", 0, n, vec(n2)))

    def ex_slice_binary(rng):
        n2 = N * pick(rng, 1, 3)
        n = pick(rng, 1, n2 - 1) if n2 > 1 else 1
        g = T("Comp", T("Slice", 0, n, vec(n2)), T("VVRelu", vec(n2)))
        h = T("Comp", T("Slice", 0, n, vec(n2)), T("VVTanh", vec(n2)))
        return T("Comp", T("VVAdd", tp(vec(n), vec(n))), T("Fork", g, h))

    def ex_ws(rng):
        k = pick(rng, 1, 3)
        return T("MMMul", tp(mat(2, k), mat(k, N)))

    def ex_ws_tiles(rng):
        k = pick(rng, 1, 2 * N + 1)
        return T("MMMul", tp(mat(pick(rng, 2, 3), k), mat(k, N * pick(rng, 1, 2))))

    def ex_ws_tiles_pad_out(rng):
        k = pick(rng, 1, 2 * N + 1)
        return T("MMMul", tp(mat(pick(rng, 2, 3), k), mat(k, N * pick(rng, 0, 1) + pick(rng, 1, N - 1))))

    def with_bias(make):
        """Examples of a GEMM example followed by a bias add on every result row."""
        def example(rng):
            gemm = make(rng)
            u, n = fout(gemm).args  # the result's rows and their count
            row = T("Comp", T("VVAdd", tp(u, u)), T("Fork", T("Id", u), T("Const", T("Var", "b", u), u)))
            return T("Comp", T("Map", row, n), gemm)
        return example

    ex_ws_bias_tiles, ex_ws_bias_tiles_pad_out = with_bias(ex_ws_tiles), with_bias(ex_ws_tiles_pad_out)
    ws_in = "(TP (TA (TA s k) n) (TA (TA s o) k))"
    ws_blocks = f"(TA (TA (TA s k) {N}) (/ o {N}))"
    ws_swap_in = f"(Fork (Snd (TP (TA (TA s k) {N}) (TA (TA s k) n))) (Fst (TP (TA (TA s k) {N}) (TA (TA s k) n))))"
    ws_swap_el = f"(Fork (Snd (TP (TA s k) (TA (TA s k) {N}))) (Fst (TP (TA s k) (TA (TA s k) {N}))))"
    pad_n = f"(+ n (- {N} (% n {N})))"
    pad_k = f"(+ k (- {N} (% k {N})))"
    padded_o = f"(+ o (- {N} (% o {N})))"

    def tiles_guard(o_padded: bool, k_padded: bool) -> list[str]:
        """When the tiling rules (with or without a bias) fire: o and k whole tiles or padded to
        them, more than one row, the rows and the (padded) results within `resident`."""
        return [f"({'!=' if o_padded else '='} 0 (% o {N}))", f"({'!=' if k_padded else '='} 0 (% k {N}))", "(> n 1)",
                f"(<= (* n (+ {padded_o if o_padded else 'o'} k)) {resident})"]

    tpm = "(TP (TA (TA s k) n) (TA s k))"
    unary = []
    for op in ELEMENTWISE_UNARY_OPS:
        unary.append(rewrite(f"({op} (TA s n))",
                             f"(Comp (Join (TA (TA s {N}) (/ n {N}))) (Comp (Map ({op} (TA s {N})) (/ n {N})) (Split {N} (TA s n))))",
                             a, [f"(= 0 (% n {N}))", f"(> n {N})"]))
    binary = []
    for op in ELEMENTWISE_BINARY_OPS:
        ts_ = f"(TA (TA s {N}) (/ n {N}))"
        binary.append(rewrite(
            f"({op} (TP (TA s n) (TA s n)))",
            f"(Comp (Join {ts_}) (Comp (Map ({op} (TP (TA s {N}) (TA s {N}))) (/ n {N})) (Comp (Zip (TP {ts_} {ts_})) "
            f"(Fork (Comp (Split {N} (TA s n)) (Fst (TP (TA s n) (TA s n)))) (Comp (Split {N} (TA s n)) (Snd (TP (TA s n) (TA s n))))))))",
            a, [f"(= 0 (% n {N}))", f"(> n {N})"]))
    pad_unary = [rewrite(f"({op} (TA s n))",
                         f"(Comp (Slice 0 n (TA s {pad_n})) (Comp ({op} (TA s {pad_n})) (Pad 0 (- {N} (% n {N})) (TA s n))))",
                         a, [f"(!= 0 (% n {N}))"]) for op in ELEMENTWISE_UNARY_OPS]
    pad_binary = [rewrite(
        f"({op} (TP (TA s n) (TA s n)))",
        f"(Comp (Slice 0 n (TA s {pad_n})) (Comp ({op} (TP (TA s {pad_n}) (TA s {pad_n}))) "
        f"(Fork (Comp (Pad 0 (- {N} (% n {N})) (TA s n)) (Fst (TP (TA s n) (TA s n)))) "
        f"(Comp (Pad 0 (- {N} (% n {N})) (TA s n)) (Snd (TP (TA s n) (TA s n)))))))",
        a, [f"(!= 0 (% n {N}))"]) for op in ELEMENTWISE_BINARY_OPS]
    reduce_pad = [rewrite(
        f"(Reduce ({op} (TP (TA s n) (TA s n))) (TA (TA s n) m))",
        f"(Comp (Slice 0 n (TA s {pad_n})) (Comp (Reduce ({op} (TP (TA s {pad_n}) (TA s {pad_n}))) (TA (TA s {pad_n}) m)) "
        f"(Map (Pad 0 (- {N} (% n {N})) (TA s n)) m)))",
        a, [f"(!= 0 (% n {N}))"]) for op in ELEMENTWISE_BINARY_OPS]
    slice_unary = []
    for op in ELEMENTWISE_UNARY_OPS:
        slice_unary += chain_rewrites([f"({op} (TA s n))", "(Slice 0 n (TA s n2))"],
                                      ["(Slice 0 n (TA s n2))", f"({op} (TA s n2))"], a)
    slice_binary = []
    for op in ELEMENTWISE_BINARY_OPS:
        slice_binary += chain_rewrites(
            [f"({op} (TP (TA s n) (TA s n)))", "(Fork (Comp (Slice 0 n (TA s n2)) g) h)"],
            ["(Slice 0 n (TA s n2))", f"({op} (TP (TA s n2) (TA s n2)))",
             "(Fork g (Comp (Pad 0 (- n2 n) (TA s n)) h))"], a, [f"(= 0 (% n2 {N}))"])
    return [
        Rule(f"mmmul-weight-stationary/{N}", a, (rewrite(
            "(MMMul (TP (TA (TA s k) n) (TA (TA s o) k)))",
            f"(Comp (Map (Join (TA (TA s {N}) (/ o {N}))) n) (Comp (Transpose (TA (TA (TA s {N}) n) (/ o {N}))) "
            f"(Comp (Map (Comp (Map (Comp (MVMul (TP (TA (TA s k) {N}) (TA s k))) {ws_swap_el}) n) "
            f"(Comp (DistR (TP (TA (TA s k) n) (TA (TA s k) {N}))) {ws_swap_in})) (/ o {N})) "
            f"(Comp (DistR (TP {ws_blocks} (TA (TA s k) n))) "
            f"(Fork (Comp (Split {N} (TA (TA s k) o)) (Comp (Transpose (TA (TA s o) k)) (Snd {ws_in}))) (Fst {ws_in}))))))",
            a, [f"(= 0 (% o {N}))", "(> n 1)", f"(<= (* n (+ o k)) {resident})", f"(> (* k o) {pinnable})"]),),
             f"output columns o divisible by {N}, more than one row, the n x k rows and the n x o result "
             f"fit on chip together ({resident} elements) and the k x o weights do not ({pinnable} "
             f"elements; pinned weights need no reuse, and hide their adds' latency in "
             f"mmmul-weight-stationary-tiles/{N})",
             f"A . B = for each block of {N} output columns (a weight block), for each row a of A: "
             f"MVMul(block, a): the weight loop outside (weight-stationary), so each block is moved on chip "
             f"once for all rows", ex_ws),
        Rule(f"mmmul-weight-stationary-tiles/{N}", a, tuple(
            rewrite("(MMMul (TP (TA (TA s k) n) (TA (TA s o) k)))", chain(_stationary_tiles(N, pad_k, pad_o), None), a,
                    tiles_guard(pad_o, pad_k))
            for pad_o in (False, True) for pad_k in (False, True)),
             f"more than one row, the n x k rows and the n x o result fit on chip together ({resident} "
             f"elements); the k columns, and the o output columns, padded with zeros to whole tiles; weights of "
             f"any size (pinned ones too: the sum's steps each add n rows, which hides the adds' latency)",
             f"A . B = for each block j of {N} output columns, the sum over the {N} x {N} tiles (j, t) of: for "
             f"each row a of A, MVMul(tile, a's slice t): each tile is moved to the matrix unit once for all rows "
             f"(the systolic array's weight-stationary loop: preload a tile, stream every row through it), and "
             f"each step of the sum is n independent adds; output columns padded to whole blocks are sliced off",
             ex_ws_tiles, ex_ws_tiles_pad_out),
        Rule(f"mmmul-bias-weight-stationary-tiles/{N}", a, tuple(
            r for pad_o in (False, True) for pad_k in (False, True) for r in chain_rewrites(
                ["(Map (Comp (VVAdd (TP u u)) (Fork (Id u) (Const b u))) n)", "(MMMul (TP (TA (TA s k) n) (TA (TA s o) k)))"],
                _stationary_tiles(N, pad_k, pad_o, bias=True), a, tiles_guard(pad_o, pad_k))),
             f"as mmmul-weight-stationary-tiles/{N}",
             f"Map (+ b) . (A . B) = mmmul-weight-stationary-tiles/{N} with b's block j added to each row of block "
             f"j's sum in the loop over blocks: a layer's bias added where its block of results is, so the block "
             f"can be stored there too (tooutput-into-map), and the results need never be on chip all at once",
             ex_ws_bias_tiles, ex_ws_bias_tiles_pad_out),
        Rule(f"mvmul-split-rows/{N}", a, (rewrite(
            f"(MVMul {tpm})",
            f"(Comp (Join (TA (TA s {N}) (/ n {N}))) (Comp (Map (MVMul (TP (TA (TA s k) {N}) (TA s k))) (/ n {N})) "
            f"(Comp (DistR (TP (TA (TA (TA s k) {N}) (/ n {N})) (TA s k))) "
            f"(Fork (Comp (Split {N} (TA (TA s k) n)) (Fst {tpm})) (Snd {tpm})))))",
            a, [f"(= 0 (% n {N}))", f"(> n {N})"]),),
             f"rows n divisible by {N}, n > {N}",
             "MVMul(W, x) = Join . Map(MVMul(-, x)) (Split N W): one output tile per row block", ex_rows),
        Rule(f"mvmul-split-cols/{N}", a, (rewrite(
            f"(MVMul {tpm})",
            f"(Comp (Reduce (VVAdd (TP (TA s n) (TA s n))) (TA (TA s n) (/ k {N}))) "
            f"(Comp (Map (MVMul (TP (TA (TA s {N}) n) (TA s {N}))) (/ k {N})) "
            f"(Comp (Zip (TP (TA (TA (TA s {N}) n) (/ k {N})) (TA (TA s {N}) (/ k {N})))) "
            f"(Fork (Comp (Transpose (TA (TA (TA s {N}) (/ k {N})) n)) (Comp (Map (Split {N} (TA s k)) n) (Fst {tpm}))) "
            f"(Comp (Split {N} (TA s k)) (Snd {tpm}))))))",
            a, [f"(= 0 (% k {N}))", f"(> k {N})"]),),
             f"columns k divisible by {N}, k > {N}",
             "MVMul(W, x) = Reduce(VVAdd) . Map(MVMul) . Zip(column blocks of W, Split N x): partial sums", ex_cols),
        Rule(f"mvmul-pad-rows/{N}", a, (rewrite(
            f"(MVMul {tpm})",
            f"(Comp (Slice 0 n (TA s {pad_n})) (Comp (MVMul (TP (TA (TA s k) {pad_n}) (TA s k))) "
            f"(Fork (Comp (Pad 0 (- {N} (% n {N})) (TA (TA s k) n)) (Fst {tpm})) (Snd {tpm}))))",
            a, [f"(!= 0 (% n {N}))"]),),
             f"rows n not divisible by {N}",
             "MVMul(W, x) = Slice(0, n) . MVMul(Pad rows W to a multiple of N, x)", ex_pad_rows),
        Rule(f"mvmul-pad-cols/{N}", a, (rewrite(
            f"(MVMul {tpm})",
            f"(Comp (MVMul (TP (TA (TA s {pad_k}) n) (TA s {pad_k}))) "
            f"(Fork (Comp (Map (Pad 0 (- {N} (% k {N})) (TA s k)) n) (Fst {tpm})) "
            f"(Comp (Pad 0 (- {N} (% k {N})) (TA s k)) (Snd {tpm}))))",
            a, [f"(!= 0 (% k {N}))"]),),
             f"columns k not divisible by {N}",
             "MVMul(W, x) = MVMul(W with zero columns, x with zeros): zeros add nothing", ex_pad_cols),
        Rule(f"unary-split/{N}", a, tuple(unary), f"length divisible by {N}, longer than {N}",
             "elementwise f = Join . Map(f) . Split N", ex_unary),
        Rule(f"binary-split/{N}", a, tuple(binary), f"length divisible by {N}, longer than {N}",
             "elementwise (a op b) = Join . Map(op) . Zip(Split N a, Split N b)", ex_binary),
        Rule(f"unary-pad/{N}", a, tuple(pad_unary), f"length not divisible by {N}",
             "elementwise f = Slice(0, n) . f . Pad (the padding's values are sliced away)", ex_unary_pad),
        Rule(f"binary-pad/{N}", a, tuple(pad_binary), f"length not divisible by {N}",
             "a op b = Slice(0, n) (Pad a op Pad b) for elementwise op", ex_binary_pad),
        Rule(f"reduce-pad/{N}", a, tuple(reduce_pad), f"length not divisible by {N}",
             "Reduce(op) over vectors = Slice(0, n) . Reduce(op over padded vectors) . Map(Pad) for elementwise op "
             "(the padding lanes never meet the others)", ex_reduce_pad),
        Rule(f"slice-through-unary/{N}", a, tuple(slice_unary), "slice starts at 0",
             "f . Slice(0, n) = Slice(0, n) . f on the longer vector (elementwise f)", ex_slice_unary),
        Rule(f"slice-through-binary/{N}", a, tuple(slice_binary), f"padded length divisible by {N}",
             "Slice(0,n) a op b = Slice(0, n) (a op Pad b): elementwise op on the padded vector", ex_slice_binary),
    ]


# ---------------------------------------------------------------- data movement


# a reduction's operator that moves both operands, marked from the moving fork up its stages
# (tail_chain), so that rules matching it walk only those chains
REDUCE_TAILS = [tail_walk("reducetail", HOIST_DEPTH + 1)] + [
    f"(rule ((= f (Fork {side.format(x='(Fst (TP a a))')} {side.format(x='(Snd (TP a a))')}))) ((reducetail f 0)) "
    ":ruleset analysis)" for side in ("(Comp (ToChip sp a) {x})", "(Comp h (Comp (ToChip sp a) {x}))")]


def _reduce_operand_moves() -> list[tuple[str, str, str]]:
    """(query, operator without the moves, operator moving only Snd) for a Reduce e whose
    operator op, into memory sp, moves both operands of type a at most HOIST_DEPTH stages
    before its end (h: a stage after the move, or none)."""
    out = []
    for before, after in (("(Comp (ToChip sp a) {x})", "{x}"), ("(Comp h (Comp (ToChip sp a) {x}))", "(Comp h {x})")):
        fst, snd = "(Fst (TP a a))", "(Snd (TP a a))"
        both = f"(Fork {before.format(x=fst)} {before.format(x=snd)})"
        for depth in range(1, HOIST_DEPTH + 2):
            prefix = [f"p{i}" for i in range(depth)]
            out.append((f"(= e (Reduce op (TA a n))) {tail_chain('op', prefix, both, 'reducetail')} (inspace op sp)",
                        chain(prefix, f"(Fork {after.format(x=fst)} {after.format(x=snd)})"),
                        chain(prefix, f"(Fork {after.format(x=fst)} {before.format(x=snd)})")))
    return out


def _movement() -> list[Rule]:
    a = "algorithmic"

    def ex_elide(rng):
        n = pick(rng, 1, 5)
        return T("Comp", T("ToChip", "mem", vec(n)), T("ToChip", "mem", vec(n)))

    def ex_view(rng):
        k, m = pick(rng, 1, 4), pick(rng, 1, 4)
        return T("Comp", T("ToChip", "mem", mat(m, k)), T("Split", k, vec(k * m)))

    def ex_hoist(rng):
        n, m = pick(rng, 1, 4), pick(rng, 1, 4)
        p = tp(vec(n), vec(n))
        body = T("Comp", T("VVAdd", p), T("Fork", T("Comp", T("ToChip", "mem", vec(n)), T("Fst", p)), T("Snd", p)))
        return T("Map", body, m)

    def ex_hoist_snd(rng):
        n, m = pick(rng, 1, 4), pick(rng, 1, 4)
        p = tp(vec(n), vec(n))
        body = T("Comp", T("VVAdd", p), T("Fork", T("Fst", p), T("Comp", T("ToChip", "mem", vec(n)), T("Snd", p))))
        return T("Map", body, m)

    def ex_move_twice(rng):
        n, m = pick(rng, 1, 4), pick(rng, 1, 4)
        p = tp(vec(n), vec(n + 1))
        mv = T("Map", T("Fork", T("Comp", T("ToChip", "mem", vec(n)), T("Fst", p)), T("Snd", p)), m)
        return comp(mv, mv, T("Id", T("TA", p, m)))

    def ex_through_zip(rng):
        n, m = pick(rng, 1, 4), pick(rng, 1, 4)
        p = tp(vec(n), vec(n + 1))
        pa = tp(T("TA", vec(n), m), T("TA", vec(n + 1), m))
        return T("Comp", T("Map", T("Fork", T("Comp", T("ToChip", "mem", vec(n)), T("Fst", p)), T("Snd", p)), m), T("Zip", pa))

    def ex_through_distr(rng):
        n, m = pick(rng, 1, 4), pick(rng, 1, 4)
        p = tp(vec(n), vec(n + 1))
        pa = tp(T("TA", vec(n), m), vec(n + 1))
        return T("Comp", T("Map", T("Fork", T("Fst", p), T("Comp", T("ToChip", "mem", vec(n + 1)), T("Snd", p))), m), T("DistR", pa))

    def ex_reduce(rng):
        n, m = pick(rng, 1, 4), pick(rng, 2, 4)
        p = tp(vec(n), vec(n))
        add_on_chip = T("Comp", T("ToChip", "mem", vec(n)), T("VVAdd", p))
        op = T("Comp", add_on_chip, T("Fork", T("Comp", T("ToChip", "mem", vec(n)), T("Fst", p)),
                                          T("Comp", T("ToChip", "mem", vec(n)), T("Snd", p))))
        return T("Reduce", op, T("TA", vec(n), m))

    def ex_reduce_view_after(rng):
        k, rows, m = pick(rng, 1, 3), pick(rng, 1, 3), pick(rng, 2, 4)
        p, pm = tp(vec(k * rows), vec(k * rows)), tp(mat(rows, k), mat(rows, k))
        moved = [comp(T("Split", k, vec(k * rows)), T("ToChip", "mem", vec(k * rows)), T(x, p)) for x in ("Fst", "Snd")]
        op = comp(T("ToChip", "mem", vec(k * rows)), T("Join", mat(rows, k)), T("Map", T("VVAdd", tp(vec(k), vec(k))), rows),
                  T("Zip", pm), T("Fork", *moved))
        return T("Reduce", op, T("TA", vec(k * rows), m))

    def ex_fold(rng):
        n, steps = pick(rng, 1, 4), pick(rng, 1, 4)
        p = tp(vec(n), vec(n))
        step = comp(T("ToChip", "mem", vec(n)), T("VVAdd", p),
                    T("Fork", comp(T("ToChip", "mem", vec(n)), T("Fst", p)), T("Snd", p)))
        return T("Fold", step, tp(vec(n), T("TA", vec(n), steps)))

    def ex_fold_view(rng):
        k, rows, steps = pick(rng, 1, 3), pick(rng, 1, 3), pick(rng, 1, 3)
        p, pm = tp(vec(k * rows), vec(k * rows)), tp(mat(rows, k), mat(rows, k))
        state = comp(T("Split", k, vec(k * rows)), T("ToChip", "mem", vec(k * rows)), T("Fst", p))
        step = comp(T("ToChip", "mem", vec(k * rows)), T("Join", mat(rows, k)), T("Map", T("VVMax", tp(vec(k), vec(k))), rows),
                    T("Zip", pm), T("Fork", comp(T("Split", k, vec(k * rows)), T("Snd", p)), state))
        return T("Fold", step, tp(vec(k * rows), T("TA", vec(k * rows), steps)))

    def ex_hoist_restaged(rng):
        n, m = pick(rng, 1, 4), pick(rng, 1, 4)
        p = tp(vec(n), vec(n))
        staged = comp(T("Restage", "mem", vec(n)), T("ToChip", "stage", vec(n)), T("Fst", p))
        return T("Map", T("Comp", T("VVAdd", p), T("Fork", T("Snd", p), staged)), m)

    def ex_hoist_whole(rng):
        n, m = pick(rng, 1, 4), pick(rng, 1, 4)
        return T("Map", comp(T("VVAdd", tp(vec(n), vec(n))), T("Fork", T("ToChip", "mem", vec(n)), T("VVRelu", vec(n)))), m)

    def ex_hoist_unary(rng):
        n, m = pick(rng, 1, 4), pick(rng, 1, 4)
        return T("Map", T("Comp", T("VVRelu", vec(n)), T("ToChip", "mem", vec(n))), m)

    def ex_hoist_pad(rng):
        k, extra, m = pick(rng, 1, 3), pick(rng, 1, 3), pick(rng, 1, 3)
        body = comp(T("VVRelu", vec(k + extra)), T("ToChip", "mem", vec(k + extra)), T("Pad", 0, extra, vec(k)))
        return T("Map", body, m)

    def ex_hoist_map_pad(rng):
        k, rows, m = pick(rng, 1, 3), pick(rng, 1, 3), pick(rng, 1, 3)
        moved = T("ToChip", "mem", mat(rows, k + 1))
        body = comp(T("Map", T("VVRelu", vec(k + 1)), rows), moved, T("Map", T("Pad", 0, 1, vec(k)), rows))
        return T("Map", body, m)

    def ex_hoist_chain(rng):
        k, rows, m = pick(rng, 1, 3), pick(rng, 1, 3), pick(rng, 1, 3)
        body = comp(T("Join", mat(rows, k)), T("Map", T("VVRelu", vec(k)), rows), T("Split", k, vec(k * rows)),
                    T("ToChip", "mem", vec(k * rows)))
        return T("Map", body, m)

    prefixes = [[f"p{i}" for i in range(depth)] for depth in range(1, HOIST_DEPTH + 2)]
    from_reduce = [f"(rule ({match}) ((union e (Comp (Reduce {both_moved} (TA a n)) (ToChip sp (TA a n))))) :ruleset {a})"
                   for match, both_moved, _ in _reduce_operand_moves()]
    # a Fold's step moving the state it reads: the state stays where the step leaves it, so only
    # the initial state needs the move. Matched only along the stages of Fold steps (foldstage,
    # marked from each Fold down its step's chain): marking up from every such Fork, as for
    # reductions, made LSTM(256)'s saturation five times slower
    from_fold = ["(rule ((= e (Fold op t))) ((foldstage op 0)) :ruleset analysis)",
                 f"(rule ((foldstage f k) (< k {HOIST_DEPTH + 1}) (= f (Comp p r))) ((foldstage r (+ k 1))) :ruleset analysis)"]
    for before, after in (("(Comp (ToChip sp a) (Fst (TP a b)))", "(Fst (TP a b))"),
                          ("(Comp v (Comp (ToChip sp a) (Fst (TP a b))))", "(Comp v (Fst (TP a b)))")):
        for fork_before, fork_after in ((f"(Fork {before} h)", f"(Fork {after} h)"), (f"(Fork h {before})", f"(Fork h {after})")):
            for prefix in prefixes:
                names = ["op"] + [f"op__{i}" for i in range(1, len(prefix) + 1)]
                stages = " ".join(f"(foldstage {name} {i}) (= {name} (Comp {p} {names[i + 1]}))"
                                  for i, (name, p) in enumerate(zip(names, prefix)))
                from_fold.append(
                    f"(rule ((= e (Fold op (TP a xs))) {stages} (= {names[-1]} {fork_before}) (inspace op sp)) "
                    f"((union e (Comp (Fold {chain(prefix, fork_after)} (TP a xs)) "
                    f"(Fork (Comp (ToChip sp a) (Fst (TP a xs))) (Snd (TP a xs)))))) :ruleset {a})")
    # the move ends the body, or moves the whole element in one branch of a Fork
    hoist = []
    for moved, left in (("(ToChip sp t)", None), ("(Fork (ToChip sp t) h)", "(Fork (Id t) h)"),
                        ("(Fork h (ToChip sp t))", "(Fork h (Id t))")):
        hoist += [rewrite(f"(Map {chain(p, moved)} n)", f"(Comp (Map {chain(p, left)} n) (ToChip sp (TA t n)))", a)
                  for p in prefixes]
    for pad in ("(Pad l r u)", "(Map (Pad l r u) k)"):   # padding before the move: padded in a loop of its own
        hoist += [rewrite(f"(Map {chain(p, f'(Comp (ToChip sp t) {pad})')} n)",
                          f"(Comp (Map {chain(p, None)} n) (Comp (ToChip sp (TA t n)) (Map {pad} n)))", a) for p in prefixes]
    # (PairMove x sp): the stage moving to sp only the part of a pair x reads (analysis), so one
    # rule per branch and depth serves both parts
    # (a move into a staging memory followed by a Restage out of it is hoisted the same way, the
    # Restage staying in the loop)
    forks = {"(Fork (Comp (ToChip sp a) x) h)": "(Fork x h)", "(Fork h (Comp (ToChip sp a) x))": "(Fork h x)",
             "(Fork (Comp (Restage m c) (Comp (ToChip sp a) x)) h)": "(Fork (Comp (Restage m c) x) h)",
             "(Fork h (Comp (Restage m c) (Comp (ToChip sp a) x)))": "(Fork h (Comp (Restage m c) x))"}
    for part in ("Fst", "Snd"):
        elem_t = "a0" if part == "Fst" else "b0"
        move = f"(Comp (ToChip sp {elem_t}) ({part} (TP a0 b0)))"
        only = f"(Fork {move} (Snd (TP a0 b0)))" if part == "Fst" else f"(Fork (Fst (TP a0 b0)) {move})"
        for fork in forks:
            hoist.append(f"(rule ((= f {fork}) (reads{part.lower()} x) (= (TP a0 b0) (fin x))) "
                         f"((union (PairMove x sp) {only})) :ruleset analysis)")
    for fork_l, fork_r in forks.items():
        for depth in range(HOIST_DEPTH + 1):
            prefix = [f"p{i}" for i in range(depth)]
            hoist.append(f"(rule ((= e (Map {chain(prefix, fork_l)} n)) (= o (PairMove x sp))) "
                         f"((union e (Comp (Map {chain(prefix, fork_r)} n) (Map o n)))) :ruleset {a})")
    through = []
    for src in ("Zip", "DistR"):
        for pos in ("Fst", "Snd"):
            if src == "DistR":
                arr = "(TP (TA a n) b)"
                moved_t = "(TA a n)" if pos == "Fst" else "b"
            else:
                arr = "(TP (TA a n) (TA b n))"
                moved_t = "(TA a n)" if pos == "Fst" else "(TA b n)"
            elem_t = "a" if pos == "Fst" else "b"
            inner_moved = f"(Comp (ToChip sp {elem_t}) ({pos} (TP a b)))"
            other = "(Snd (TP a b))" if pos == "Fst" else "(Fst (TP a b))"
            elem_fork = f"(Fork {inner_moved} {other})" if pos == "Fst" else f"(Fork {other} {inner_moved})"
            outer_moved = f"(Comp (ToChip sp {moved_t}) ({pos} {arr}))"
            outer_other = f"({'Snd' if pos == 'Fst' else 'Fst'} {arr})"
            outer_fork = f"(Fork {outer_moved} {outer_other})" if pos == "Fst" else f"(Fork {outer_other} {outer_moved})"
            through += chain_rewrites([f"(Map {elem_fork} n)", f"({src} {arr})"], [f"({src} {arr})", outer_fork], a)
    def ex_store_view(rng):
        k, m = pick(rng, 1, 4), pick(rng, 1, 4)
        return T("Comp", T("ToOutput", mat(m, k)), T("Split", k, vec(k * m)))

    def ex_store_transpose(rng):
        n, k = pick(rng, 1, 3), pick(rng, 1, 4)
        m = n + pick(rng, 1, 2)  # a transpose of a square array keeps its type, which the rule leaves alone
        return T("Comp", T("ToOutput", T("TA", mat(n, k), m)), T("Transpose", T("TA", mat(m, k), n)))

    def ex_store_map(rng):
        n, m = pick(rng, 1, 4), pick(rng, 1, 4)
        return T("Comp", T("ToOutput", T("TA", vec(n), m)), T("Map", T("VVRelu", vec(n)), m))

    def ex_fold_state(rng):
        n, steps = pick(rng, 1, 4), pick(rng, 1, 4)
        p = tp(vec(n), vec(n))
        fold = T("Fold", T("Comp", T("VVTanh", vec(n)), T("VVAdd", p)), tp(vec(n), T("TA", vec(n), steps)))
        return T("Comp", T("ToOutput", vec(n)), fold)

    def ex_spill_map(rng):
        n, m = pick(rng, 1, 4), pick(rng, 1, 4)
        return T("Comp", T("ToDram", T("TA", vec(n), m)), T("Map", T("VVRelu", vec(n)), m))

    def ex_spill_fork(rng):
        n = pick(rng, 1, 4)
        return T("Comp", T("ToDram", tp(vec(n), vec(n))), T("Fork", T("VVRelu", vec(n)), T("VVTanh", vec(n))))

    return [
        Rule("tooutput-through-view", a, (
            rewrite("(Comp (ToOutput t) v)", "(Comp v (ToOutput u))", a, ["(rowview v)", "(= u (fin v))", "(!= u t)"]),
            rewrite("(Comp (ToOutput t) (Comp v r))", "(Comp v (Comp (ToOutput u) r))", a,
                    ["(rowview v)", "(= u (fin v))", "(!= u t)"]),
        ), "v only re-indexes whole rows (Split, Join, Zip, DistR, Slice, Transposes of outer dimensions, maps of "
           "these)",
             "storing a re-indexed value = re-indexing the stored value (the reader follows the view; rows stay "
             "whole, so each is stored in whole native vectors)", ex_store_view, ex_store_transpose),
        Rule("tooutput-into-map", a, chain_rewrites(["(ToOutput (TA t n))", "(Map f n)"], ["(Map (Comp (ToOutput t) f) n)"], a),
             "none", "storing a loop's results = storing each result in its iteration (only one result is on chip "
             "at a time)", ex_store_map),
        Rule("fold-state-in-dram", a, chain_rewrites(["(ToOutput s)", "(Fold g (TP s xs))"],
                                                     ["(Fold (Comp (ToDram s) g) (TP s xs))"], a),
             "none", "a recurrence whose result is stored may keep its state in DRAM: each step stores the state "
             "it returns, the next reads it from there, and the last one's is the result (for a state too large "
             "to stay on chip)", ex_fold_state),
        Rule("todram-into-map", a, chain_rewrites(["(ToDram (TA t n))", "(Map f n)"], ["(Map (Comp (ToDram t) f) n)"], a),
             "none", "storing a loop's results = storing each result in its iteration", ex_spill_map),
        Rule("todram-into-fork", a, chain_rewrites(["(ToDram (TP a b))", "(Fork g h)"],
                                                   ["(Fork (Comp (ToDram a) g) (Comp (ToDram b) h))"], a),
             "none", "storing a pair = storing each part", ex_spill_fork),
        Rule("tochip-elide", a, (rewrite("(Comp (ToChip sp t) g)", "g", a, ["(inspace g sp)"], subsume=True),),
             "the value is already in that memory", "ToChip . g = g when g's output already sits in that memory",
             ex_elide),
        Rule("tochip-through-view", a, (
            rewrite("(Comp (ToChip sp t) v)", "(Comp v (ToChip sp u))", a,
                    ["(reindex v)", "(= u (fin v))", "(!= u t)"]),
            rewrite("(Comp (ToChip sp t) (Comp v r))", "(Comp v (Comp (ToChip sp u) r))", a,
                    ["(reindex v)", "(= u (fin v))", "(!= u t)"]),
        ), "v only re-indexes (Split, Join, Transpose, Zip, DistR, Slice, maps of these)",
             "moving a re-indexed value = re-indexing the moved value", ex_view),
        Rule("tochip-hoist-from-map", a, tuple(hoist),
             f"the moved branch only re-indexes one part of the element; at most {HOIST_DEPTH} stages after it",
             "Map(f . Fork(ToChip . v . Fst, h)) = Map(f . Fork(v . Fst, h)) . Map(Fork(ToChip . Fst, Snd)) (and "
             "for Snd, either branch, and with a Restage before the ToChip, which stays in the loop), "
             "Map(f . Fork(ToChip, h)) = Map(f . Fork(Id, h)) . ToChip (the whole element moved), "
             f"Map(f . ToChip) = Map(f) . ToChip (f a chain of up to {HOIST_DEPTH + 1} "
             "stages), Map(f . ToChip . q) = Map(f) . ToChip . Map(q) for q a Pad or a Map of one: a move inside a "
             "loop body becomes a move of the whole array before the loop",
             ex_hoist, ex_hoist_snd, ex_hoist_restaged, ex_hoist_whole, ex_hoist_unary, ex_hoist_chain, ex_hoist_pad,
             ex_hoist_map_pad),
        Rule("move-stage-idempotent", a, (
            rewrite("(Comp (Map m n) (Comp (Map m n) r))", "(Comp (Map m n) r)", a, ["(ismove m)"], subsume=True),
            rewrite("(Comp (Map m n) (Map m n))", "(Map m n)", a, ["(ismove m)"], subsume=True),
            rewrite("(Comp m (Comp m r))", "(Comp m r)", a, ["(ismove m)"], subsume=True),
            rewrite("(Comp m m)", "m", a, ["(ismove m)"], subsume=True),
        ), "m only moves a part of a pair on chip",
             "moving twice is moving once (keeps hoisted moves from stacking up)", ex_move_twice),
        Rule("tochip-through-zip", a, tuple(through), "none",
             "moving each element's part after Zip/DistR = moving the whole array before it (DistR: once)",
             ex_through_zip, ex_through_distr),
        Rule("tochip-hoist-from-reduce", a, tuple(REDUCE_TAILS + from_reduce),
             f"the operator's output stays in that memory; at most {HOIST_DEPTH + 1} stages after the operands",
             "Reduce(f . Fork(h . ToChip . Fst, h . ToChip . Snd)) = Reduce(f . Fork(h . Fst, h . Snd)) . ToChip "
             "(h may be absent): a reduction whose operator moves both operands = the reduction over the moved "
             "array (its accumulator is already there)",
             ex_reduce, ex_reduce_view_after),
        Rule("tochip-hoist-from-fold", a, tuple(from_fold),
             f"the step's output stays in that memory; at most {HOIST_DEPTH + 1} stages after the state's fork",
             "Fold(f . Fork(h . ToChip . Fst, g)) = Fold(f . Fork(h . Fst, g)) . Fork(ToChip . Fst, Snd) (either "
             "branch; h may be absent): a recurrence whose step moves the state it reads = the recurrence from the "
             "moved initial state (each later state is already where the step leaves it)", ex_fold, ex_fold_view),
    ]


def _stacking() -> list[Rule]:
    a = "algorithmic"

    def ex_full(rng):
        n = pick(rng, 1, 5)
        return T("Slice", 0, n, vec(n))

    def ex_reduce_one(rng):
        n = pick(rng, 1, 5)
        return T("Reduce", T("VVAdd", tp(vec(n), vec(n))), T("TA", vec(n), 1))

    return [
        Rule("reduce-one", a, (rewrite("(Reduce f (TA (TA e k) 1))", "(Join (TA (TA e k) 1))", a, subsume=True),),
             "one element", "Reduce over a one-element array of arrays = that element (a Join: no instruction)",
             ex_reduce_one),
        Rule("slice-whole", a, (rewrite("(Slice 0 n (TA e n))", "(Id (TA e n))", a),), "the slice is the whole array",
             "Slice(0, n) of an n-element array = Id", ex_full),
    ]


def _merge_row_blocks(N: int) -> Rule:
    """Products of one input by adjacent row blocks of one weight (an RNN's gates) as slices of
    one product by the stacked blocks, where stacking can pack a partial tile of N rows: two
    blocks of whole tiles stacked are the same tiles (on GRU and LSTM steps at DeepBench sizes,
    unguarded, it doubled their e-nodes and saturation time and changed no program)."""
    a = "algorithmic"

    def mv(rows: str, start: str) -> str:
        return (f"(Comp (MVMul (TP (TA (TA s k) {rows}) (TA s k))) "
                f"(Fork (Const (App (Slice {start} {rows} tw) w) tp) g))")

    merge = (
        f"(rule ((= e1 {mv('n1', 'r0')}) (= e2 {mv('n2', 'r1')}) (= r1 (+ r0 n1)) (!= 0 (+ (% n1 {N}) (% n2 {N})))) "
        f"((let big {mv('(+ n1 n2)', 'r0')}) "
        f"(union e1 (Comp (Slice 0 n1 (TA s (+ n1 n2))) big)) "
        f"(union e2 (Comp (Slice n1 n2 (TA s (+ n1 n2))) big))) :ruleset {a})"
    )

    def ex_merge(rng):
        partial = N * pick(rng, 0, 1) + pick(rng, 1, N - 1)  # ends in a partial tile: the guard holds
        other = pick(rng, 1, N + 1)
        n1, n2 = (partial, other) if pick(rng, 0, 1) else (other, partial)
        k, extra = pick(rng, 1, 4), pick(rng, 0, 2)
        rows = n1 + n2 + extra
        tw = mat(rows, k)
        w = var("W", tw)
        x = T("Id", vec(k))

        def block(start: int, n: int) -> Term:
            const = T("Const", T("App", T("Slice", start, n, tw), w), vec(k))
            return T("Comp", T("MVMul", tp(mat(n, k), vec(k))), T("Fork", const, x))

        return T("Fork", block(extra, n1), block(extra + n1, n2))

    return Rule(f"mvmul-merge-row-blocks/{N}", a, (merge,),
                f"the two weight blocks are adjacent rows of one constant; not both a multiple of {N} rows",
                "MVMul(W[a:a+n1], x) and MVMul(W[a+n1:a+n1+n2], x) are slices of MVMul(W[a:a+n1+n2], x): products "
                "of one input by stacked weights (an RNN's gates) become one larger product", ex_merge)


def _im2col() -> list[Rule]:
    a = "algorithmic"

    def ex_fission(rng):
        k, m, n = pick(rng, 1, 3), pick(rng, 1, 3), pick(rng, 1, 4)
        return T("Map", T("Comp", T("VVRelu", vec(k * m)), T("Join", mat(m, k))), n)

    def ex_mmmul(rng):
        n, k, o = pick(rng, 1, 5), pick(rng, 1, 5), pick(rng, 1, 5)
        w = var("W", mat(o, k))
        body = T("Comp", T("MVMul", tp(mat(o, k), vec(k))), T("Fork", T("Const", w, vec(k)), T("Id", vec(k))))
        return T("Map", body, n)

    return [
        Rule("map-fission-layout", a, (rewrite("(Map (Comp f v) n)", "(Comp (Map f n) (Map v n))", a, ["(islayout v)"]),),
             "v only re-lays out one array (Split, Join, Slice, Transpose, Slide, maps of these)",
             "Map(f . v) = Map f . Map v: a loop body's leading re-indexing becomes a layout of the whole array "
             "(per-window flattening becomes the im2col matrix)", ex_fission),
        Rule("map-mvmul-to-mmmul", a, (rewrite(
            "(Map (Comp (MVMul (TP (TA (TA s k) o) (TA s k))) (Fork (Const w (TA s k)) (Id (TA s k)))) n)",
            "(Comp (MMMul (TP (TA (TA s k) n) (TA (TA s o) k))) "
            "(Fork (Id (TA (TA s k) n)) (Const (App (Transpose (TA (TA s k) o)) w) (TA (TA s k) n))))", a),),
             "the matrix is the same constant for every row",
             "Map over rows x of MVMul(W, x) = MMMul(rows, transpose W): per-pixel products of a convolution "
             "are one GEMM of the im2col matrix", ex_mmmul),
    ]


def common_algorithmic_rules() -> list[Rule]:
    """Lift's structural rules, the layout algebra, and the data-movement, stacking and im2col
    rules: the same for every target."""
    return (_structural() + layout_algebra_rules() + _movement() + [_map_reduce_interchange_moved()] + _stacking()
            + _im2col())


def _reduce_accumulator_on_chip(resident: int) -> Rule:
    """A reduction whose operator moves both operands on chip, as a Fold from the first element
    moved, each step moving only the element it adds; for arrays of matrices of more than half of
    `resident` elements, which a move of the whole array before the reduction leaves too little
    room for. It costs saturation time on layers whose programs do not use it, where it matches
    nothing (a GEMM 1024x700x512 on cpu: 1.25 s without it, 1.4 s guarded, 1.7 s and 3,648
    e-nodes instead of 3,326 unguarded; for vectors too, 1.6 s) and where it does (a GRU(512)
    step on the systolic array: 1.9 s and 7,072 e-nodes, 2.5 s and 7,537, 3.1 s and 7,681)."""
    a = "algorithmic"
    half = resident // 2

    def moved(op: Term, t: Term) -> Term:
        """op with both operands moved to "mem", its result left there."""
        p = tp(t, t)
        return comp(T("ToChip", "mem", t), op, T("Fork", *(comp(T("ToChip", "mem", t), T(x, p)) for x in ("Fst", "Snd"))))

    def ex_rows(rng):
        k, rows = pick(rng, 1, 3), pick(rng, 1, 3)
        row_max = comp(T("Map", T("VVMax", tp(vec(k), vec(k))), rows), T("Zip", tp(mat(rows, k), mat(rows, k))))
        return T("Reduce", moved(row_max, mat(rows, k)), T("TA", mat(rows, k), half // (k * rows) + pick(rng, 1, 3)))

    first = "(Fork (Comp (ToChip sp a) (Comp (Join (TA a 1)) (Slice 0 1 (TA a n)))) (Slice 1 (- n 1) (TA a n)))"
    rules = [f"(rule ({match} (= a (TA (TA (TS d) k) r)) (> (* n (* k r)) {half})) "
             f"((union e (Comp (Fold {only_snd} (TP a (TA a (- n 1)))) {first}))) :ruleset {a})"
             for match, _, only_snd in _reduce_operand_moves()]
    return Rule("reduce-accumulator-on-chip", a, tuple(REDUCE_TAILS + rules),
                f"the operator's output stays in that memory; the operands are matrices of scalars (a pooled row's "
                f"channel vectors), n of them more than {half} elements in all; at most {HOIST_DEPTH + 1} stages "
                f"after the operands",
                "Reduce(f . Fork(h . ToChip . Fst, h . ToChip . Snd)) = Fold(f . Fork(h . Fst, h . ToChip . Snd)) . "
                "Fork(ToChip . x[0], x[1:]) (h may be absent): the accumulator stays on chip and each step moves "
                "only the element it adds (Lift's reduceSeq with its accumulator in private memory)",
                ex_rows)


def _map_reduce_interchange_moved() -> Rule:
    """Lift's mapReduceInterchange at any length, for reductions whose operator moves both
    operands on chip (the windows of a max pool over the stack's input): m reductions become one
    whose every step is m operations, so that the steps hide the operator's latency (VTA's ALU:
    48 cycles). Its moves then leave the loop and the rows are moved in the order the steps read
    them (tochip-hoist-from-map, -through-zip, -from-reduce). Of reductions over values already
    on chip, only tiles of the native size interchange (map-reduce-interchange/N): at any length,
    a pool's steps read rows of windows moved window by window, so each row's first step waited
    for all its moves, and programs that ran faster tied in the cost model with it."""
    a = "algorithmic"

    def ex_windows(rng):
        k, n, m = pick(rng, 1, 3), pick(rng, 2, 4), pick(rng, 1, 4)
        p = tp(vec(k), vec(k))
        moves = T("Fork", *(comp(T("ToChip", "mem", vec(k)), T(x, p)) for x in ("Fst", "Snd")))
        return T("Map", T("Reduce", comp(T("VVMax", p), moves), T("TA", vec(k), n)), m)

    return Rule("map-reduce-interchange-moved", a, tuple(REDUCE_TAILS) + (
        f"(rule ((= e (Map (Reduce f (TA x n)) m)) (reducetail f k)) ((union e (Comp (Reduce (Comp (Map f m) "
        f"(Zip (TP (TA x m) (TA x m)))) (TA (TA x m) n)) (Transpose (TA (TA x n) m))))) :ruleset {a})",),
                f"the operator moves both operands, at most {HOIST_DEPTH + 1} stages before its end",
                "Map (Reduce f) = Reduce (Map f . Zip) . Transpose, any length m: m reductions of moved operands "
                "become one reduction of m-element rows (Lift's mapReduceInterchange)", ex_windows)


def fold_map_interchange(pinnable: int) -> Rule:
    """A recurrence over a batch whose step maps a cell over the rows (a batched RNN layer) as a
    map over the rows of one-row recurrences, where the cell's weights fit where the target pins
    weights (`pinnable` elements; taken as an LSTM's four gate blocks of h x (h + f) for a state
    of h and an input of f elements). The rows never meet, so each row runs all its steps with
    its state on chip, and the weights stay pinned: brainwave's LSTM(256) at batch 64 keeps its
    matrix unit busy (2.46 M cycles, 3.03 M stepping the batch). Where the weights stream, every
    step of every row would wait on its own for the state before its store (VTA's 1024-wide
    LSTM and GRU ran 4-7% slower row by row, though the cost model, which does not see that
    wait, had them a hair cheaper), while a step of the whole batch waits once for all rows."""
    a = "algorithmic"

    def ex_rows(rng, state_pair: bool = False):
        k, rows, steps = pick(rng, 1, 3), pick(rng, 1, 3), pick(rng, 1, 3)
        v, p = vec(k), tp(vec(k), vec(k))
        if not state_pair:
            s, cell = v, comp(T("VVTanh", v), T("VVAdd", p))
        else:  # an LSTM-like state (h, c): (tanh(h + x), c + x)
            s = p
            q = tp(s, v)
            h, c, x = comp(T("Fst", s), T("Fst", q)), comp(T("Snd", s), T("Fst", q)), T("Snd", q)
            cell = T("Fork", comp(T("VVTanh", v), T("VVAdd", p), T("Fork", h, x)), comp(T("VVAdd", p), T("Fork", c, x)))
        step = comp(T("Map", cell, rows), T("Zip", tp(T("TA", s, rows), mat(rows, k))))
        return T("Fold", step, tp(T("TA", s, rows), T("TA", mat(rows, k), steps)))

    x = "(TA (TS d) f)"
    rewrites = []
    for s in ("(TA (TS d) h)", "(TP (TA (TS d) h) (TA (TS d) h))"):
        pair = f"(TP (TA {s} b) (TA (TA {x} b) n))"
        rewrites.append(rewrite(
            f"(Fold (Comp (Map g b) (Zip (TP (TA {s} b) (TA {x} b)))) {pair})",
            f"(Comp (Map (Fold g (TP {s} (TA {x} n))) b) (Comp (Zip (TP (TA {s} b) (TA (TA {x} n) b))) "
            f"(Fork (Fst {pair}) (Comp (Transpose (TA (TA {x} b) n)) (Snd {pair})))))",
            a, [f"(<= (* 4 (* h (+ h f))) {pinnable})"]))
    return Rule("fold-map-interchange", a, tuple(rewrites),
                f"a state of h elements (or a pair of them) and an input row of f, with 4 h (h + f) weights "
                f"at most {pinnable}",
                "Fold(Map(g) . Zip) = Map(Fold(g)) . Zip . (Id x Transpose): stepping every row of a batch at "
                "once = running each row's recurrence alone (the rows of the state and of each step's input "
                "meet only their own)", ex_rows, lambda rng: ex_rows(rng, state_pair=True))


def _reduce_map_to_fold(resident: int) -> Rule:
    """A reduction of computed vectors too many to hold on chip together (more than `resident`
    elements) as a Fold that consumes each vector as it is computed. Only then: unguarded, it
    added 79% e-nodes to AlexNet conv2 on VTA, and with tochip-hoist-from-fold over those Folds
    that saturation hit its time limit."""
    a = "algorithmic"

    def ex_reduce_map(rng):
        n, k = pick(rng, 1, 4), pick(rng, 1, 4)
        m = resident // n + pick(rng, 1, 3)
        op = sorted(REDUCTION_IDENTITY)[pick(rng, 0, len(REDUCTION_IDENTITY) - 1)]
        product = T("Comp", T("MVMul", tp(mat(n, k), vec(k))),
                    T("Fork", T("Const", var("W", mat(n, k)), vec(k)), T("Id", vec(k))))
        return comp(T("Reduce", T(op, tp(vec(n), vec(n))), T("TA", vec(n), m)), T("Map", product, m))

    v = "(TA s k)"
    # the Map's length is not named twice (see map-fusion): the two lengths are equal by typing
    rewrites = tuple(r for op, unit in sorted(REDUCTION_IDENTITY.items()) for r in chain_rewrites(
        [f"(Reduce ({op} (TP {v} {v})) (TA {v} n))", "(Map g m)"],
        [f"(Fold (Comp ({op} (TP {v} {v})) (Fork (Fst (TP {v} b)) (Comp g (Snd (TP {v} b))))) (TP {v} (TA b n)))",
         f"(Fork (Const (Fill {unit!r} {v}) (TA b n)) (Id (TA b n)))"], a, ["(= b (fin g))", f"(> (* n k) {resident})"]))
    return Rule("reduce-map-to-fold", a, rewrites,
                f"operator VVAdd, VVMul or VVMax (it has an identity element); the n vectors of k elements reduced "
                f"more than fit on chip together (n k > {resident})",
                "Reduce f . Map g = Fold(f . (Id x g)) from f's identity: the reduction consumes each vector as it "
                "is computed, so the mapped array is never held whole (Lift's reduceSeq-map fusion; a GEMM's "
                "partial products over a contraction too long for the chip)", ex_reduce_map)


def tiling_rules(tile_sizes: tuple[int, ...], resident: int = 1 << 20, pinnable: int = 1 << 20,
                 banded: int | None = None) -> list[Rule]:
    """Tiling rules and the tiled algebra for each tile size, and reductions streamed when their
    vectors or moved operands do not fit together; `resident` is how many result elements, and
    `pinnable` how many weight elements, the target can hold on chip at once, `banded` how many
    elements of a GEMM's rows and results (resident when not given)."""
    rules: list[Rule] = tiled_algebra_rules(tile_sizes)
    for n in sorted(set(tile_sizes)):
        rules += _tiling(n, resident if banded is None else banded, pinnable) + [_merge_row_blocks(n)]
    rules += [_reduce_map_to_fold(resident), _reduce_accumulator_on_chip(resident), fold_map_interchange(pinnable)]
    return rules


def algorithmic_rules(tile_sizes: tuple[int, ...], resident: int = 1 << 20, pinnable: int = 1 << 20) -> list[Rule]:
    """Every algorithmic rule: the common ones and the tiling rules of these sizes."""
    return common_algorithmic_rules() + tiling_rules(tile_sizes, resident, pinnable)


def staging_rules(staged: dict[str, str], native: int) -> list[Rule]:
    """For each memory loaded from another on-chip memory (`staged`: memory -> the memory it is
    loaded from), its load as the two moves it is made of, so that the first one (from DRAM into
    the staging memory) can leave a loop or be pinned at setup while the second runs per use (a
    systolic mesh's weight blocks preloaded from weights kept in the scratchpad)."""
    if not staged:
        return []
    a = "algorithmic"
    # matched inside compositions, never bare: a bare move's e-class holding a composition would
    # let compose-assoc subsume every composition that starts with that move
    t = f"(TA (TA s {native}) {native})"
    rewrites = tuple(r for space, source in sorted(staged.items()) for r in (
        rewrite(f'(Comp (ToChip "{space}" {t}) g)', f'(Comp (Restage "{space}" {t}) (Comp (ToChip "{source}" {t}) g))', a),
        rewrite(f'(Comp f (ToChip "{space}" {t}))', f'(Comp f (Comp (Restage "{space}" {t}) (ToChip "{source}" {t})))', a)))

    def ex_staged(rng, space: str = sorted(staged)[0]):
        move = T("ToChip", space, mat(native, native))
        tile = T("Comp", T("Map", T("VVRelu", vec(native)), native), T("Comp", move, T("Split", native, vec(native * native))))
        return T("Map", tile, pick(rng, 1, 3))

    pairs = ", ".join(f"{space} from {source}" for space, source in sorted(staged.items()))
    return [Rule("tochip-staged", a, rewrites, f"the memory is loaded from another on-chip memory ({pairs})",
                 "ToChip(m) = Restage(m) . ToChip(s) where m is loaded from s: a load through a staging memory "
                 "is a move into it and a move on from it", ex_staged)]
