"""Lifetime-based placement of on-chip buffers, on programs written by hand."""

from __future__ import annotations

import pytest

from hwmodels import memory_plan
from hwmodels.isa import Affine, Instr, Loop, Operand, Program, loop_var
from hwmodels.memory_plan import Buffer, PlanError, innermost, lifetimes, live_peak, place, plans, relocate

S = "chip"


def op(addr: Affine | int, cols: int = 4) -> Operand:
    return Operand(S, addr if isinstance(addr, Affine) else Affine(addr), 1, cols, cols)


def ins(dst: Operand, *srcs: Operand) -> Instr:
    return Instr("mov", "Copy", "u", 1, 1, dst, srcs)


def program(setup: list, body: list, size: int) -> Program:
    return Program("t", setup, body, {"dram": 16, S: size}, [], 0, (4,), (1,))


# A pinned constant (setup), a value computed before a loop and read after it, two rows of
# temporaries the loop writes and reads each iteration, and a value computed after the loop.
PINNED, BEFORE, TEMP, ROWS, AFTER = (Buffer(S, 0, 4), Buffer(S, 4, 4), Buffer(S, 8, 4), Buffer(S, 12, 8),
                                     Buffer(S, 20, 4))
LOOP = Loop(0, 2, [ins(op(8), op(0)), ins(op(Affine(12) + loop_var(0, 4)), op(8))])
PROGRAM = program([ins(op(0), op(0))], [ins(op(4), op(4)), LOOP, ins(op(20), op(4)), ins(op(20), op(12, 8))], 24)


def test_lifetimes_cover_loops_a_value_lives_across():
    live = lifetimes(PROGRAM, [PINNED, BEFORE, TEMP, ROWS, AFTER])
    assert live[PINNED] == (0, 5)          # setup: the whole program
    assert live[BEFORE] == (1, 4)          # read after the loop: live through it
    assert live[TEMP] == (2, 3)            # written and read within one iteration
    assert live[ROWS] == (2, 5)            # rows written in the loop, read after it
    assert live[AFTER] == (4, 5)


def test_placement_reuses_the_memory_of_dead_buffers_only():
    where, needs = place(PROGRAM, [PINNED, BEFORE, TEMP, ROWS, AFTER])
    assert where[AFTER] == where[TEMP]     # the loop's temporary is dead after the loop
    spans = {b: (where[b], where[b] + b.size) for b in where}
    live = lifetimes(PROGRAM, list(where))
    for a in where:
        for b in where:
            overlap_in_time = a != b and live[a][0] <= live[b][1] and live[b][0] <= live[a][1]
            if overlap_in_time:
                assert spans[a][1] <= spans[b][0] or spans[b][1] <= spans[a][0]
    assert needs[S] == 20


def test_innermost_keeps_the_spans_of_loops_that_hold_no_other_spanned_loop():
    """Loop 1 (a Fold's trips) holds loop 2 (a nested Fold's) and, beside it, loop 3 (not a
    Fold's); loop 4 follows them. Where loop 2 is spanned, loop 1's buffer loses its span; where
    only loop 3 is, loop 1 holds it, so loop 1 is not innermost either."""
    inner = Loop(2, 2, [ins(op(8), op(0))])
    other = Loop(3, 2, [ins(op(12), op(0))])
    prog = program([], [Loop(1, 2, [inner, other, ins(op(4), op(8))]), Loop(4, 2, [ins(op(20), op(0))])], 24)
    spans = {BEFORE: 1, TEMP: 2, AFTER: 4}
    assert innermost(prog, spans) == {TEMP: 2, AFTER: 4}
    assert innermost(prog, {BEFORE: 1, ROWS: 3}) == {ROWS: 3}
    assert innermost(prog, {BEFORE: 1, AFTER: 4}) == {BEFORE: 1, AFTER: 4}


def test_largest_first_leaves_no_gap_a_small_buffer_splits():
    """Four 4-element buffers and a 1-element one live while the second is: placed in order of
    first use, the small one lands after the first big one, and the big ones no longer fall on
    4-element slots (13 elements); placed largest first they take the live peak, 12."""
    x, small, y, z, w = Buffer(S, 0, 4), Buffer(S, 4, 1), Buffer(S, 5, 4), Buffer(S, 9, 4), Buffer(S, 13, 4)
    prog = program([], [ins(op(0)), ins(op(5), op(4, 1)), ins(op(5), op(0)), ins(op(9), op(5), op(13)),
                        ins(op(13), op(9))], 17)
    buffers = [x, small, y, z, w]
    live = lifetimes(prog, buffers)
    assert (live[x], live[small], live[y], live[z], live[w]) == ((0, 2), (1, 1), (1, 3), (3, 4), (3, 4))
    assert place(prog, buffers)[1][S] == 13
    where, needs = place(prog, buffers, largest_first=True)
    assert needs[S] == 12 == max(sum(b.size for b in buffers if live[b][0] <= t <= live[b][1]) for t in range(5))
    for a in buffers:
        for b in buffers:
            if a != b and live[a][0] <= live[b][1] and live[b][0] <= live[a][1]:
                assert where[a] + a.size <= where[b] or where[b] + b.size <= where[a]
    assert relocate(prog, *place(prog, buffers, largest_first=True)).memory_sizes[S] == 12


def test_relocate_moves_every_operand_with_its_buffer():
    moved = relocate(PROGRAM, *place(PROGRAM, [PINNED, BEFORE, TEMP, ROWS, AFTER]))
    assert moved.memory_sizes[S] == 20
    assert moved.body[2].dst.addr == Affine(8)                         # AFTER now at TEMP's place
    assert moved.body[1].body[1].dst.addr == Affine(12) + loop_var(0, 4)
    assert moved.setup == PROGRAM.setup


def test_buffers_one_operand_reaches_across_move_together():
    """A whole vector written at the end of one buffer reaches into the next: the two are one
    region, placed and moved as one."""
    across = program([], [ins(op(4), op(4)), ins(op(0, 8), op(4)), ins(op(8), op(0, 8)), ins(op(12), op(8))], 16)
    buffers = [Buffer(S, 0, 4), Buffer(S, 4, 4), Buffer(S, 8, 4), Buffer(S, 12, 4)]
    live = lifetimes(across, buffers)
    assert live == {Buffer(S, 0, 8): (0, 2), Buffer(S, 8, 4): (2, 3), Buffer(S, 12, 4): (3, 3)}
    moved = relocate(across, *place(across, buffers))
    assert [i.dst.addr.base for i in moved.body] == [4, 0, 8, 0]
    assert moved.memory_sizes[S] == 12


def test_an_operand_outside_every_buffer_is_a_plan_error():
    bad = program([], [ins(op(4, 8), op(0))], 12)
    with pytest.raises(PlanError, match="outside the buffers"):
        lifetimes(bad, [Buffer(S, 0, 4), Buffer(S, 4, 4)])


def test_a_folds_two_steps_keep_their_buffers_apart():
    """A Fold's loop runs two steps per trip, each loading into a buffer of its own: sharing by
    lifetime would put the second step's buffer where the first's was (each is dead before the
    other is written), so the next trip's first load would wait for the second step's read. Named
    in `spans`, both live over the whole trip and stay apart."""
    first, second = Buffer(S, 0, 4), Buffer(S, 4, 4)
    trip = Loop(0, 3, [ins(op(0), op(0)), ins(op(0), op(0)), ins(op(4), op(4)), ins(op(4), op(4))])
    steps = program([], [trip], 8)
    assert lifetimes(steps, [first, second]) == {first: (0, 1), second: (2, 3)}
    assert relocate(steps, *place(steps, [first, second])).memory_sizes[S] == 4
    spans = {first: 0, second: 0}
    assert lifetimes(steps, [first, second], spans) == {first: (0, 3), second: (0, 3)}
    assert relocate(steps, *place(steps, [first, second], spans)).memory_sizes[S] == 8


def test_plans_are_place_for_each_try_in_order_of_use_then_largest_first(monkeypatch):
    """`plans` gives what `place` gives for each try (spans), in order of first use and then
    largest first, lazily (codegen stops at the first plan that fits), working out each try's
    lifetimes once for both orders."""
    first, second = Buffer(S, 0, 4), Buffer(S, 4, 4)
    trip = Loop(0, 3, [ins(op(0), op(0)), ins(op(0), op(0)), ins(op(4), op(4)), ins(op(4), op(4))])
    steps = program([], [trip], 8)
    tries = [{first: 0, second: 0}, {}]
    expected = [place(steps, [first, second], spans, largest) for largest in (False, True) for spans in tries]
    assert [needs[S] for _, needs in expected] == [8, 4, 8, 4]
    calls = []
    monkeypatch.setattr(memory_plan, "lifetimes", lambda *a, **k: calls.append(a) or lifetimes(*a, **k))
    lazy = plans(steps, [first, second], tries)
    assert next(lazy) == expected[0] and len(calls) == 1
    assert [expected[0], *lazy] == expected and len(calls) == len(tries)


def test_live_peak_is_what_no_placement_needs_less_than():
    """The most the regions live at one time hold: `place` never needs less, in either order,
    nor with lifetimes made longer (codegen gives up on a program over capacity here)."""
    x, small, y, z, w = Buffer(S, 0, 4), Buffer(S, 4, 1), Buffer(S, 5, 4), Buffer(S, 9, 4), Buffer(S, 13, 4)
    prog = program([], [ins(op(0)), ins(op(5), op(4, 1)), ins(op(5), op(0)), ins(op(9), op(5), op(13)),
                        ins(op(13), op(9))], 17)
    buffers = [x, small, y, z, w]
    live = lifetimes(prog, buffers)
    assert live_peak(live) == {S: 12}                  # y, z and w at instruction 3 (x is dead by then)
    assert all(place(prog, buffers, largest_first=f)[1][S] >= 12 for f in (False, True))
    assert live_peak({b: (0, 4) for b in buffers}) == {S: 17}
