"""Hand-written vendor lowerings: each target's fixed library template, without the e-graph.

A vendor library maps a layer by one fixed loop nest per target; it does not search. Here the
device-level program term is built directly in Python from that template (no rewriting), then
generated and simulated like liftsat's own programs. A layer stack is covered when it is one
GEMM: `Linear` or `MatMul` (any batch; DeepBench's a_t/b_t as the frontend stores them), a
`Conv2d` through the im2col matrix the host lays out (the frontend's stencil, flattened per
window), each optionally followed by one ReLU/Tanh/Sigmoid fused into the write-out; or one
activation on its own. Sizes that are not a multiple of the native size are padded by the host.

The GEMM template, for rows in bands of R (inputs [M][K], weights [O][K] in N x N tiles):

    for each band of R rows:            read the band's input vectors on chip once
      for each output tile j:
        for each input tile k:          the weight tile (j, k): pinned, or moved on chip here
          for each row r of the band:   one matrix-vector product
        accumulate the k products; add the bias tile j; activate
      write the band's outputs

Per target (`TEMPLATES`): the band size, one row or as many rows as the memories hold. Weights
that fit on chip are pinned there at deployment (where the target keeps weights), like
liftsat's; others are streamed, each output tile's row of weight tiles loaded when it starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from egraph_rules.hardware_rules import DeviceOp
from egraph_rules.ir import T, Term, comp, fout, numel, shape_of, ta, tensor_type, tp, ty
from frontend.layers import ACTIVATIONS, Model, bind, build_model, parse_window
from frontend.spatial import Stages, flatten_window, to_hwc, windows
from hwmodels.codegen import generate
from hwmodels.isa import Program
from hwmodels.target import Target
from liftsat.api import run_checked
from liftsat.targets import get_target


class VendorUnsupported(ValueError):
    """No vendor template covers this layer stack on this target."""


@dataclass(frozen=True)
class Template:
    """A target's fixed GEMM template: rows per band (0: as many as the memories hold; weights
    that fit on chip are pinned there when the target keeps weights); `doc` names the vendor
    schedule it follows."""

    band: int
    doc: str


#: the vendor template of each built-in target
TEMPLATES: dict[str, Template] = {
    "brainwave": Template(1, "BrainWave firmware FC: per input row, per output tile: read the row's input tiles, "
                          "mv_mul each weight tile, accumulate with vv_add, add the bias, activate, write; weights "
                          "pinned in the MRF when they fit, else streamed tile by tile"),
    "systolic": Template(0, "Gemmini tiled weight-stationary loop: per band of rows the accumulator holds, per "
                         "output block: mvin its weight tiles to the scratchpad, then per tile preload it once and "
                         "stream every row of the band through compute; accumulate, add the bias, activate, mvout"),
    "vta": Template(0, "TVM's VTA GEMM schedule, output-stationary over row tiles: per tile of rows the "
                    "accumulator holds, per output block: GEMM over the input blocks into the accumulator, then "
                    "ALU bias and activation, STORE; weights kept in the weight buffer when they fit"),
    "snowflake": Template(1, "Snowflake vector-MAC tiling: per map trace row, per row of 16 x 16 weight blocks: "
                          "MAC traces over the input blocks, VMOV-accumulate, bias, activation, TMOV; weights kept in "
                          "the weights buffer when they fit"),
    "cpu": Template(0, "blocked GEMM loop (BLIS-style): a panel of rows that fits the cache, per W-wide column "
                    "block, the W x W FMA micro-kernel over K, then bias and activation; weights kept in the cache "
                    "when they fit"),
}


@dataclass(frozen=True)
class Gemm:
    """A layer stack as one GEMM: the program's input value, the host layout that makes it the
    [M][K] rows (None: it is already), weights [O][K], bias [O] (or None), the activation fused
    into the write-out (an IR op name, or None), and the views that make the [M][O] result the
    model's output (None: it is already, row-major)."""

    inp: Term
    rows: Term | None
    weight: Term
    bias: Term | None
    act: str | None
    post: Term | None


@dataclass(frozen=True)
class Ops:
    """The target's device ops a template uses: matrix-vector product, vector add and the
    activations in the product's result memory."""

    mv: DeviceOp
    add: DeviceOp
    acts: dict[str, DeviceOp]

    @classmethod
    def of(cls, target: Target) -> Ops:
        ops = target.device_ops()
        mv = next((o for o in ops if o.meaning.op == "MVMul"), None)
        if mv is None:
            raise VendorUnsupported(f"{target.name} has no matrix-vector product for a vendor template")
        res = mv.result_space
        add = next((o for o in ops if o.meaning.op == "VVAdd" and o.operand_spaces == (res, res)), None)
        if add is None:
            raise VendorUnsupported(f"{target.name} has no vector add in {res} for a vendor template")
        acts = {o.meaning.op: o for o in ops if len(o.operand_spaces) == 1 and o.operand_spaces[0] == res}
        return cls(mv, add, acts)


@dataclass(frozen=True)
class Plan:
    """What a template chose for one layer: rows per band, bands, where the weights live
    (pinned, streamed, or none), and the vendor schedule it follows."""

    band: int
    bands: int
    weights: str
    schedule: str


def _where(model: Model) -> str:
    return " ".join(str(s) for s in model.layers)


def as_gemm(model: Model) -> Gemm | None:
    """The model as one GEMM (None: a single activation, the elementwise template);
    VendorUnsupported for stacks no template covers."""
    names = [s.name for s in model.layers]
    inp = model.term.args[1]
    act = None
    if len(names) == 2 and names[1] in ACTIVATIONS:
        act = ACTIVATIONS[names[1]][0]
    elif len(names) == 1 and names[0] in ACTIVATIONS:
        return None
    elif len(names) != 1:
        raise VendorUnsupported(f"{_where(model)}: vendor templates cover one Linear, MatMul or Conv2d, "
                                f"optionally followed by ReLU, Tanh or Sigmoid, or one activation alone")
    linear = next((n for n in model.term.walk() if n.op in ("Linear", "LinearNB")), None)
    bias = linear.args[1] if linear is not None and linear.op == "Linear" else None
    if names[0] == "MatMul":  # a bias-free Linear layer over the rows of op(A)
        return Gemm(inp, None, linear.args[0], None, None, None)
    if names[0] == "Linear" and len(model.input_shape) == 2:
        rows = T("Split", numel(ty(inp)), ty(inp)) if model.input_shape[0] == 1 else None
        return Gemm(inp, rows, linear.args[0], bias, act, None)
    if names[0] == "Conv2d" and linear is not None:  # a depthwise convolution has no Linear
        rows, post = _im2col(model, shape_of(ty(linear.args[0]))[0])
        return Gemm(inp, rows, linear.args[0], bias, act, post)
    raise VendorUnsupported(f"{_where(model)}: no vendor template for {model.layers[0]} (templates: Linear, MatMul, "
                            f"dense or grouped Conv2d, activations)")


def _im2col(model: Model, o: int) -> tuple[Term, Term]:
    """The host layout of a Conv2d input as its im2col matrix [N*P][kh*kw*C] (P output pixels per
    image; the frontend's windows, flattened per window), and the views of the [N*P][O] result
    as [N][O][P], which is NCHW."""
    spec = model.layers[0]
    n, c, h, w = model.input_shape
    img = tensor_type(model.dtype, (c, h, w))
    s = windows(Stages(img).then(to_hwc(img)), parse_window(f"layer 1 {spec}", bind(spec)))
    pixels = shape_of(s.t)[0] * shape_of(s.t)[1]
    s.then(T("Join", s.t))
    s.then(T("Map", flatten_window(s.t.args[0]), pixels))
    im2col = comp(*reversed(s.parts))
    if n > 1:
        im2col = T("Comp", T("Join", ta(s.t, n)), T("Map", im2col, n))
    split = T("Split", pixels, tensor_type(model.dtype, (n * pixels, o)))
    return im2col, T("Comp", T("Map", T("Transpose", tensor_type(model.dtype, (pixels, o))), n), split)


def _rows_that_fit(need: Callable[[int], dict[str, int]], target: Target, most: int) -> int:
    """The most rows per band (at most `most`) whose on-chip needs fit every memory; `need(r)`
    gives the elements each memory holds for r rows, linear in r (0: not even one row fits)."""
    base, per = need(0), need(1)
    rows = most
    for space, used in base.items():
        cap = target.memories[space].capacity // 4
        step = per[space] - used
        if used + step > cap:
            return 0
        if step:
            rows = min(rows, (cap - used) // step)
    return rows


def _balanced(m: int, most: int) -> tuple[int, int]:
    """(rows per band, bands) for m rows in bands of at most `most`, as even as they go."""
    bands = -(-m // most)
    return -(-m // bands), bands


def _gemm_need(ops: Ops, target: Target, kt: int, j: int, bias: bool, act: bool,
               pinned: bool) -> Callable[[int], dict[str, int]]:
    """Elements per memory the GEMM template holds for r rows per band (what codegen allocates):
    the band's inputs; the weights (all tiles when pinned, one output tile's row of them when
    streamed, staged through the memory the weights' memory is loaded from, if any); the bias,
    the products, their sum and the band's results."""
    n = target.native_dim
    (mspace, vspace), rspace = ops.mv.operand_spaces, ops.mv.result_space
    staging = target.memories[mspace].load_from
    weights = (j if pinned else 1) * kt * n * n

    def need(r: int) -> dict[str, int]:
        use = dict.fromkeys(target.memories, 0)
        use[vspace] += r * kt * n
        if staging:
            use[staging] += weights
        use[mspace] += weights if pinned or not staging else n * n
        use[rspace] += (j * n if bias else 0) + (n if bias and act else 0)
        use[rspace] += kt * r * n + (r * n if kt > 1 else 0) + j * r * n
        return use

    return need


def _gemm_term(g: Gemm, target: Target, template: Template, ops: Ops) -> tuple[Term, Plan]:
    """The template's program for a GEMM: rows in bands, weights in N x N tiles (see the module
    docstring), padded by the host to whole tiles."""
    n = target.native_dim
    mspace, rspace = ops.mv.operand_spaces[0], ops.mv.result_space
    act = None
    if g.act is not None:
        act = ops.acts.get(g.act)
        if act is None:
            raise VendorUnsupported(f"{target.name} has no {g.act} in {rspace} to fuse into the write-out")
    s = Stages(ty(g.inp))
    if g.rows is not None:
        s.then(g.rows)
    m, k = shape_of(s.t)
    o = shape_of(ty(g.weight))[0]
    kt, j = -(-k // n), -(-o // n)
    for pinned in (True, False) if target.persistent_weights else (False,):
        most = _rows_that_fit(_gemm_need(ops, target, kt, j, g.bias is not None, act is not None, pinned), target, m)
        if most:
            break
    else:
        raise VendorUnsupported(f"a {m}x{k} by {k}x{o} GEMM does not fit {target.name}'s memories one row at a time")
    rows, bands = _balanced(m, template.band or most)
    mp, kp, op_ = rows * bands, kt * n, j * n
    _pad_matrix(s, mp, kp)
    s.then(T("Map", T("Split", n, s.t.args[0]), mp))
    s.then(T("Split", rows, s.t))  # [bands][rows][kt][n]
    consts = _tiles(g.weight, n, mspace if pinned else None)
    if g.bias is not None:
        b = Stages(ty(g.bias))
        if op_ > o:
            b.then(T("Pad", 0, op_ - o, b.t))
        b.then(T("Split", n, b.t))
        bv = T("App", comp(*reversed(b.parts)), g.bias)
        consts = T("Pair", consts, T("App", T("ToChip", rspace, ty(bv)), bv))
    x_t, c_t = s.t, ty(consts)
    s.then(T("Fork", T("Id", x_t), T("Const", consts, x_t)))
    s.then(T("DistR", s.t))
    stream = None if pinned else (target.memories[mspace].load_from or mspace, mspace)
    s.then(T("Map", _band(x_t.args[0], c_t, ops, stream, act), bands))
    s.then(T("Join", s.t))
    s.then(T("Map", T("Join", s.t.args[0]), mp))
    if mp > m:
        s.then(T("Slice", 0, m, s.t))
    if op_ > o:
        s.then(T("Map", T("Slice", 0, o, s.t.args[0]), m))
    if g.post is not None:
        s.then(g.post)
    plan = Plan(rows, bands, "pinned" if pinned else "streamed", template.doc)
    return T("App", comp(*reversed(s.parts)), g.inp), plan


def _tiles(w: Term, n: int, pin: str | None) -> Term:
    """Weights [O][K] laid out by the host as N x N tiles [O/N][K/N][N][N] (tile (j, k) holds rows
    jN.. and columns kN..), padded with zeros; moved to memory `pin` at setup when given."""
    s = Stages(ty(w))
    o, k = shape_of(s.t)
    op_ = -(-o // n) * n
    _pad_matrix(s, op_, -(-k // n) * n)
    s.then(T("Split", n, s.t))  # [j][n][kp]
    s.then(T("Map", T("Map", T("Split", n, s.t.args[0].args[0]), n), op_ // n))  # [j][n][kt][n]
    s.then(T("Map", T("Transpose", s.t.args[0]), op_ // n))  # [j][kt][n][n]
    tiles = T("App", comp(*reversed(s.parts)), w)
    return tiles if pin is None else T("App", T("ToChip", pin, ty(tiles)), tiles)


def _pad_matrix(s: Stages, rows: int, cols: int) -> None:
    """Pad the matrix s makes with zero rows and columns up to rows x cols (a host layout)."""
    m, k = shape_of(s.t)
    if rows > m:
        s.then(T("Pad", 0, rows - m, s.t))
    if cols > k:
        s.then(T("Map", T("Pad", 0, cols - k, s.t.args[0]), rows))


def _band(band_t: Term, c_t: Term, ops: Ops, stream: tuple[str, str] | None, act: DeviceOp | None) -> Term:
    """One band of rows [rows][kt][n] with the constants (tiles, or (tiles, bias)): read the band
    on chip, per output tile j the products, their sum, bias and activation, then write the
    band's [rows][j][n] results."""
    pair_t = tp(band_t, c_t)
    xs = comp(T("Transpose", band_t), T("ToChip", ops.mv.operand_spaces[1], band_t), T("Fst", pair_t))
    wb = T("Snd", pair_t) if c_t.op != "TP" else T("Comp", T("Zip", c_t), T("Snd", pair_t))
    xs_t, wb_t = fout(xs), fout(wb)
    per_j = _output_tile(wb_t.args[0], xs_t, ops, stream, act)
    rn_t, j = xs_t.args[0], wb_t.args[1]
    back = T("Transpose", ta(rn_t, j))
    return comp(T("ToOutput", fout(back)), back, T("Map", per_j, j), T("DistR", tp(wb_t, xs_t)), T("Fork", wb, xs))


def _output_tile(jt: Term, xs_t: Term, ops: Ops, stream: tuple[str, str] | None, act: DeviceOp | None) -> Term:
    """(tiles of output tile j [kt][n][n], or (those, bias tile j)), band on chip [kt][rows][n])
    -> [rows][n]: per input tile k, the tile times every row of the band; the kt products summed;
    bias added and activation applied per row. Streamed weights (`stream`: the memory tile row j
    is loaded into, then the one a tile is moved to from there, if another) are loaded per output
    tile, all its kt tiles at once, so that their loads overlap."""
    in_t = tp(jt, xs_t)
    biased = jt.op == "TP"
    w_j = T("Comp", T("Fst", jt), T("Fst", in_t)) if biased else T("Fst", in_t)
    wj_t = fout(w_j)
    kt, tile_t = wj_t.args[1], wj_t.args[0]
    if stream is not None:
        w_j = T("Comp", T("ToChip", stream[0], wj_t), w_j)
    rn_t = xs_t.args[0]
    rows, vec = rn_t.args[1], rn_t.args[0]
    kin = tp(tile_t, rn_t)
    tile = T("Fst", kin)
    if stream is not None and stream[1] != stream[0]:
        tile = T("Comp", T("Restage", stream[1], tile_t), tile)
    mv_in = tp(vec, tile_t)
    mv = T("Comp", ops.mv.term, T("Fork", T("Snd", mv_in), T("Fst", mv_in)))
    per_k = comp(T("Map", mv, rows), T("DistR", tp(rn_t, tile_t)), T("Fork", T("Snd", kin), tile))
    prods = comp(T("Map", per_k, kt), T("Zip", tp(wj_t, xs_t)), T("Fork", w_j, T("Snd", in_t)))
    if kt > 1:
        add_rows = T("Comp", T("Map", ops.add.term, rows), T("Zip", tp(rn_t, rn_t)))
        acc = T("Comp", T("Reduce", add_rows, ta(rn_t, kt)), prods)
    else:
        acc = T("Comp", T("Join", ta(rn_t, 1)), prods)
    if biased:
        epi = ops.add.term if act is None else T("Comp", act.term, ops.add.term)
        bias_j = T("Comp", T("Snd", jt), T("Fst", in_t))
        return comp(T("Map", epi, rows), T("DistR", tp(rn_t, vec)), T("Fork", acc, bias_j))
    return acc if act is None else T("Comp", T("Map", act.term, rows), acc)


#: the schedule of one activation on its own, the same on every target
ELEMENTWISE = "elementwise: per band of native vectors the activation's memory holds: load, activate, write"


def _elementwise_term(model: Model, target: Target) -> tuple[Term, Plan]:
    """One activation on its own: the input flattened and padded to native vectors, in bands
    that fit the activation's memory (loaded and its results kept there): load, activate, write."""
    name = model.layers[0].name
    op = next((o for o in target.device_ops() if o.meaning.op == ACTIVATIONS[name][0]), None)
    if op is None:
        raise VendorUnsupported(f"{_where(model)}: {target.name} has no {name} instruction")
    n, space = target.native_dim, op.operand_spaces[0]
    inp = model.term.args[1]
    s = Stages(ty(inp))
    while len(shape_of(s.t)) > 1:
        s.then(T("Join", s.t))
    e = shape_of(s.t)[0]
    vecs = -(-e // n)
    rows, bands = _balanced(vecs, max(1, target.memories[space].capacity // 4 // (2 * n)))
    if rows * bands * n > e:
        s.then(T("Pad", 0, rows * bands * n - e, s.t))
    s.then(T("Split", n, s.t))
    s.then(T("Split", rows, s.t))
    band_t = s.t.args[0]
    s.then(T("Map", comp(T("ToOutput", band_t), T("Map", op.term, rows), T("ToChip", space, band_t)), bands))
    s.then(T("Join", s.t))
    s.then(T("Join", s.t))
    if rows * bands * n > e:
        s.then(T("Slice", 0, e, s.t))
    return T("App", comp(*reversed(s.parts)), inp), Plan(rows, bands, "none", ELEMENTWISE)


def vendor_program(model: Model, target: Target) -> tuple[Term, Plan]:
    """The target's vendor template applied to a model: its device-level program term and
    what the template chose; VendorUnsupported when no template covers it."""
    template = TEMPLATES.get(target.name)
    if template is None:
        raise VendorUnsupported(f"no vendor template for target {target.name} (built-in targets only: "
                                f"{', '.join(TEMPLATES)})")
    try:
        g = as_gemm(model)
    except VendorUnsupported as exc:
        raise VendorUnsupported(f"{exc}, on {target.name}") from None
    if g is None:
        return _elementwise_term(model, target)
    return _gemm_term(g, target, template, Ops.of(target))


@dataclass
class VendorResult:
    """A vendor template's program for a layer stack on a target, simulated and checked."""

    target: str
    plan: Plan
    term: Term
    program: Program
    cycles: int
    setup_cycles: int
    ops: dict[str, int]
    max_abs_error: float
    max_rel_error: float


def vendor(layers: list[str], input_shape: tuple[int, ...], target: str | Target, *, seed: int = 0,
           functional: bool = True) -> VendorResult:
    """Compile a layer stack by the target's vendor template (no e-graph), generate, simulate
    and (functional) check it against numpy; VendorUnsupported when no template covers it."""
    tgt = target if isinstance(target, Target) else get_target(target)
    model = build_model(layers, tuple(input_shape), seed=seed, values=functional)
    term, plan = vendor_program(model, tgt)
    program = generate(term, tgt)
    timing, _, abs_err, rel_err = run_checked(program, model, tgt, functional)
    return VendorResult(tgt.name, plan, term, program, timing.cycles, timing.setup_cycles, program.histogram(),
                        abs_err, rel_err)
