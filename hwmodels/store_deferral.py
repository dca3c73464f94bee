"""Deferring a loop's stores past the next iteration's loads, where no data flows between them.

A loop whose body loads, computes, then stores its results (a band of a convolution, a row of a
streamed GEMM) queues each iteration's stores on the in-order DMA unit ahead of the next
iteration's loads; the stores wait for the body's last results, so the next loads, and the
compute they feed, wait too. Peeling the first iteration and rotating the body,

    P(0) C(0); for j < n-1: [P(j+1) S(j) C(j+1)]; S(n-1)

(S the body's trailing stores; P the longest leading part of the body that neither writes what
S reads nor reads or writes what S writes, for every j, checked on address intervals, so that
the program computes the same values; C the rest) lets the next iteration's loads, and the
compute that needs nothing S reads, run while this iteration's last results are finished. The
only instructions that change order are S(j) and P(j+1); it is done where P loads something.
Where P ends in a loop and S is a loop of as many iterations (a band's pixels, the band
before's rows), the two become one loop taking turns, so the stores fill the DMA unit's waits.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from itertools import count

from hwmodels.isa import Affine, Block, Instr, Loop, Operand, loop_var, map_operands


def defer_stores(block: Block) -> Block:
    """The block with every loop (innermost first) rotated as above where it is legal."""
    return _deferred(block, {}, count(max(_loop_vars(block), default=-1) + 1))


def _deferred(block: Block, outer: dict[int, int], fresh: Iterator[int]) -> Block:
    """`defer_stores` within loops of these trip counts; peeled copies take counters from `fresh`."""
    out: Block = []
    for item in block:
        if isinstance(item, Loop):
            inner = {**outer, item.var: item.count}
            out += _rotated(Loop(item.var, item.count, _deferred(item.body, inner, fresh)), outer, fresh)
        else:
            out.append(item)
    return out


def _rotated(loop: Loop, outer: dict[int, int], fresh: Iterator[int]) -> Block:
    """The loop peeled and rotated (P, C and S of the module's docstring), or left as it is."""
    body = loop.body
    trail = _run_length(reversed(body), "store")
    if loop.count < 2 or not trail or trail == len(body):
        return [loop]
    stores = body[len(body) - trail:]
    lead = 0
    spans = list(footprints(stores, {}))
    while lead < len(body) - trail and _independent(loop, [body[lead]], spans, outer):
        lead += 1
    head, rest = body[:lead], body[lead:len(body) - trail]
    if not any(ins.kind == "load" for item in head for ins in _instrs(item)):
        return [loop]
    v, n = loop.var, loop.count

    def peeled(items: Block, j: int) -> Block:
        return _copy(items, v, j, fresh)

    if n == 2:
        middle = _interleaved(peeled(head, 1), peeled(stores, 0), rest) + peeled(rest, 1)
    else:
        middle = [Loop(v, n - 1, _interleaved(_copy(head, v, 1), stores, rest) + _copy(rest, v, 1))]
    return [*peeled(head + rest, 0), *middle, *peeled(stores, n - 1)]


def _interleaved(head: Block, stores: Block, rest: Block) -> Block:
    """head then stores, where no data flows between them in either order (`_independent`);
    when the head is the whole body but the stores (`rest` empty: the stores' data come from the
    head of the iteration before, long issued), ends in a loop, and the stores are one loop of
    as many iterations, one loop doing an iteration of each in turn (a band's pixels beside the
    rows of the band before): the stores then fill the DMA unit's waits between the head's
    loads instead of holding up the loads of the iteration after. (Behind a rest that computes
    the stored values, a store would hold the next loads on the in-order DMA unit until the rest
    is done: VTA's AlexNet conv1 vendor template, 848,292 -> 926,151 cycles.)"""
    if not (head and not rest and len(stores) == 1 and isinstance(head[-1], Loop) and isinstance(stores[0], Loop)
            and head[-1].count == stores[0].count):
        return head + stores
    last, store = head[-1], stores[0]

    def renamed(o: Operand) -> Operand:
        terms = dict(o.addr.terms)
        coeff = terms.pop(store.var, 0)
        return replace(o, addr=Affine(o.addr.base, tuple(sorted(terms.items()))) + loop_var(last.var, coeff))

    return [*head[:-1], Loop(last.var, last.count, last.body + map_operands(store.body, renamed))]


def _run_length(items, kind: str) -> int:
    """How many items from the start hold only instructions of this kind."""
    n = 0
    for item in items:
        if not all(ins.kind == kind for ins in _instrs(item)):
            break
        n += 1
    return n


def _instrs(item: Instr | Loop) -> Iterator[Instr]:
    if isinstance(item, Loop):
        for inner in item.body:
            yield from _instrs(inner)
    else:
        yield item


def _loop_vars(block: Block) -> Iterator[int]:
    for item in block:
        if isinstance(item, Loop):
            yield item.var
            yield from _loop_vars(item.body)


def _copy(items: Block, var: int, k: int, fresh: Iterator[int] | None = None) -> Block:
    """The items with loop counter `var` replaced by var + k, or, given `fresh`, by k, their
    loops then counting with counters from `fresh` (a copy beside its original must not share
    its counters: the simulator tells loops apart by them)."""
    rename: dict[int, int] = {}

    def addr(a: Affine) -> Affine:
        base, terms = a.base, []
        for v, c in a.terms:
            if v == var:
                base += c * k
                if fresh is not None:
                    continue
            terms.append((rename.get(v, v), c))
        return Affine(base, tuple(sorted(terms)))

    def counter(v: int) -> int:
        if fresh is not None:
            rename[v] = next(fresh)
        return rename.get(v, v)

    return map_operands(items, lambda o: replace(o, addr=addr(o.addr)), counter)


def footprints(items: Block, counts: dict[int, int]) -> Iterator[tuple[str, bool, int, int, Affine]]:
    """(memory, written, lowest address, end address, the address's terms in outer counters) of
    every operand: the span covers the item's own loops; the outer terms are left symbolic."""
    for item in items:
        if isinstance(item, Loop):
            yield from footprints(item.body, {**counts, item.var: item.count})
            continue
        for written, o in ((True, item.dst), *((False, s) for s in item.srcs)):
            own = Affine(0, tuple(t for t in o.addr.terms if t[0] in counts))
            lo, end = _spread(o.addr.base, o.addr.base + (o.rows - 1) * o.stride + o.cols, own, counts)
            yield o.space, written, lo, end, Affine(0, tuple(t for t in o.addr.terms if t[0] not in counts))


def _independent(loop: Loop, head: Block, stores: list, outer: dict[int, int]) -> bool:
    """Whether, for every j, the instructions `head` of iteration j+1 neither write what the
    stores of iteration j read nor touch what they write (`stores`: their `footprints`). When outer loops move the two
    differently, their whole spans over every iteration must be apart."""
    v = loop.var
    leading = list(footprints(head, {}))
    for space, s_writes, s_lo, s_end, s_terms in stores:
        for space2, l_writes, l_lo, l_end, l_terms in leading:
            if space != space2 or not (s_writes or l_writes):
                continue
            s_outer, l_outer = dict(s_terms.terms), dict(l_terms.terms)
            s_j, l_j = s_outer.pop(v, 0), l_outer.pop(v, 0)
            if s_outer != l_outer:
                everywhere = {**outer, v: loop.count}
                (a, a_end), (b, b_end) = (_spread(lo, end, t, everywhere)
                                          for lo, end, t in ((s_lo, s_end, s_terms), (l_lo, l_end, l_terms)))
                if a < b_end and b < a_end:
                    return False
                continue
            # iteration j's store span against iteration j+1's load span; a constant gap when
            # both move alike, so one j decides
            for j in range(1 if s_j == l_j else loop.count - 1):
                a, b = s_lo + s_j * j, l_lo + l_j * (j + 1)
                if a < b + (l_end - l_lo) and b < a + (s_end - s_lo):
                    return False
    return True


def _spread(lo: int, end: int, terms: Affine, counts: dict[int, int]) -> tuple[int, int]:
    """The span [lo, end) widened by every value of the counters in `terms`."""
    for var, c in terms.terms:
        span = c * (counts[var] - 1)
        lo, end = lo + min(0, span), end + max(0, span)
    return lo, end
