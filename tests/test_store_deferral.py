"""A loop's stores deferred past the next iteration's loads (`hwmodels.store_deferral`): the
rotated program computes the same values, is no slower, and the rotation is refused wherever
the next loads would overwrite what the stores read, or read what they write."""

from __future__ import annotations

import numpy as np
import pytest

from egraph_rules.ir import T, tensor_type
from hwmodels.isa import Affine, HostBuffer, Instr, Loop, Operand, Program
from hwmodels.memory_plan import Buffer, lifetimes, place, relocate
from hwmodels.simulator import simulate
from hwmodels.store_deferral import _loop_vars, defer_stores
from liftsat import optimize

G = 4          # elements per vector and per scoreboard block
N = 6          # iterations of the hand-built loops


def vec(space: str, base: int, *terms: tuple[int, int]) -> Operand:
    return Operand(space, Affine(base, tuple(terms)), 1, G, G)


def load(dst: Operand, src: Operand) -> Instr:
    return Instr("LD", "load", "dma", 2, 40, dst, (src,))


def store(dst: Operand, src: Operand) -> Instr:
    return Instr("ST", "store", "dma", 2, 40, dst, (src,))


def relu(dst: Operand, src: Operand) -> Instr:
    return Instr("RELU", "VVRelu", "mfu", 1, 30, dst, (src,))


def hand_program(body: list, out: int, rows: int = N, room: int = 4) -> Program:
    """A program of these instructions whose input at dram[0:] is `rows` vectors, its output the
    `rows` vectors at dram[out:], with `room` vectors of on-chip memory."""
    return Program("hand", [], body, {"dram": out + rows * G, "buf": room * G},
                   [HostBuffer(0, rows * G, T("Var", "x", tensor_type("f32", (rows * G,))), "x")],
                   out, (rows * G,), (1,))


def run(body: list, out: int, rows: int = N, room: int = 4) -> tuple[int, np.ndarray]:
    """Cycles, and the `rows` output vectors at dram[out:] when the input at dram[0:] is
    -rows*G/2 ..; timing-only and functional simulation must agree on the cycles (the first
    takes the periodic fast path where it can)."""
    x = np.arange(rows * G, dtype=np.float32) - rows * G / 2
    program = hand_program(body, out, rows, room)
    timing = simulate(program, G, None, functional=False)
    functional = simulate(program, G, {"x": x}, functional=True)
    assert functional.cycles == timing.cycles
    return timing.cycles, functional.output


def rows_loop(load_dst: Operand, store_dst: Operand, load_src: Operand | None = None) -> Loop:
    """for i < N: load row i, relu it into another buffer, store it."""
    return Loop(0, N, [load(load_dst, load_src or vec("dram", 0, (0, G))),
                       relu(vec("buf", G), load_dst),
                       store(store_dst, vec("buf", G))])


def test_rotation_keeps_values_and_removes_the_store_wait():
    body = [rows_loop(vec("buf", 0), vec("dram", N * G, (0, G)))]
    rotated = defer_stores(body)
    # the first iteration's loads and compute, the rotated loop, the last iteration's stores
    assert [type(i).__name__ for i in rotated] == ["Instr", "Instr", "Loop", "Instr"]
    assert rotated[2].count == N - 1
    assert [i.mnemonic for i in rotated[2].body] == ["LD", "ST", "RELU"]
    assert rotated[3].dst.addr == Affine(N * G + (N - 1) * G)
    before, out_before = run(body, N * G)
    after, out_after = run(rotated, N * G)
    np.testing.assert_array_equal(out_after, out_before)
    np.testing.assert_array_equal(out_after, np.maximum(np.arange(N * G) - N * G / 2, 0))
    assert after < before


def test_not_rotated_when_the_next_load_overwrites_what_is_stored():
    # the loop stores the buffer its next iteration loads into
    body = [Loop(0, N, [load(vec("buf", 0), vec("dram", 0, (0, G))), store(vec("dram", N * G, (0, G)), vec("buf", 0))])]
    assert defer_stores(body) == body


def test_not_rotated_when_the_next_load_reads_what_is_stored():
    # iteration i stores at dram[G*(i+1)], which iteration i+1 loads: data flows through DRAM
    body = [rows_loop(vec("buf", 0), vec("dram", G, (0, G)))]
    assert defer_stores(body) == body


def test_not_rotated_when_an_outer_counter_moves_them_differently():
    inner = rows_loop(vec("buf", 0, (1, 2 * G)), vec("dram", N * G, (0, G)))
    body = [Loop(1, 2, [inner])]
    assert defer_stores(body)[0].body == [inner]


def test_nested_loops_rotate_with_counters_of_their_own():
    # an outer loop of 3 around the rows: both rotate, and every peeled copy of a loop counts
    # with a counter of its own (the simulator's fast path needs them distinct)
    inner = Loop(0, N, [load(vec("buf", 0), vec("dram", 0, (0, G), (1, N * G))),
                        relu(vec("buf", G), vec("buf", 0)),
                        store(vec("dram", 3 * N * G, (0, G), (1, N * G)), vec("buf", G))])
    body = [Loop(1, 3, [inner])]
    rotated = defer_stores(body)
    counters = list(_loop_vars(rotated))
    assert len(counters) == len(set(counters)) > 2
    before, out_before = run(body, 3 * N * G, rows=3 * N)
    after, out_after = run(rotated, 3 * N * G, rows=3 * N)
    np.testing.assert_array_equal(out_after, out_before)
    np.testing.assert_array_equal(out_after, np.maximum(np.arange(3 * N * G) - 3 * N * G / 2, 0))
    assert after < before


def test_a_bands_stores_interleave_with_the_next_bands_rows():
    # bands of R rows: a loop loads and ReLUs each row of band j into a buffer per band, a loop
    # of as many iterations stores them; after the rotation the stores of band j and the rows of
    # band j+1 take turns in one loop, so the stores fill the DMA's waits for the rows' readers
    bands, rows = 5, 3
    head = Loop(1, rows, [load(vec("buf", 0), vec("dram", 0, (0, rows * G), (1, G))),
                          relu(vec("buf", G, (0, rows * G), (1, G)), vec("buf", 0))])
    stores = Loop(2, rows, [store(vec("dram", bands * rows * G, (0, rows * G), (2, G)),
                                  vec("buf", G, (0, rows * G), (2, G)))])
    body = [Loop(0, bands, [head, stores])]
    rotated = defer_stores(body)
    middle = next(i for i in rotated if isinstance(i, Loop) and i.count == bands - 1)
    assert len(middle.body) == 1 and middle.body[0].count == rows
    assert [i.mnemonic for i in middle.body[0].body] == ["LD", "RELU", "ST"]
    room = 1 + bands * rows
    before, out_before = run(body, bands * rows * G, bands * rows, room)
    after, out_after = run(rotated, bands * rows * G, bands * rows, room)
    np.testing.assert_array_equal(out_after, out_before)
    np.testing.assert_array_equal(out_after, np.maximum(np.arange(bands * rows * G) - bands * rows * G / 2, 0))
    assert after < before


def test_two_iterations_are_unrolled():
    body = [Loop(0, 2, rows_loop(vec("buf", 0), vec("dram", N * G, (0, G))).body)]
    rotated = defer_stores(body)
    assert not any(isinstance(i, Loop) for i in rotated)
    assert [i.mnemonic for i in rotated] == ["LD", "RELU", "LD", "ST", "RELU", "ST"]


def test_what_a_loops_stores_read_is_kept_apart_for_them_to_wait():
    """Load a row, ReLU it twice (through a temporary), store it. Sharing memory by lifetime puts
    the stored row where the loaded row was (dead by then): the next iteration's load overwrites
    what this iteration's store reads, so the store cannot wait behind it. With stored_live the
    stored row is live over the whole loop and kept apart, and the rotated program is faster,
    with the same output."""
    loaded, temp, stored = Buffer("buf", 0, G), Buffer("buf", G, G), Buffer("buf", 2 * G, G)
    loop = Loop(0, N, [load(vec("buf", 0), vec("dram", 0, (0, G))), relu(vec("buf", G), vec("buf", 0)),
                       relu(vec("buf", 2 * G), vec("buf", G)), store(vec("dram", N * G, (0, G)), vec("buf", 2 * G))])
    program = hand_program([loop], N * G)
    assert lifetimes(program, [loaded, temp, stored])[stored] == (2, 3)
    assert lifetimes(program, [loaded, temp, stored], stored_live=True)[stored] == (0, 3)
    shared = relocate(program, *place(program, [loaded, temp, stored]))
    assert shared.body[0].body[3].srcs[0].addr == Affine(0)     # where the next load writes
    assert defer_stores(shared.body) == shared.body
    kept = relocate(program, *place(program, [loaded, temp, stored], stored_live=True))
    assert kept.memory_sizes["buf"] == 3 * G
    rotated = defer_stores(kept.body)
    assert [i.mnemonic for i in rotated[3].body] == ["LD", "RELU", "ST", "RELU"]
    before, out_before = run(shared.body, N * G)
    after, out_after = run(rotated, N * G)
    np.testing.assert_array_equal(out_after, out_before)
    np.testing.assert_array_equal(out_after, np.maximum(np.arange(N * G) - N * G / 2, 0))
    assert after < before


@pytest.mark.parametrize("target", ["snowflake", "vta"])
def test_banded_convolution_overlaps_its_stores_with_the_next_band(target):
    # Snowflake's and VTA's banded programs of DeepBench's 151x40 convolution: a band's stores wait
    # for its last results, which took 23,450 cycles on Snowflake with the stores ahead of the next
    # band's loads (0.85 of them predicted)
    r = optimize(["Conv2d(1, 32, (5, 20), stride=(2, 8), padding=(8, 8))"], (1, 1, 40, 151), target)
    assert r.max_rel_error < 1e-5
    assert abs(r.predicted_cycles / r.cycles - 1) <= 0.10


def test_stored_rows_kept_apart_from_the_bands_gemm_results():
    # DeepBench's 28x28x192 5x5 convolution (batch 16) on VTA: a band's 300 GEMM results would
    # share accumulator memory with the rows the band before stores (each dead, by lifetime, when
    # the other is written), so those stores could not wait behind the next band; laid out apart
    # (without a buffer per band for the stored rows, which do not fit beside them), they do:
    # 148,690,390 -> 127,743,772 cycles, 0.867 -> 1.009 of them predicted
    r = optimize(["Conv2d(192, 32, (5, 5), padding=(2, 2))"], (16, 192, 28, 28), "vta", functional=False)
    assert abs(r.predicted_cycles / r.cycles - 1) <= 0.10
