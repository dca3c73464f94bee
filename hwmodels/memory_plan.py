"""Lifetime-based placement of on-chip buffers. Codegen lays every buffer out after the one
before; when they do not all fit, buffers whose lifetimes in the program do not overlap share
memory (a recurrent step's temporaries, the stages of a stack), as a register allocator would."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, replace

from hwmodels.isa import Affine, Block, Loop, Operand, Program, map_operands


@dataclass(frozen=True)
class Buffer:
    """An on-chip buffer as codegen laid it out: `size` elements from `start` of `space`."""

    space: str
    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size


class PlanError(RuntimeError):
    """An operand touches on-chip memory outside every buffer codegen laid out."""


@dataclass
class _Lifetime:
    first: int
    last: int
    loops: set[int]
    across: set[int]


def lifetimes(program: Program, buffers: list[Buffer], spans: dict[Buffer, int] | None = None,
              stored_live: bool = False) -> dict[Buffer, tuple[int, int]]:
    """The live range, in instruction positions (setup first, then the body), of each region
    the program accesses: a buffer, or adjacent buffers one operand reaches across (a whole
    vector written into a shorter row at a buffer's end) and that so move together. A region
    used inside a loop and outside it is live over the whole loop; one the setup writes (a
    pinned constant) is live over the whole program; one with a buffer in `spans` is live over
    the whole loop of the variable it maps to (a Fold's double buffers); with `stored_live`, one a
    store in a loop reads is live over the whole outermost loop around that store (codegen moves
    a loop's trailing stores behind the next iteration's leading part, at every level of a nest,
    `defer_stores`, which must then not overwrite what they read)."""
    order = sorted(buffers, key=lambda b: (b.space, b.start))
    keys = [(b.space, b.start) for b in order]
    spaces = {b.space for b in order}
    accesses: list[tuple[int, int, int, tuple[int, ...], int | None]] = []
    loops: dict[int, tuple[int, int]] = {}
    by_var: dict[int, int] = {}
    pos = 0

    def visit(op: Operand, stack: tuple[tuple[int, int, int], ...], across: int | None) -> None:
        if op.space not in spaces:
            return
        lo, hi = _extent(op, {var: count for _, var, count in stack})
        i, j = _holder(keys, op.space, lo), _holder(keys, op.space, hi - 1)
        if i < 0 or order[i].space != op.space or hi > order[j].end:
            raise PlanError(f"{op} is outside the buffers codegen laid out in {op.space}")
        accesses.append((i, j, pos, tuple(lid for lid, _, _ in stack), across))

    def walk(block: Block, stack: tuple[tuple[int, int, int], ...]) -> None:
        nonlocal pos
        for item in block:
            if isinstance(item, Loop):
                lid, begin = len(loops), pos
                loops[lid] = (begin, begin)
                by_var[item.var] = lid
                walk(item.body, (*stack, (lid, item.var, item.count)))
                loops[lid] = (begin, max(begin, pos - 1))
            else:
                stored = stored_live and item.kind == "store" and bool(stack)
                visit(item.dst, stack, None)
                for op in item.srcs:
                    visit(op, stack, stack[0][0] if stored else None)
                pos += 1

    walk(program.setup, ())
    setup_end = pos
    walk(program.body, ())
    group = list(range(len(order)))          # each buffer's first buffer of its region
    for lo, hi, *_ in sorted(accesses):
        for k in range(lo + 1, hi + 1):
            group[k] = group[lo]
    regions: dict[int, Buffer] = {}
    for k, b in enumerate(order):
        head = order[group[k]]
        regions[group[k]] = Buffer(b.space, head.start, b.end - head.start)
    seen: dict[int, _Lifetime] = {}
    for lo, _, at, stack, across in accesses:
        life = seen.setdefault(group[lo], _Lifetime(at, at, set(), set()))
        life.first, life.last = min(life.first, at), max(life.last, at)
        life.loops.update(stack)
        if across is not None:
            life.across.add(across)
    out = {}
    spanned = {group[k]: by_var[spans[b]] for k, b in enumerate(order) if spans and b in spans and spans[b] in by_var}
    for g, life in seen.items():
        first, last = (0, pos - 1) if life.first < setup_end else (life.first, life.last)
        for lid in life.across | ({spanned[g]} if g in spanned else set()):
            first, last = min(first, loops[lid][0]), max(last, loops[lid][1])
        changed = True
        while changed:
            changed = False
            for lid in life.loops:
                begin, end = loops[lid]
                if (first < begin or last > end) and (begin < first or end > last):
                    first, last, changed = min(first, begin), max(last, end), True
        out[regions[g]] = (first, last)
    return out


def innermost(program: Program, spans: dict[Buffer, int]) -> dict[Buffer, int]:
    """The part of `spans` (buffers by a loop variable, see `lifetimes`) whose loops hold no
    loop of another variable of `spans`: the innermost Folds' double buffers."""
    variables, outer = set(spans.values()), set()

    def walk(block: Block, around: tuple[int, ...]) -> None:
        for item in block:
            if isinstance(item, Loop):
                mine = item.var in variables
                if mine:
                    outer.update(around)
                walk(item.body, (*around, item.var) if mine else around)

    walk(program.setup, ())
    walk(program.body, ())
    return {b: var for b, var in spans.items() if var not in outer}


def _holder(keys: list[tuple[str, int]], space: str, addr: int) -> int:
    """The index of the last (space, start) in sorted keys at or before addr of space."""
    return bisect.bisect_right(keys, (space, addr)) - 1


def _extent(op: Operand, counts: dict[int, int]) -> tuple[int, int]:
    """The addresses [lo, hi) an operand touches over all iterations of its loops."""
    lo = hi = op.addr.base
    for var, coeff in op.addr.terms:
        span = coeff * (counts[var] - 1)
        lo, hi = lo + min(0, span), hi + max(0, span)
    return lo, hi + (op.rows - 1) * op.stride + op.cols


def place(program: Program, buffers: list[Buffer], spans: dict[Buffer, int] | None = None,
          largest_first: bool = False, stored_live: bool = False) -> tuple[dict[Buffer, int], dict[str, int]]:
    """A new start for every region the program accesses such that regions live at the same time
    do not overlap (first fit, in order of first use, or of size from the largest: small regions
    placed among large ones in order of use can leave gaps no large one fits, as in a GRU(2816)
    step on systolic, 16,896 elements placed in order of use, 14,080, its live peak, largest
    first), and the memory each space then needs (`spans`, `stored_live`: see `lifetimes`)."""
    return _first_fit(lifetimes(program, buffers, spans, stored_live), buffers, largest_first)


def live_peak(live: dict[Buffer, tuple[int, int]]) -> dict[str, int]:
    """The most elements of each space the regions live at one time hold: no placement of them
    (by these or by longer lifetimes) needs less."""
    events: dict[str, list[tuple[int, int]]] = {}
    for region, (first, last) in live.items():
        events.setdefault(region.space, []).extend(((first, region.size), (last + 1, -region.size)))
    out = {}
    for space, evs in events.items():
        held = top = 0
        for _, size in sorted(evs):  # at one instant, regions dead from it leave before others come
            held += size
            top = max(top, held)
        out[space] = top
    return out


def plans(program: Program, buffers: list[Buffer], tries: list[dict[Buffer, int]],
          stored_live: bool = False) -> Iterator[tuple[dict[Buffer, int], dict[str, int]]]:
    """`place`'s plans for each of `tries` (spans) in order of use, then for each largest first,
    lazily: a caller stops at the first that fits, and each try's lifetimes are worked out once."""
    lives: dict[int, dict[Buffer, tuple[int, int]]] = {}
    for largest_first in (False, True):
        for k, spans in enumerate(tries):
            if k not in lives:
                lives[k] = lifetimes(program, buffers, spans, stored_live)
            yield _first_fit(lives[k], buffers, largest_first)


def _first_fit(live: dict[Buffer, tuple[int, int]], buffers: list[Buffer],
               largest_first: bool) -> tuple[dict[Buffer, int], dict[str, int]]:
    """`place` given the regions' lifetimes."""
    placed: dict[str, list[tuple[int, int, int, int]]] = {}
    where: dict[Buffer, int] = {}
    needs: dict[str, int] = {b.space: 0 for b in buffers}
    order = (lambda r: (-r.size, *live[r], r.space, r.start)) if largest_first else (
        lambda r: (*live[r], -r.size, r.space, r.start))
    for region in sorted(live, key=order):
        first, last = live[region]
        busy = sorted((a, a + n) for a, n, f, la in placed.get(region.space, ()) if f <= last and first <= la)
        addr = 0
        for a, end in busy:
            if addr + region.size <= a:
                break
            addr = max(addr, end)
        where[region] = addr
        placed.setdefault(region.space, []).append((addr, region.size, first, last))
        needs[region.space] = max(needs[region.space], addr + region.size)
    return where, needs


def memory_sizes(program: Program, needs: dict[str, int]) -> dict[str, int]:
    """The elements each space holds once its regions are placed as `needs` says (a space no
    region was placed in keeps its size)."""
    return {**program.memory_sizes, **{s: max(n, 1) for s, n in needs.items()}}


def relocate(program: Program, where: dict[Buffer, int], needs: dict[str, int]) -> Program:
    """The program with every on-chip operand moved with its region to the region's new start,
    and each space sized to what it needs."""
    keys = sorted((r.space, r.start) for r in where)
    shift = {(r.space, r.start): at - r.start for r, at in where.items()}

    def move(op: Operand) -> Operand:
        if op.space not in needs:
            return op
        region = keys[_holder(keys, op.space, op.addr.base)]
        return replace(op, addr=Affine(op.addr.base + shift[region], op.addr.terms))

    return replace(program, setup=map_operands(program.setup, move), body=map_operands(program.body, move),
                   memory_sizes=memory_sizes(program, needs))
