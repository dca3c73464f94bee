"""Ordering a recurrent step's instructions so that the work independent of the carried state
issues first.

Each unit runs its instructions in program order. A Fold step compiled as the term reads (an
LSTM gate's input product W x, then its recurrent product U h, gate by gate) puts the next
step's first recurrent product right behind its first input product on the matrix unit, so the
unit waits out the whole path from the previous step's last product to its new state (brainwave's
LSTM(256): 48 idle cycles in every 304-cycle step). Issuing every item that does not read the
state, directly or through what other items computed from it, ahead of the items that do, lets
the units work on the next step's input while the state is finished.

The order is a list schedule over the step's items (its top-level instructions and loop nests):
an item goes only after every earlier item it depends on through memory (it reads what the other
writes, writes what it reads or writes, on address intervals), so the step computes the same
values; among the items that may go, the first that does not depend on the state does.
"""

from __future__ import annotations

from hwmodels.isa import Affine, Block
from hwmodels.store_deferral import footprints

#: a memory span: (memory, lowest address, end address, the address's terms in outer counters)
Span = tuple[str, int, int, Affine]


def state_independent_first(items: Block, state: list[Span]) -> Block:
    """The step's items reordered as above; `state` spans the buffers the step reads its
    carried state from."""
    reads: list[list[Span]] = []
    writes: list[list[Span]] = []
    for item in items:
        own = list(footprints([item], {}))
        reads.append([(space, lo, end, terms) for space, written, lo, end, terms in own if not written])
        writes.append([(space, lo, end, terms) for space, written, lo, end, terms in own if written])
    deps = [{j for j in range(i) if _meets(writes[i], reads[j] + writes[j]) or _meets(reads[i], writes[j])}
            for i in range(len(items))]
    tainted: set[int] = set()
    for i in range(len(items)):
        if _meets(reads[i], state) or any(j in tainted and _meets(reads[i], writes[j]) for j in deps[i]):
            tainted.add(i)
    order: list[int] = []
    done: set[int] = set()
    pending = list(range(len(items)))
    while pending:
        ready = [i for i in pending if deps[i] <= done]
        pick = next((i for i in ready if i not in tainted), ready[0])
        order.append(pick)
        done.add(pick)
        pending.remove(pick)
    return [items[i] for i in order]


def _meets(a: list[Span], b: list[Span]) -> bool:
    """Whether a span of `a` may share an address with one of `b` in one iteration of the outer
    loops: the same memory, and overlapping intervals where the outer counters move both alike
    (assumed otherwise)."""
    return any(x[0] == y[0] and (x[3] != y[3] or (x[1] < y[2] and y[1] < x[2])) for x in a for y in b)
