"""Code generation: an extracted term becomes an instruction program for a target.

Values are strided views over flat memories, so re-indexing (Split, Join, Transpose, Slice,
Slide and maps of these) costs no instruction; a re-indexing of host data that no strided view
can express (an im2col matrix of overlapping windows) is laid out by the host instead. Map and
Reduce become loops whose addresses are affine in the loop counters; device ops become
instructions; ToChip becomes loads (in the setup block when it moves a constant: pinned
weights), ToOutput becomes stores. The host lays out inputs and
weights in DRAM, padded where the term pads them. Memory is allocated with capacity checks.
Computed rows shorter than a native vector keep room for a whole vector each; a Join that
flattens them packs them densely through DRAM (`Codegen.packed`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import cached_property

from egraph_rules.ir import T, Term, comp, fin, fout, lifted, shape_of, ta, ty
from hwmodels.isa import Affine, Block, HostBuffer, Instr, Loop, Operand, Program, loop_var
from hwmodels.memory_plan import Buffer, PlanError, innermost, lifetimes, live_peak, memory_sizes, plans, relocate
from hwmodels.step_order import Span, state_independent_first
from hwmodels.store_deferral import defer_stores
from hwmodels.target import OpSpec, Target, whole_units


class CodegenError(RuntimeError):
    """The term cannot be turned into a program for this target (layout, capacity, op)."""


class InputError(CodegenError):
    """f cannot be applied to the value it gets, wherever its result goes: compiling it again
    into another destination fails the same way, so it is not retried."""


class CapacityError(CodegenError):
    """The program needs more of an on-chip memory than there is (`per_iteration`: with some
    loads or stored values given a buffer per iteration, `Codegen.per_iteration_buffer`)."""

    def __init__(self, message: str, per_iteration: bool = False):
        super().__init__(message)
        self.per_iteration = per_iteration


#: what `Codegen.shared` holds for a function and value not compiled yet
_UNCOMPILED = object()


@dataclass(frozen=True)
class Buf:
    """A strided tensor view in a flat memory. For data the host provides, `host` is the value
    term of the whole host array and `hidx` the loop indices taken into it: this view is
    host[hidx...]. Both are None/() for data the program computes."""

    space: str
    addr: Affine
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    host: Term | None = None
    hidx: tuple[Affine, ...] = ()

    def __hash__(self) -> int:
        return self._hash

    @cached_property
    def _hash(self) -> int:
        """Computed once: a value is hashed on every lookup of codegen's cache (`Codegen.apply`)."""
        return hash((self.space, self.addr, self.shape, self.strides, self.host, self.hidx))


@dataclass(frozen=True)
class PairV:
    a: object
    b: object


@dataclass(frozen=True)
class ArrP:
    """An array of n pairs: element i is (a[i] or a, b[i] or b) as ia, ib say."""

    a: object
    b: object
    ia: bool
    ib: bool
    n: int


def _bufs(v: object) -> Iterator[Buf]:
    """The buffers a value (a buffer or nested pairs of them) is held in."""
    if isinstance(v, PairV):
        yield from _bufs(v.a)
        yield from _bufs(v.b)
    elif isinstance(v, Buf):
        yield v


def _span(v: Buf) -> Span:
    """The addresses a buffer covers in one iteration of the loops around it (`step_order`)."""
    reach = [(n - 1) * s for n, s in zip(v.shape, v.strides)]
    lo = v.addr.base + sum(min(0, r) for r in reach)
    return v.space, lo, v.addr.base + sum(max(0, r) for r in reach) + 1, Affine(0, v.addr.terms)


def _index(v: object, i: Affine) -> object:
    if isinstance(v, Buf):
        if not v.shape:
            raise CodegenError("indexing a scalar")
        host, hidx = (v.host, (*v.hidx, i)) if v.host is not None else (None, ())
        return Buf(v.space, v.addr + i.scaled(v.strides[0]), v.shape[1:], v.strides[1:], host, hidx)
    if isinstance(v, ArrP):
        return PairV(_index(v.a, i) if v.ia else v.a, _index(v.b, i) if v.ib else v.b)
    raise CodegenError(f"cannot index {type(v).__name__}")


def _view(f: Term, v: Buf, dim: int) -> Buf:
    """Apply a re-indexing function at dimension `dim` of a buffer view."""
    if not isinstance(v, Buf):
        raise CodegenError(f"{f.op} re-indexes an array held in one buffer, not a pair or an array of pairs")
    sh, st = list(v.shape), list(v.strides)
    op, a = f.op, f.args
    if op == "Split":
        k = a[0]
        sh[dim : dim + 1] = [sh[dim] // k, k]
        st[dim : dim + 1] = [st[dim] * k, st[dim]]
    elif op == "Join":
        if sh[dim + 1] == 1 or sh[dim] == 1:  # a length-1 dimension has no stride of its own
            st[dim : dim + 2] = [st[dim] if sh[dim + 1] == 1 else st[dim + 1]]
        elif st[dim] == sh[dim + 1] * st[dim + 1]:
            st[dim : dim + 2] = [st[dim + 1]]
        else:
            raise CodegenError("Join of a non-contiguous view needs a copy")
        sh[dim : dim + 2] = [sh[dim] * sh[dim + 1]]
    elif op == "Transpose":
        sh[dim], sh[dim + 1] = sh[dim + 1], sh[dim]
        st[dim], st[dim + 1] = st[dim + 1], st[dim]
    elif op == "Slide":
        size, step = a[0], a[1]
        sh[dim : dim + 1] = [(sh[dim] - size) // step + 1, size]
        st[dim : dim + 1] = [st[dim] * step, st[dim]]
    elif op == "Slice":
        addr = v.addr + a[0] * st[dim]
        sh[dim] = a[1]
        return Buf(v.space, addr, tuple(sh), tuple(st), *_host(f, v, dim))
    elif op == "Map":
        return _view(a[0], v, dim + 1)
    elif op == "Comp":
        return _view(a[0], _view(a[1], v, dim), dim)
    elif op == "Id":
        return v
    else:
        raise CodegenError(f"{op} is not a re-indexing of one array")
    return Buf(v.space, v.addr, tuple(sh), tuple(st), *_host(f, v, dim))


def _in_order(v: Buf) -> bool:
    """Whether a view's dimensions are in memory order: each (of more than one element, not
    broadcast) has a stride no smaller than the ones inside it."""
    strides = [s for n, s in zip(v.shape, v.strides) if n > 1 and s]
    return strides == sorted(strides, reverse=True)


def _host(f: Term, v: Buf, dim: int) -> tuple[Term | None, tuple[Affine, ...]]:
    """The host-side whole-array value of a view of host data, and the indices into it."""
    if v.host is None:
        return None, ()
    return Term("App", (lifted(ty(v.host), len(v.hidx) + dim, lambda _: f), v.host)), v.hidx


def _stages(f: Term) -> list[Term]:
    """The stages of a composition however it is nested, the one applied last first."""
    return _stages(f.args[0]) + _stages(f.args[1]) if f.op == "Comp" else [f]


def _core(f: Term) -> tuple[list[Term], Term, Term | None]:
    """f as views . head . pre: its trailing re-indexings (the one applied last first), the stage
    that produces its result, and what runs before that stage (None: nothing)."""
    stages = _stages(f)
    k = 0
    while k < len(stages) - 1 and _is_view(stages[k]):
        k += 1
    rest = stages[k + 1 :]
    return stages[:k], stages[k], comp(*rest) if rest else None


def _stacked(v: object) -> object:
    """A pair (or array of pairs) held in two equally laid out DRAM buffers, as one buffer whose
    first dimension picks the part (the result of a recurrence that keeps its (h, c) state in
    DRAM); anything else unchanged."""
    if isinstance(v, ArrP) and v.ia and v.ib:
        v = PairV(v.a, v.b)
    if not (isinstance(v, PairV) and isinstance(v.a, Buf) and isinstance(v.b, Buf)):
        return v
    a, b = v.a, v.b
    if {a.space, b.space} != {"dram"} or (a.shape, a.strides, a.addr.terms) != (b.shape, b.strides, b.addr.terms):
        return v
    return Buf("dram", a.addr, (2, *a.shape), (b.addr.base - a.addr.base, *a.strides))


def _holds_pairs(t: Term) -> bool:
    """Whether a type has a pair inside."""
    return t.op == "TP" or (t.op == "TA" and _holds_pairs(t.args[0]))


def _index_store(store: object, i: Affine) -> object:
    """Element i of a storage (a buffer, or a pair of storages)."""
    if isinstance(store, PairV):
        return PairV(_index_store(store.a, i), _index_store(store.b, i))
    return _index(store, i)


def _as_array(v: object, n: int) -> object:
    """A pair of arrays of n elements as the array of n pairs it stores."""
    if isinstance(v, PairV):
        return ArrP(_as_array(v.a, n), _as_array(v.b, n), True, True, n)
    return v


def _inverse(view: Term) -> Term | None:
    """The re-indexing that undoes `view` (Split, Join, Transpose, maps and compositions of
    these); None for others."""
    op, a = view.op, view.args
    if op == "Join":
        return T("Split", a[0].args[0].args[1], fout(view))
    if op == "Split":
        return T("Join", fout(view))
    if op == "Transpose":
        return T("Transpose", fout(view))
    if op == "Map":
        inner = _inverse(a[0])
        return None if inner is None else T("Map", inner, a[1])
    if op == "Comp":
        first, second = _inverse(a[1]), _inverse(a[0])
        return None if first is None or second is None else T("Comp", first, second)
    return None


def _undoable_first(view: Term) -> tuple[Term | None, Term | None]:
    """`view` as (rest, first), rest . first, where `first` is the largest re-indexing applied
    first that `_inverse` undoes (None: none is; rest None: all of it is): a Slice of joined
    blocks cannot be laid out for as a whole, but its Join can (each Map of a composition is
    taken apart)."""
    if _inverse(view) is not None:
        return None, view
    if view.op == "Map":
        rest, first = _undoable_first(view.args[0])
        return (None if rest is None else T("Map", rest, view.args[1]),
                None if first is None else T("Map", first, view.args[1]))
    if view.op == "Comp":
        rest, first = _undoable_first(view.args[1])
        if first is None:
            return view, None
        if rest is None:
            outer, also = _undoable_first(view.args[0])
            return outer, first if also is None else T("Comp", also, first)
        return T("Comp", view.args[0], rest), first
    return view, None


def _through_inverse(views: list[Term], dest: Buf, dim: int, what: str) -> Buf:
    """Where a core must write (at dimension dim) for `views` to show its results in dest; `what`
    names the term whose views they are, for the error when one cannot be undone."""
    for view in views:
        core = _before(view, dest, dim)
        if core is None:
            raise CodegenError(f"{what} ends in {view.op} and cannot write into a given destination")
        dest = core
    return dest


def _before(view: Term, dest: Buf, dim: int) -> Buf | None:
    """Where a value must be written (at dimension dim) for `view` of it to be dest: through the
    view's inverse, or, for Slice(0, k) of rows whose room in dest holds the whole row, the
    whole row (None: neither)."""
    op, a = view.op, view.args
    if op == "Map":
        return _before(a[0], dest, dim + 1)
    if op == "Comp":
        outer = _before(a[0], dest, dim)
        return None if outer is None else _before(a[1], outer, dim)
    if op == "Slice":
        return None if dim == 0 else _widened_slice(view, dest, dim, dest.strides[dim - 1])
    inverse = _inverse(view)
    return None if inverse is None else _view(inverse, dest, dim)


def _widened_slice(view: Term, dest: Buf, dim: int, room: int) -> Buf | None:
    """For view = Slice(0, k) of rows of `full` elements written along dimension dim of dest (its
    last, of unit stride): dest with whole rows there, where each row has `room` for `full`
    elements (None: it has not, or the Slice does not start at 0)."""
    start, k, full = view.args[0], view.args[1], view.args[2].args[1]
    fits = (start == 0 and dest.host is None and dim == len(dest.shape) - 1 and dest.strides[dim] == 1
            and dest.shape[dim] == k and full <= room)
    return replace(dest, shape=(*dest.shape[:dim], full)) if fits else None


def _peel_views(body: Term) -> tuple[list[Term], Term]:
    """A loop body split into its trailing re-indexings (applied last, listed first) and the core
    before them; a nested loop's trailing re-indexings come out as maps of them, so every level
    of a loop nest writes its core results in place."""
    views, head, pre = _core(body)
    if head.op == "Map":
        inner_views, inner_core = _peel_views(head.args[0])
        m = head.args[1]
        views = views + [Term("Map", (v, m)) for v in inner_views]
        head = Term("Map", (inner_core, m))
    return views, head if pre is None else Term("Comp", (head, pre))


def _fuse_pair_maps(stages: list[Term]) -> list[Term]:
    """Stages (applied last first) with every Map whose body makes a pair (a Fork) fused into the
    Map that consumes it: an array of pairs has no layout in memory, one pair per iteration does."""
    out = list(stages)
    for i in range(len(out) - 1, 0, -1):
        f, g = out[i - 1], out[i]
        if f.op == "Map" and g.op == "Map" and g.args[0].op == "Fork" and f.args[1] == g.args[1]:
            out[i - 1 : i + 1] = [T("Map", comp(f.args[0], g.args[0]), f.args[1])]
    return out


def _unchained(f: Term, done: dict[Term, Term] | None = None) -> Term:
    """f with each device op whose store is chained to it (`DevOut`) as the op, then the store:
    the instructions they compile to, and the form every pass of codegen knows."""
    done = {} if done is None else done
    if f not in done:
        if f.op == "DevOut":
            name, t, u = f.args
            done[f] = T("Comp", T("ToOutput", u), T("Dev", name, t, u))
        else:
            args = tuple(_unchained(a, done) if isinstance(a, Term) else a for a in f.args)
            done[f] = f if args == f.args else T(f.op, *args)
    return done[f]


def _stores(f: Term) -> bool:
    """Whether f moves its result to DRAM (a stage of it does)."""
    return any(s.op in ("ToOutput", "ToDram") for s in _stages(f))


def _chip_ops(f: Term, times: int = 1) -> list[tuple[Term, int]] | None:
    """The device ops (Dev) of f, each with how many times one application of f runs it; None
    where f does more than compute on chip with device ops, pairs, constants and re-indexings
    (a move, a reduction, a pad)."""
    if f.op == "Dev":
        return [(f, times)]
    if f.op not in ("Comp", "Fork", "Map"):
        return [] if f.op in ("Const", "Zip", "Id", "Fst", "Snd") or _is_view(f) else None
    out: list[tuple[Term, int]] = []
    for a in f.args:
        if isinstance(a, Term) and a.sort == "F":
            got = _chip_ops(a, times * f.args[1] if f.op == "Map" else times)
            if got is None:
                return None
            out += got
    return out


def _layout_only(f: Term, pad: bool) -> bool:
    """Whether f only re-indexes its input (Split, Join, Transpose, Slice, Slide, maps and
    compositions of these) or, with pad, also pads it (with zeros or a fill value): what the
    host can apply when it lays out data."""
    if f.op == "Comp":
        return _layout_only(f.args[0], pad) and _layout_only(f.args[1], pad)
    if f.op == "Map":
        return _layout_only(f.args[0], pad)
    return f.op in ("Split", "Join", "Transpose", "Slice", "Slide", "Id") or (pad and f.op in ("Pad", "PadWith"))


def _dense(space: str, base: int, shape: tuple[int, ...]) -> Buf:
    """A row-major buffer of the given shape at base."""
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return Buf(space, Affine(base), tuple(shape), tuple(reversed(strides)))


def _is_view(f: Term) -> bool:
    return _layout_only(f, pad=False)


def _host_layout(f: Term) -> bool:
    return _layout_only(f, pad=True)


class Codegen:
    """Compiles one term for one target."""

    def __init__(self, target: Target, bounded: bool = True, per_iteration: bool = True,
                 stored_per_iteration: bool = True, state_first: bool = False):
        """bounded: every buffer gets memory of its own, and the running total must fit; when
        not, only each buffer alone must fit (buffers then share memory by lifetime).
        per_iteration: see `per_iteration_buffer` and `fission`; stored_per_iteration: whether
        values each iteration stores get them too (`stored_buffer`); state_first: whether a
        Fold step's work that does not need the state issues first (`fold_step`)."""
        self.t = target
        self.bounded = bounded
        self.per_iteration = per_iteration
        self.stored_per_iteration = stored_per_iteration
        self.state_first = state_first
        self.buffers: list[Buffer] = []
        self.n = target.native_dim
        self.ops: dict[str, OpSpec] = target.op_by_name
        self.alloc: dict[str, int] = {"dram": 0, **{s: 0 for s in target.memories}}
        self.host: list[HostBuffer] = []
        self.setup: Block = []
        self.block: Block = []
        self.nvars = 0
        self.data_cache: dict[Term, object] = {}
        #: contiguous host layouts of strided host views, by the viewed expression
        self.host_copies: dict[Term, Buf] = {}
        #: buffers of a Fold's two steps per trip, by the innermost trip loop's variable: kept
        #: apart by memory sharing, so that one step's loads fill while the other step works
        self.double: dict[Buffer, int] = {}
        self.shared: dict[tuple[Term, object], object] = {}
        #: the counter and trip count of each Map loop being compiled, innermost last
        self.iterations: list[tuple[Affine, int]] = []
        #: whether some buffer was given one per iteration (`per_iteration_buffer`), or a Map
        #: compiled stage by stage (`fission`)
        self.spread = False
        #: whether some value an iteration stores was given a buffer per iteration
        self.stored_spread = False

    # ------------------------------------------------------------ memory

    def row_room(self, k: int) -> int:
        """Slots an on-chip row of k elements has: whole native vectors, so a device op may write
        a full vector into it without touching the next row."""
        return -(-k // self.n) * self.n

    def allocate(self, space: str, shape: tuple[int, ...]) -> Buf:
        """A buffer for computed values; each row has room for whole native vectors."""
        if shape:
            return replace(self._allocate(space, (*shape[:-1], self.row_room(shape[-1]))), shape=shape)
        return self._allocate(space, shape)

    def _allocate(self, space: str, shape: tuple[int, ...]) -> Buf:
        size = math.prod(shape)
        padded = -(-size // self.n) * self.n
        base = self.alloc[space]
        self.alloc[space] = base + padded
        if space != "dram":
            self.buffers.append(Buffer(space, base, padded))
            cap = self.room(space)
            need = self.alloc[space] if self.bounded else padded
            if need > cap:
                raise CapacityError(f"{space} overflow: the program needs {need * 4} bytes, capacity {cap * 4}")
        return _dense(space, base, shape)

    def room(self, space: str) -> int:
        """The elements an on-chip memory holds."""
        return self.t.memories[space].capacity // 4

    def load_buffer(self, space: str, v: Buf, bandwidth: int, latency: int) -> Buf:
        """The buffer a load of v into space fills. Inside a Map whose counter v's address
        follows, a load whose transfer takes at least its latency gets a buffer per iteration
        where all of them fit: the DMA then streams such loads back to back, as the cost model
        assumes, instead of waiting for the previous iteration's readers, which an in-order
        unit busy with other work can hold back (a GRU's gate sums on VTA). A shorter load
        keeps one buffer, whose round trip per iteration the cost model charges. bandwidth and
        latency: the load's path (DRAM's, or its staging memory's)."""
        if math.prod(v.shape) * 4 >= latency * bandwidth and self.iterations \
                and dict(self.iterations[-1][0].terms).keys() & dict(v.addr.terms).keys():
            spread = self.per_iteration_buffer(space, v.shape)
            if spread is not None:
                return spread
        return self.allocate(space, v.shape)

    def per_iteration_buffer(self, space: str, shape: tuple[int, ...]) -> Buf | None:
        """Inside a Map, a buffer of this shape per iteration of the innermost one, indexed by its
        counter, when per-iteration buffers are on and all of them fit (None otherwise): an
        iteration then never waits for the previous one to be done with the buffer."""
        if not (self.per_iteration and self.iterations):
            return None
        i, n = self.iterations[-1]
        size = n * math.prod(shape[:-1]) * self.row_room(shape[-1])
        taken = self.alloc[space] if self.bounded else 0
        if taken + size > self.room(space):
            return None
        self.spread = True
        return _index(self.allocate(space, (n, *shape)), i)

    def stored_buffer(self, f: Term, v: object) -> Buf | None:
        """Where f, whose result a Map's iteration stores (ToOutput, ToDram), computes it: a buffer
        per iteration where they fit (`per_iteration_buffer`), so that the next iteration does not
        wait for the store to read it, which waits behind every transfer queued on the DMA before
        it (loads hoisted out of the loop); None: f's own buffer."""
        if not self.stored_per_iteration or _is_view(f) or fout(f).op != "TA":
            return None
        space = self.result_space(f, v.space if isinstance(v, Buf) else None)
        if space is None or space == "dram":
            return None
        buf = self.per_iteration_buffer(space, shape_of(fout(f)))
        self.stored_spread = self.stored_spread or buf is not None
        return buf

    def host_copy(self, v: Buf) -> Buf:
        """A contiguous host layout of a (strided) view of host data, indexed like the view (one
        per viewed expression, however many loads read it)."""
        if v.host not in self.host_copies:
            self.host_copies[v.host] = self.host_buffer(v.host, ty(v.host), f"contiguous {_describe(v.host)}")
        out: object = self.host_copies[v.host]
        for i in v.hidx:
            out = _index(out, i)
        return out

    def _loadable(self, v: Buf, tile: bool) -> bool:
        """Whether the DMA can move this view in native vectors or tiles (unit-stride rows)."""
        rows_ok = len(v.shape) >= (2 if tile else 1) and v.strides[-1] == 1
        return rows_ok and (not tile or v.strides[-2] >= v.shape[-1])

    def before_view(self, view: Term, dest: Buf | None) -> Buf | None:
        """The buffer a value must be written to so that `view` of it is dest (None: no such
        buffer, or view is not a re-indexing). Slice(0, k) of a longer vector writes the whole
        vector into the row, which has room for whole native vectors."""
        if dest is None or dest.host is not None:
            return None
        op, a = view.op, view.args
        if op == "Slice":
            return _widened_slice(view, dest, 0, self.row_room(dest.shape[0])) if len(dest.shape) == 1 else None
        inverse = _inverse(view)
        if inverse is None:
            return None
        try:
            return _view(inverse, dest, 0)
        except CodegenError:
            return None

    def host_buffer(self, expr: Term, t: Term, what: str) -> Buf:
        shape = shape_of(t)
        buf = self._allocate("dram", shape)
        self.host.append(HostBuffer(buf.addr.base, math.prod(shape), expr, what))
        return replace(buf, host=expr)

    # ------------------------------------------------------------ emission

    def emit(self, ins: Instr) -> None:
        self.block.append(ins)

    def loop(self, count: int, body) -> None:
        """Emit `body(counter)` inside a loop of `count` iterations (inline when count is 1). When
        the body fails, emission is back in the enclosing block, so a caller that catches the
        error and compiles something else emits it there."""
        if count == 1:
            body(Affine(0))
            return
        var = self.nvars
        self.nvars += 1
        outer, self.block = self.block, []
        try:
            body(loop_var(var))
        finally:
            inner, self.block = self.block, outer
        self.block.append(Loop(var, count, inner))

    def transfer(self, kind: str, mnemonic: str, dst: Buf, src: Buf, tile: bool,
                 by: tuple[str, int, int] | None = None) -> None:
        """Move src to dst (same logical shape) in native vectors or tiles, loops kept; `by` is
        (unit, bytes per cycle, latency), by default the DMA at DRAM's rate."""
        n = self.n
        unit_dims = 2 if tile else 1
        if len(src.shape) < unit_dims or src.shape != dst.shape:
            raise CodegenError(f"cannot move shape {src.shape} into {dst.shape} with {mnemonic}")
        if src.strides[-1] != 1 or dst.strides[-1] != 1:
            raise CodegenError(f"{mnemonic} needs unit-stride rows")
        if not whole_units(src.shape, n, tile):
            raise CodegenError(f"{mnemonic} moves {n}-element units; shape {src.shape} is not a multiple")
        rows = n if tile else 1
        nbytes = rows * n * 4
        unit, bandwidth, latency = by or ("dma", self.t.dram.bandwidth, self.t.dram.latency)
        occ = math.ceil(nbytes / bandwidth)
        outer = list(src.shape[:-unit_dims])
        counts = outer + ([src.shape[-2] // n] if tile else []) + [src.shape[-1] // n]
        s_steps = list(src.strides[:-unit_dims]) + ([src.strides[-2] * n] if tile else []) + [n]
        d_steps = list(dst.strides[:-unit_dims]) + ([dst.strides[-2] * n] if tile else []) + [n]
        s_row = src.strides[-2] if tile else n
        d_row = dst.strides[-2] if tile else n

        def nest(level: int, s_addr: Affine, d_addr: Affine) -> None:
            if level == len(counts):
                self.emit(Instr(mnemonic, kind, unit, occ, occ + latency,
                                Operand(dst.space, d_addr, rows, n, d_row), (Operand(src.space, s_addr, rows, n, s_row),)))
                return
            self.loop(counts[level], lambda i: nest(level + 1, s_addr + i.scaled(s_steps[level]),
                                                     d_addr + i.scaled(d_steps[level])))

        nest(0, src.addr, dst.addr)

    # ------------------------------------------------------------ compilation

    def laid_out_for_view(self, f: Term, v: object) -> object:
        """f = view . g applied to v, for a view `_inverse` undoes: a strided view of g's result,
        or, where the view has no strides over it, g's result laid out for the view."""
        a = f.args
        saved = self.snapshot()
        inner: object = None
        try:
            inner = self.apply(a[1], v)
            return _view(a[0], inner, 0)
        except (CapacityError, InputError):  # laid out for the view, it would fail as well
            raise
        except CodegenError:  # not a strided view of the result: lay the result out for it
            self.restore(saved)
            space = self.result_space(a[1], v.space if isinstance(v, Buf) else None)
            if space is None:
                raise
            out = self.allocate(space, shape_of(fout(f)))
            try:
                return self._apply(f, v, out)
            except CodegenError:
                if not self.packable(inner):
                    raise
                self.restore(saved)  # rows with room for whole vectors, which the view joins
                return _view(a[0], self.packed(self.apply(a[1], v)), 0)

    def result_space(self, f: Term, src: str | None = None) -> str | None:
        """The memory f's result lives in, given the memory of its input (None: unknown)."""
        op, a = f.op, f.args
        if op == "Dev":
            return self.ops[a[0]].op.result_space if a[0] in self.ops else None
        if op in ("ToChip", "Restage"):
            return a[0]
        if op in ("ToOutput", "ToDram"):
            return "dram"
        if op == "Pad":
            return src
        if op == "Comp":
            inner = self.result_space(a[1], src)
            return inner if _is_view(a[0]) else self.result_space(a[0], inner)
        if op in ("Map", "Reduce", "Fold"):
            return self.result_space(a[0], src)
        return None

    def data(self, e: Term) -> object:
        """A value term (weights, inputs, constants): laid out by the host, pinned by setup."""
        if e in self.data_cache:
            return self.data_cache[e]
        if e.op == "Var":
            t = e.args[1]
            v: object = self.host_buffer(e, t, f"{e.args[0]} {shape_of(t)}")
        elif e.op == "Pair":
            v = PairV(self.data(e.args[0]), self.data(e.args[1]))
        elif e.op == "Mask":
            v = self.host_buffer(e, e.args[1], f"mask of {e.args[0]} ones")
        elif e.op == "Fill":
            v = self.host_buffer(e, e.args[1], f"{e.args[0]} everywhere")
        elif e.op == "App":
            outer, self.block = self.block, self.setup
            try:
                v = self.apply(e.args[0], self.data(e.args[1]))
            finally:
                self.block = outer
        else:
            raise CodegenError(f"{e.op} is not a value")
        self.data_cache[e] = v
        return v

    def apply(self, f: Term, v: object, dest: Buf | None = None) -> object:
        """Compile f applied to v (into dest when given); the same function applied to the same
        value is compiled once (the extracted term is a tree, the program shares)."""
        if dest is not None:
            return self._apply(f, v, dest)
        key = (f, v)  # one lookup: hashing the key (a pair's or an array of pairs' fields) is most of it
        out = self.shared.get(key, _UNCOMPILED)
        if out is _UNCOMPILED:
            out = self.shared[key] = self._apply(f, v, None)
        return out

    def _apply(self, f: Term, v: object, dest: Buf | None) -> object:  # noqa: C901 - a table
        op, a = f.op, f.args
        if _is_view(f) and isinstance(v, Buf):
            try:
                return _view(f, v, 0)
            except CodegenError:
                if v.host is None:
                    raise
        if _host_layout(f) and isinstance(v, Buf) and v.host is not None:
            e = Term("App", (lifted(ty(v.host), len(v.hidx), lambda _: f), v.host))
            out: object = self.host_buffer(e, ty(e), _describe(e))
            for i in v.hidx:
                out = _index(out, i)
            return out
        if op == "Comp" and a[0].op == "Const":  # a constant ignores its input
            return self.data(a[0].args[0])
        if op == "Comp" and dest is None and _is_view(a[0]):
            rest, first = _undoable_first(a[0])
            if first is not None and rest is not None:  # lay the result out for the part that can be
                return self.apply(rest, self.apply(T("Comp", first, a[1]), v))
            if first is not None:
                return self.laid_out_for_view(f, v)
        if op == "Comp":
            inner_dest = self.before_view(a[0], dest)
            if inner_dest is not None:
                # the result before the re-indexing goes where the re-indexing puts it in place
                return _view(a[0], self.apply(a[1], v, inner_dest), 0)
            stages = _stages(f)
            fused = self.rows_streamed(_fuse_pair_maps(stages))
            if fused != stages:
                return self.apply(comp(*fused), v, dest)
            if dest is None and stages[0].op in ("ToOutput", "ToDram") and stages[1].op == "Map" \
                    and not _is_view(stages[1]):
                inner = self.apply(comp(*stages[2:]), v) if len(stages) > 2 else v
                saved = self.snapshot()
                try:
                    return self.apply(stages[0], self.apply(stages[1], inner))
                except CapacityError:
                    self.restore(saved)
                    return self.stream_out(stages[1], inner)
            if a[0].op in ("ToOutput", "ToDram"):
                saved = self.snapshot()
                staged = self.stored_buffer(a[1], v)
                if staged is not None:
                    try:
                        return self.apply(a[0], self.apply(a[1], v, staged), dest)
                    except (CapacityError, InputError):  # `generate` recompiles an overflow; f fails anywhere
                        raise
                    except CodegenError:  # f does not compute into a given buffer
                        self.restore(saved)
            return self.apply(a[0], self.apply(a[1], v), dest)
        if op == "Id":
            return v
        if op == "Fork":
            return PairV(self.apply(a[0], v), self.apply(a[1], v))
        if op in ("Fst", "Snd"):
            if not isinstance(v, PairV):
                raise CodegenError(f"{op} of a non-pair")
            return v.a if op == "Fst" else v.b
        if op == "Const":
            return self.data(a[0])
        if op == "Zip":
            return ArrP(v.a, v.b, True, True, a[0].args[0].args[1])
        if op == "DistR":
            return ArrP(v.a, v.b, True, False, a[0].args[0].args[1])
        if op == "Pad":
            return self.pad_on_chip(f, v, dest)
        if op == "PadWith":
            raise InputError(f"PadWith(fill {a[2]}) of a computed value: only the host pads with a fill value "
                             f"(on chip, padding is a mask multiply, which makes zeros)")
        if op == "Map" and dest is None and fout(a[0]).op == "TP":
            return self.place(f, v, self.storage(f))
        if op == "Map":
            return self.map(a[0], a[1], v, dest)
        if op == "Fold":
            if dest is not None and not isinstance(dest, Buf):
                raise CodegenError("a Fold returning a pair cannot write into a given destination")
            core = None if dest is None else _through_inverse(_core(a[0])[0], dest, 0, "a Fold whose step")
            return self.fold(a[0], a[1].args[1].args[1], v, core)
        if op == "Reduce":
            return self.reduce(a[0], a[1].args[1], v, dest)
        if op == "Dev":
            return self.device(f, v, dest)
        if op == "ToChip":
            return self.to_chip(a[0], v, dest)
        if op == "Restage":
            return self.restage(a[0], v, dest)
        if op in ("ToOutput", "ToDram"):
            return self.to_dram(v, dest)
        raise InputError(f"{op} cannot run on {self.t.name}")

    def map(self, body: Term, n: int, v: object, dest: Buf | None) -> Buf:
        """A loop; the body's re-indexing tail is applied to the whole result array instead,
        so every iteration writes its core result in place (into dest seen through the tail's
        inverse, when a destination is given)."""
        views, core = _peel_views(body)
        if views and dest is not None:  # the core writes where the views will show its results: dest
            dest = _through_inverse(views, dest, 1, "a Map whose body")
        out = self.fission(core, n, v, dest)
        if out is None:
            out = self.one_loop(core, n, v, dest)
        for view in reversed(views):
            out = _view(view, out, 1)
        return out

    def one_loop(self, core: Term, n: int, v: object, dest: Buf | None) -> Buf:
        """A Map's core as one loop, every iteration writing its result in place in dest (a
        fresh buffer where none is given)."""
        if dest is None:
            space = self.result_space(core, v.space if isinstance(v, Buf) else None)
            if space is None:
                raise CodegenError(f"cannot tell where the results of Map({core.op}) live")
            dest = self.allocate(space, (n, *shape_of(fout(core))))
        out = dest

        def one(i: Affine) -> None:
            self.iterations.append((i, n))
            try:
                got = self.apply(core, _index(v, i), _index(out, i))
            finally:
                self.iterations.pop()
            if got != _index(out, i):
                raise CodegenError(f"Map body {core.op} does not produce its result in place")

        self.loop(n, one)
        return out

    def fission(self, core: Term, n: int, v: object, dest: Buf | None) -> object | None:
        """A Map whose body is a chain of device ops (a Pad of rows computed on chip among them:
        a multiply by a mask, `pad_on_chip`), one of which reads the result of the one before it
        on the same unit, compiled stage by stage: a loop per op, its results for every
        iteration in a buffer (where per-iteration buffers are on and fit). A unit runs its
        instructions in order, so in one loop each iteration's second op would hold the unit
        for the first op's latency (VTA's ALU: 46 cycles past its occupancy; brainwave's vector
        unit 8 after a ReLU's padding); stage by stage, the ops of the other iterations fill that
        wait. None: not such a Map, or it does not compile stage by stage (its buffers do not
        fit)."""
        stages = _stages(core)
        specs = [self.ops.get(s.args[0]) if s.op == "Dev" else self.masker(v) if s.op == "Pad" else None
                 for s in stages]
        if not (self.per_iteration and n > 1 and len(stages) > 1 and None not in specs):
            return None
        if not any(a.unit == b.unit and b.latency > b.occupancy for a, b in zip(specs, specs[1:])):
            return None
        saved = self.snapshot()
        try:
            out = self.apply(comp(*(T("Map", s, n) for s in stages)), v, dest)
        except CodegenError:  # the buffers do not fit (or the stages do not compile apart): one loop
            self.restore(saved)
            return None
        self.spread = True
        return out

    def rows_streamed(self, stages: list[Term]) -> list[Term]:
        """Stages (applied last first) with a Map of device ops on chip, split into rows that a
        Map then stores row by row, computed in that Map's loop instead (Split k . Map f =
        Map (Map f) . Split k, then map fusion), where a row's instructions outlast their
        latency: the first row is stored once it is done, not once every row is, and the
        unit running f waits no longer than in one loop over all rows."""
        for i in range(len(stages) - 2):
            g, split, f = stages[i : i + 3]
            if not (g.op == "Map" and split.op == "Split" and f.op == "Map" and _stores(g.args[0])):
                continue
            k, m = split.args[0], f.args[1]
            specs = [(self.ops.get(d.args[0]), times) for d, times in _chip_ops(f.args[0]) or ()]
            if not specs or any(spec is None for spec, _ in specs):
                continue
            if k * sum(spec.occupancy * times for spec, times in specs) < max(spec.latency for spec, _ in specs):
                continue
            rows = [T("Map", comp(g.args[0], T("Map", f.args[0], k)), m // k), T("Split", k, ta(fin(f.args[0]), m))]
            return stages[:i] + rows + stages[i + 3 :]
        return stages

    def masker(self, v: object) -> OpSpec | None:
        """The device op `pad_on_chip` pads the vectors of v with: the target's vector multiply
        where its results land, else its matrix-vector multiply (by the mask as a diagonal); None
        where v is not computed on chip or the target has neither."""
        if not (isinstance(v, Buf) and v.host is None and v.space != "dram"):
            return None
        ops = [o for o in self.t.ops if o.op.result_space == v.space]
        return next((o for meaning in ("VVMul", "MVMul") for o in ops if o.op.meaning.op == meaning), None)

    @contextmanager
    def unshared(self) -> Iterator[None]:
        """Values compiled inside are not shared afterwards: they read a buffer that is later
        overwritten (an accumulator, a recurrent state)."""
        before = dict(self.shared)
        try:
            yield
        finally:
            self.shared = before

    def snapshot(self) -> tuple:
        """The compilation state, to go back to when an attempt does not fit."""
        return (dict(self.alloc), len(self.host), len(self.setup), len(self.block), self.nvars,
                dict(self.data_cache), dict(self.host_copies), dict(self.double), dict(self.shared),
                len(self.buffers))

    def restore(self, saved: tuple) -> None:
        """Forget everything compiled since `saved` was taken (within the same block); the same
        snapshot may be restored again."""
        alloc, hosts, setups, instrs, self.nvars, cache, copies, double, shared, buffers = saved
        self.alloc, self.data_cache, self.host_copies, self.shared = dict(alloc), dict(cache), dict(copies), dict(shared)
        self.double = dict(double)
        del self.host[hosts:], self.setup[setups:], self.block[instrs:], self.buffers[buffers:]

    def stream_out(self, m: Term, v: object) -> object:
        """ToOutput of a Map whose program does not fit on chip with all its results there: the
        store moves into the loop (as the rule tooutput-into-map does), so each iteration's
        result is written to DRAM as soon as it is computed and on-chip memory holds one (a
        result pair: a buffer per part)."""
        body, n = m.args
        return self.apply(T("Map", T("Comp", T("ToOutput", fout(body)), body), n), v)

    def reduce(self, op: Term, n: int, v: object, dest: Buf | None) -> object:
        if n == 1:
            return _index(v, Affine(0))
        if dest is None:
            space = self.result_space(op, v.space if isinstance(v, Buf) else None)
            if space is None:
                raise CodegenError("cannot tell where a reduction accumulates")
            dest = self.allocate(space, shape_of(fout(op)))
        acc = dest

        def step(a: object, b: object) -> None:
            if self.apply(op, PairV(a, b), acc) != acc:
                raise CodegenError(f"the reduction operator {op.op} does not accumulate in place")

        with self.unshared():  # what is computed from the accumulator is stale once it is updated
            step(_index(v, Affine(0)), _index(v, Affine(1)))
            if n > 2:
                self.loop(n - 2, lambda i: step(acc, _index(v, i + 2)))
        return acc

    def storage(self, f: Term, lead: tuple[int, ...] = ()) -> object:
        """Fresh buffers for the result of f before its trailing re-indexings (a pair of
        storages for a pair), with `lead` outer dimensions (one per enclosing Map)."""
        _, head, _ = _core(f)
        if head.op == "Fork":
            return PairV(self.storage(head.args[0], lead), self.storage(head.args[1], lead))
        if head.op == "Map":
            return self.storage(head.args[0], (*lead, head.args[1]))
        if head.op == "Fold":  # its result is its last step's
            return self.storage(head.args[0], lead)
        space = self.result_space(head)
        if space is None:
            raise CodegenError(f"cannot tell where the results of {head.op} live")
        return self.typed_storage(space, fout(head), lead)

    def typed_storage(self, space: str, t: Term, lead: tuple[int, ...]) -> object:
        """Fresh buffers in space for a value of type t: an array of pairs (a batch of LSTM states
        (h, c) stored whole) as a pair of arrays, a buffer per part."""
        if t.op == "TP":
            return PairV(*(self.typed_storage(space, part, lead) for part in t.args))
        if t.op == "TA" and _holds_pairs(t):
            return self.typed_storage(space, t.args[0], (*lead, t.args[1]))
        return self.allocate(space, (*lead, *shape_of(t)))

    def viewed(self, f: Term, store: object, depth: int) -> object:
        """The value of f's result whose core is held in store (re-indexed at dimension depth)."""
        views, head, _ = _core(f)
        if head.op == "Fork":
            if depth > 1:
                raise CodegenError("pairs inside nested Maps are not supported")
            out = PairV(self.viewed(head.args[0], store.a, depth), self.viewed(head.args[1], store.b, depth))
        elif head.op == "Map":
            out = _as_array(self.viewed(head.args[0], store, depth + 1), head.args[1])
        elif head.op == "Fold":
            out = self.viewed(head.args[0], store, depth)
        elif fout(head).op == "TA" and _holds_pairs(fout(head)):  # an array of pairs (`typed_storage`)
            out = _as_array(store, fout(head).args[1])
        else:
            out = store
        for view in reversed(views):
            out = _view(view, out, depth)
        return out

    def place(self, f: Term, v: object, store: object) -> object:
        """Compile f applied to v so that its result, before its trailing re-indexings, is
        written into store (from `storage(f)`); returns the result."""
        _, head, pre = _core(f)
        w = self.apply(pre, v) if pre is not None else v
        if head.op == "Fork":
            self.place(head.args[0], w, store.a)
            self.place(head.args[1], w, store.b)
        elif head.op == "Map":
            self.loop(head.args[1], lambda i: self.place(head.args[0], _index(w, i), _index_store(store, i)))
        elif head.op == "Fold":
            self.fold(head.args[0], head.args[1].args[1].args[1], w, store)
        elif self.apply(head, w, store) != store:
            raise CodegenError(f"{head.op} does not produce its result in place")
        return self.viewed(f, store, 0)

    def fold(self, step: Term, n: int, v: object, dest: Buf | PairV | None) -> object:
        """A loop carrying a state (on chip, or in DRAM when the step ends storing it): the first
        step reads the initial state, then the steps alternate between two state buffers (two
        steps per loop iteration), so no step overwrites the state it reads; a last step runs
        after the loop when n - 1 is odd. Given a destination (a Map's iteration: storage for the
        step's core, `storage`), the last step writes the final state there."""
        if not isinstance(v, PairV):
            raise CodegenError("a Fold applies to a pair (initial state, array)")
        init, xs = v.a, v.b
        if dest is not None and n == 1:
            return self.fold_step(step, PairV(init, _index(xs, Affine(0))), dest)
        first, second = self.storage(step), self.storage(step)
        state = self.fold_step(step, PairV(init, _index(xs, Affine(0))), first)
        looped = n if dest is None else n - 1  # steps into the two state buffers
        pairs, odd = divmod(looped - 1, 2)
        trip = self.nvars if pairs > 1 else None  # the variable of the loop over pairs of steps

        def two(j: Affine) -> None:
            i = j.scaled(2) + 1
            before = len(self.buffers)
            mid = self.fold_step(step, PairV(state, _index(xs, i)), second)
            if self.fold_step(step, PairV(mid, _index(xs, i + 1)), first) != state:
                raise CodegenError("a Fold step does not return its state in the layout it reads")
            if trip is not None:
                for b in self.buffers[before:]:
                    self.double.setdefault(b, trip)

        if pairs:
            self.loop(pairs, two)
        if odd:
            state = self.fold_step(step, PairV(state, _index(xs, Affine(looped - 1))), second)
        if dest is not None:
            state = self.fold_step(step, PairV(state, _index(xs, Affine(n - 1))), dest)
        return state

    def fold_step(self, step: Term, v: PairV, store: object) -> object:
        """One step of a Fold into store; values it computes are not shared with other steps
        (they read a state buffer that later steps overwrite). With state_first, its work that
        does not need the state issues first (`step_order`)."""
        start = len(self.block)
        with self.unshared():
            out = self.place(step, v, store)
        if self.state_first:
            self.block[start:] = state_independent_first(self.block[start:], [_span(b) for b in _bufs(v.a)])
        return out

    def pad_on_chip(self, f: Term, v: object, dest: Buf | None) -> Buf:
        """Zero padding of a computed vector: each native vector of the result is the source's
        vector times a mask (ones where the source has data, zeros in the padding), with the
        target's vector multiply, or its matrix-vector multiply by the mask as a diagonal
        matrix; the masks are constants pinned at setup."""
        left, right, t = f.args
        if not (isinstance(v, Buf) and v.host is None and v.space != "dram" and len(v.shape) == 1
                and v.strides == (1,) and left == 0):
            raise InputError("only a computed vector on chip can be zero padded, and only at its end")
        n, total, native = v.shape[0], v.shape[0] + right, self.n
        if total % native:
            raise InputError(f"padding {n} elements to {total} does not fill whole {native}-element vectors")
        op = self.masker(v)
        if op is None:
            raise InputError(f"{self.t.name} has no vector or matrix-vector multiply in {v.space} to zero padding with")
        by_vector = op.op.meaning.op == "VVMul"
        vec_t = ta(t.args[0], native)
        mask_t, mask_space = (vec_t, v.space) if by_vector else (ta(vec_t, native), op.op.operand_spaces[0])
        out = dest if dest is not None else self.allocate(v.space, (total,))

        def masked(k: Affine, src: Affine, ones: int) -> None:
            mask = self.data(T("App", T("ToChip", mask_space, mask_t), T("Mask", ones, mask_t)))
            vec = Buf(v.space, src, (native,), (1,))
            pair = PairV(vec, mask) if by_vector else PairV(mask, vec)
            self.device(op.op.term, pair, Buf(out.space, out.addr + k.scaled(native), (native,), (1,)))

        full, rest = divmod(n, native)
        if full:
            self.loop(full, lambda i: masked(i, v.addr + i.scaled(native), native))
        if rest:
            masked(Affine(full), v.addr + full * native, rest)
        for k in range(full + (1 if rest else 0), total // native):
            masked(Affine(k), v.addr, 0)
        return out

    def operand(self, v: object, space: str, what: str) -> Operand:
        if not isinstance(v, Buf) or v.space != space:
            where = v.space if isinstance(v, Buf) else type(v).__name__
            raise CodegenError(f"{what} needs its operand in {space}, it is in {where}")
        n = self.n
        if v.shape == (n,) and v.strides == (1,):
            return Operand(space, v.addr, 1, n, n)
        if v.shape == (n, n) and v.strides[1] == 1:
            return Operand(space, v.addr, n, n, v.strides[0])
        raise CodegenError(f"{what}: operand of shape {v.shape}, strides {v.strides} is not a native block")

    def device(self, f: Term, v: object, dest: Buf | None) -> Buf:
        spec = self.ops.get(f.args[0])
        if spec is None:
            raise CodegenError(f"{self.t.name} has no device op {f.args[0]}")
        spaces = spec.op.operand_spaces
        parts = [v] if len(spaces) == 1 else [v.a, v.b] if isinstance(v, PairV) else None
        if parts is None:
            raise CodegenError(f"{spec.mnemonic} takes a pair")
        srcs = tuple(self.operand(p, s, spec.mnemonic) for p, s in zip(parts, spaces))
        out = dest if dest is not None else self.allocate(spec.op.result_space, shape_of(f.args[2]))
        dst = self.operand(out, spec.op.result_space, spec.mnemonic)
        self.emit(Instr(spec.mnemonic, spec.op.meaning.op, spec.unit, spec.occupancy, spec.latency, dst, srcs))
        return out

    def to_chip(self, space: str, v: object, dest: Buf | None) -> object:
        """Move v into `space`: loaded from DRAM (through the staging memory), or from another
        on-chip memory through DRAM. A value already there stays, unless it is a transposed view
        of it (a later Join could not address it): then it is laid out again in order, through
        DRAM."""
        if isinstance(v, PairV):
            return PairV(self.to_chip(space, v.a, None), self.to_chip(space, v.b, None))
        if not isinstance(v, Buf):
            raise CodegenError(f"cannot move a {type(v).__name__} to {space}")
        if v.space == space and _in_order(v):
            return v
        mem = self.t.memories[space]
        source = mem.load_from or "dram"
        if v.space not in ("dram", source) or v.space == space:  # no path (or a transposed view): through DRAM
            v = self.to_dram(v)
        if v.space == "dram" and source != "dram":
            v = self.to_chip(source, v, None)
        if v.space != source:
            raise CodegenError(f"moving data from {v.space} to {space} is not supported")
        if v.host is not None and not self._loadable(v, mem.load_unit == "tile"):
            v = self.host_copy(v)
        by = (mem.loader, mem.bandwidth, mem.latency) if mem.load_from else ("dma", self.t.dram.bandwidth,
                                                                              self.t.dram.latency)
        out = dest if dest is not None else self.load_buffer(space, v, by[1], by[2])
        self.transfer("load", mem.load_mnemonic, out, v, tile=mem.load_unit == "tile", by=by)
        return out

    def restage(self, space: str, v: object, dest: Buf | None) -> object:
        """Move a value already in the memory `space` is loaded from on into `space` (the cost
        model charges only that move, so a value anywhere else is an error, not a detour)."""
        source = self.t.memories[space].load_from
        if not source:
            raise CodegenError(f"Restage to {space}: {self.t.name} loads {space} from DRAM, not from another memory")
        if not isinstance(v, Buf) or v.space != source:
            where = v.space if isinstance(v, Buf) else type(v).__name__
            raise CodegenError(f"Restage to {space} of a value in {where}: it must be in {source}")
        return self.to_chip(space, v, dest)

    def packable(self, v: object) -> bool:
        """Whether v is rows computed on chip, each with room for whole native vectors, laid out
        one after another (what `packed` lays out densely)."""
        if not (isinstance(v, Buf) and v.host is None and v.space != "dram" and len(v.shape) >= 2
                and v.strides[-1] == 1 and v.strides[-2] >= self.row_room(v.shape[-1])):
            return False
        return all(v.strides[d] == v.shape[d + 1] * v.strides[d + 1] for d in range(len(v.shape) - 2))

    def packed(self, v: Buf) -> Buf:
        """The rows of a `packable` value laid out densely. Computed rows shorter than a native
        vector have room for whole vectors, which no view can join; so each row is stored whole
        to DRAM, in order, at the end of the previous row's data (the next rows overwrite its
        padding, and a slack after the last row takes that one's), and the dense rows are
        loaded back."""
        *lead, k = v.shape
        rows, flat = math.prod(lead), self.row_room(math.prod(v.shape))
        staged = self._allocate("dram", (flat + self.row_room(k),))
        self.to_dram(Buf(v.space, v.addr, (rows, k), (v.strides[-2], 1)),
                     replace(staged, shape=(rows, k), strides=(k, 1)))
        back = self.to_chip(v.space, replace(staged, shape=(flat,)), None)
        return replace(_dense(back.space, 0, v.shape), addr=back.addr)

    def to_dram(self, v: object, dest: object = None) -> object:
        """Write a value to DRAM: into dest (an element of a loop's DRAM result, rows with room
        for whole native vectors) or a fresh buffer (a pair of equal shapes as its two rows);
        rows are padded to whole native vectors and the returned view drops the padding; a pair
        with a pair of destinations, part by part."""
        if isinstance(v, PairV) and isinstance(dest, PairV):
            return PairV(self.to_dram(v.a, dest.a), self.to_dram(v.b, dest.b))
        if isinstance(v, PairV):
            parts = (v.a, v.b)
            if not all(isinstance(p, Buf) for p in parts) or v.a.shape != v.b.shape:
                raise CodegenError("only a pair of equally shaped arrays can be written out")
        elif isinstance(v, ArrP) and v.ia and v.ib:
            return self.to_dram(PairV(v.a, v.b), dest)
        elif isinstance(v, Buf):
            if v.space == "dram":
                return v
            parts = (v,)
        else:
            raise CodegenError(f"cannot write a {type(v).__name__} to DRAM")
        shape = parts[0].shape
        padded = (*shape[:-1], self.row_room(shape[-1]))
        if dest is not None and len(parts) == 1:
            self.transfer("store", self.t.store_mnemonic, replace(dest, shape=padded), replace(v, shape=padded),
                          tile=False)
            return dest
        out = self.allocate("dram", (len(parts), *padded))
        for k, part in enumerate(parts):
            dst = _index(out, Affine(k))
            self.transfer("store", self.t.store_mnemonic, dst, replace(part, shape=padded), tile=False)
        view = replace(out, shape=(len(parts), *shape))
        return view if isinstance(v, PairV) else _index(view, Affine(0))


def _describe(e: Term) -> str:
    if e.op == "Var":
        return e.args[0]
    if e.op == "App":
        f = e.args[0]
        params = [str(x) for x in f.args if isinstance(x, (int, float))]
        return f"{f.op}({', '.join(params)}) of {_describe(e.args[1])}"
    return e.op


def generate(term: Term, target: Target) -> Program:
    """Compile an extracted program term (App(F, input)) into a program for the target. Every
    buffer gets memory of its own; when they do not all fit, buffers whose lifetimes do not
    overlap share memory (the program is compiled again without the running total's check),
    a Fold's two steps keeping their buffers apart where that fits too (else only those of the
    innermost Folds, else none), placed in order of first use; where none of those fits, the
    same plans placed largest first. Loads that stream, and values each iteration stores, get a
    buffer per iteration of their Map where it fits (`Codegen.load_buffer`,
    `Codegen.stored_buffer`), and a Map of dependent ops on one unit is compiled stage by stage
    where its intermediate results fit (`Codegen.fission`); a program that then fits no plan is
    compiled again without. Finally each loop's stores wait, where no data flows between them,
    behind the next iteration's loads rather than ahead of them (`defer_stores`), so what a
    loop's stores read is first kept apart from the loop's other buffers (`memory_plan.lifetimes`,
    stored_live): with every buffer per iteration, then without those of stored values, then
    (the plans before this was kept apart) shared with them, then without buffers per iteration
    kept apart, then shared (`_ATTEMPTS`)."""
    if term.op != "App":
        raise CodegenError("a program is a function applied to its input")
    term = _unchained(term)
    compiled: dict[tuple[bool, bool], Program | _Unplaced] = {}
    overflow: CapacityError | None = None
    for spread, stored_live in _ATTEMPTS:
        if spread not in compiled:
            compiled[spread] = _compiled(term, target, *spread)
        full = compiled[True, True]
        if isinstance(full, _Unplaced) and (spread == (False, False) and not full.overflow.per_iteration
                                            or spread == (True, False) and not full.stored_spread):
            continue  # the program with every buffer per iteration had none of these: the same program
        try:
            program = _placed(compiled[spread], target, stored_live)
        except CapacityError as exc:
            overflow = exc
            continue
        return replace(program, body=defer_stores(program.body))
    raise overflow


#: the plans `generate` tries in turn: (buffers per iteration for loads and Maps compiled stage
#: by stage, for stored values too), and whether what a loop's stores read is kept apart
_ATTEMPTS = (((True, True), True), ((True, False), True), ((True, True), False), ((False, False), True),
             ((False, False), False))


@dataclass
class _Unplaced:
    """A program too large for its buffers to have memory of their own: the program compiled for
    sharing memory (None: it does not compile that way), its codegen, the overflow, and whether
    some stored value got a buffer per iteration."""

    program: Program | None
    cg: Codegen
    overflow: CapacityError
    stored_spread: bool

    @cached_property
    def least(self) -> dict[str, int]:
        """The bytes of each space its buffers hold live at once under their shortest lifetimes
        (`memory_plan.live_peak`): no plan needs less, whether or not what stores read is kept
        apart, so it is worked out once for both."""
        return {s: n * 4 for s, n in live_peak(lifetimes(self.program, self.cg.buffers)).items()}


def _compiled(term: Term, target: Target, per_iteration: bool, stored_per_iteration: bool) -> Program | _Unplaced:
    """The program compiled with buffers of their own, or, when they do not fit, compiled for
    sharing memory by lifetime (see `generate`; per_iteration, stored_per_iteration: see
    `Codegen`). With buffers of their own (whose sum does not depend on the order of the
    instructions), a Fold step's work that does not need the state issues first; that keeps
    its results live while the state is worked on, so it is not done where buffers must share
    memory by lifetime (VTA's GRU(2816) at batch 1 lost its plan to one 1.23x slower)."""
    first = Codegen(target, per_iteration=per_iteration, stored_per_iteration=stored_per_iteration, state_first=True)
    try:
        return _generate(term, first)
    except CapacityError as exc:
        overflow = exc
    cg = Codegen(target, bounded=False, per_iteration=per_iteration, stored_per_iteration=stored_per_iteration)
    try:
        laid_out = _generate(term, cg)
    except (CodegenError, PlanError):
        laid_out = None
    overflow.per_iteration = first.spread or cg.spread
    return _Unplaced(laid_out, cg, overflow, first.stored_spread or cg.stored_spread)


def _placed(compiled: Program | _Unplaced, target: Target, stored_live: bool) -> Program:
    """A compiled program, its buffers sharing memory if they must (see `generate`; stored_live:
    see `memory_plan.lifetimes`); CapacityError when no plan fits."""
    if isinstance(compiled, Program):
        return compiled
    laid_out, cg = compiled.program, compiled.cg
    if laid_out is None:
        raise compiled.overflow
    tries: list[dict[Buffer, int]] = []
    try:
        least = compiled.least
        space = next((s for s, mem in target.memories.items() if least.get(s, 0) > mem.capacity), None)
        if space is not None:  # every plan keeps these apart, or more (longer lifetimes)
            raise CapacityError(f"{space} overflow: the program has {least[space]} bytes live at once, capacity "
                                f"{target.memories[space].capacity}", compiled.overflow.per_iteration)
        for spans in (cg.double, innermost(laid_out, cg.double), {}):  # distinct plans, one at a time until one fits
            if spans not in tries:
                tries.append(spans)
        for where, needs in plans(laid_out, cg.buffers, tries, stored_live):
            sizes = memory_sizes(laid_out, needs)
            need = {s: sizes.get(s, 0) * 4 for s in target.memories}
            if all(need[s] <= mem.capacity for s, mem in target.memories.items()):
                return relocate(laid_out, where, needs)
    except PlanError:
        raise compiled.overflow from None
    space = next(s for s, mem in target.memories.items() if need[s] > mem.capacity)
    raise CapacityError(f"{space} overflow: the program needs {need[space]} bytes with buffers sharing memory by "
                        f"lifetime, capacity {target.memories[space].capacity}", compiled.overflow.per_iteration)


def _generate(term: Term, cg: Codegen) -> Program:
    out = _stacked(cg.apply(term.args[0], cg.data(term.args[1])))
    if not isinstance(out, Buf) or out.space != "dram":
        raise CodegenError("the program does not end with its result in DRAM (ToOutput)")
    sizes = {s: max(n, 1) for s, n in cg.alloc.items()}
    return Program(cg.t.name, cg.setup, cg.block, sizes, cg.host, out.addr.base, out.shape, out.strides)
