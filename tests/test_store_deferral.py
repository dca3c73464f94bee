"""A loop's stores deferred past the next iteration's loads (`hwmodels.store_deferral`): the
rotated program computes the same values, is no slower, and the rotation is refused wherever
the next loads would overwrite what the stores read, or read what they write."""

from __future__ import annotations

import numpy as np
import pytest

from egraph_rules.ir import T, tensor_type
from hwmodels.isa import Affine, HostBuffer, Instr, Loop, Operand, Program
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


def run(body: list, out: int, rows: int = N) -> tuple[int, np.ndarray]:
    """Cycles, and the `rows` output vectors at dram[out:] when the input at dram[0:] is
    -rows*G/2 ..; timing-only and functional simulation must agree on the cycles (the first
    takes the periodic fast path where it can)."""
    x = np.arange(rows * G, dtype=np.float32) - rows * G / 2
    program = Program("hand", [], body, {"dram": out + rows * G, "buf": 4 * G},
                      [HostBuffer(0, x.size, T("Var", "x", tensor_type("f32", x.shape)), "x")],
                      out, (rows * G,), (1,))
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


def test_two_iterations_are_unrolled():
    body = [Loop(0, 2, rows_loop(vec("buf", 0), vec("dram", N * G, (0, G))).body)]
    rotated = defer_stores(body)
    assert not any(isinstance(i, Loop) for i in rotated)
    assert [i.mnemonic for i in rotated] == ["LD", "RELU", "LD", "ST", "RELU", "ST"]


@pytest.mark.parametrize("target", ["snowflake", "vta"])
def test_banded_convolution_overlaps_its_stores_with_the_next_band(target):
    # Snowflake's and VTA's banded programs of DeepBench's 151x40 convolution: a band's stores wait
    # for its last results, which took 23,450 cycles on Snowflake with the stores ahead of the next
    # band's loads (0.85 of them predicted)
    r = optimize(["Conv2d(1, 32, (5, 20), stride=(2, 8), padding=(8, 8))"], (1, 1, 40, 151), target)
    assert r.max_rel_error < 1e-5
    assert abs(r.predicted_cycles / r.cycles - 1) <= 0.10
