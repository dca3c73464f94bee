"""A recurrent step's work that does not need the carried state issues first
(`hwmodels.step_order`): reordered steps compute the same values whatever the instructions and
whichever buffers hold the state, the work that reads the state keeps its order behind what it
depends on, and the compiled LSTM's matrix unit no longer waits out each step's state path."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from egraph_rules.ir import T, tensor_type
from hwmodels import codegen
from hwmodels.isa import Affine, HostBuffer, Instr, Loop, Operand, Program
from hwmodels.simulator import simulate
from hwmodels.step_order import state_independent_first
from liftsat import optimize
from liftsat.targets import get_target

G = 4          # elements per vector and per scoreboard block
SLOTS = 6      # on-chip vectors the hand-built steps use
STEPS = 5      # iterations of the hand-built step loop


def vec(space: str, slot: int, *terms: tuple[int, int]) -> Operand:
    return Operand(space, Affine(slot * G, tuple(terms)), 1, G, G)


def instr(kind: str, dst: Operand, *srcs: Operand) -> Instr:
    unit = {"load": "dma", "VVRelu": "mfu", "VVAdd": "mfu", "VVMul": "mvu"}[kind]
    return Instr(kind.upper(), kind, unit, 2, 30, dst, srcs)


def state_span(slot: int) -> tuple[str, int, int, Affine]:
    return "buf", slot * G, (slot + 1) * G, Affine(0)


def run(step: list) -> tuple[int, np.ndarray]:
    """Cycles, and every on-chip vector after STEPS runs of `step` (stored to DRAM at the end),
    the input at dram[0:] being STEPS vectors of -STEPS*G/2 ..."""
    out = STEPS * G
    tail = [instr("load", vec("dram", STEPS + s), vec("buf", s)) for s in range(SLOTS)]
    program = Program("hand", [], [Loop(0, STEPS, step), *tail], {"dram": out + SLOTS * G, "buf": SLOTS * G},
                      [HostBuffer(0, STEPS * G, T("Var", "x", tensor_type("f32", (STEPS * G,))), "x")],
                      out, (SLOTS * G,), (1,))
    x = np.arange(STEPS * G, dtype=np.float32) - STEPS * G / 2
    result = simulate(program, G, {"x": x})
    return result.cycles, result.output


def test_the_input_product_goes_ahead_of_the_state_path():
    # state in slot 0: s' = relu(s) + x_i * x_i, written as the term reads, state path first
    step = [instr("VVRelu", vec("buf", 1), vec("buf", 0)),
            instr("load", vec("buf", 2), vec("dram", 0, (0, G))),
            instr("VVMul", vec("buf", 3), vec("buf", 2), vec("buf", 2)),
            instr("VVAdd", vec("buf", 0), vec("buf", 1), vec("buf", 3))]
    reordered = state_independent_first(step, [state_span(0)])
    assert [i.mnemonic for i in reordered] == ["LOAD", "VVMUL", "VVRELU", "VVADD"]
    (before, values), (after, same) = run(step), run(reordered)
    np.testing.assert_array_equal(same, values)
    assert after < before


def test_work_that_would_overwrite_what_the_state_path_reads_stays_behind_it():
    # the independent load reuses slot 1, which the state path reads first: it must wait
    step = [instr("VVRelu", vec("buf", 1), vec("buf", 0)),
            instr("VVAdd", vec("buf", 0), vec("buf", 1), vec("buf", 0)),
            instr("load", vec("buf", 1), vec("dram", 0, (0, G))),
            instr("VVMul", vec("buf", 2), vec("buf", 1), vec("buf", 1))]
    assert state_independent_first(step, [state_span(0)]) == step


def test_a_loop_nest_moves_as_one_item():
    inner = Loop(1, 2, [instr("load", vec("buf", 2, (1, G)), vec("dram", 0, (0, G), (1, G)))])
    step = [instr("VVRelu", vec("buf", 1), vec("buf", 0)), inner]
    assert state_independent_first(step, [state_span(0)]) == [inner, step[0]]


@st.composite
def steps(draw):
    """A step of 2-8 random instructions over SLOTS on-chip vectors and the step's input row."""
    n = draw(st.integers(2, 8))
    out = []
    for _ in range(n):
        kind = draw(st.sampled_from(["load", "VVRelu", "VVAdd", "VVMul"]))
        dst = vec("buf", draw(st.integers(0, SLOTS - 1)))
        if kind == "load":
            out.append(instr(kind, dst, vec("dram", 0, (0, G))))
        else:
            srcs = [vec("buf", draw(st.integers(0, SLOTS - 1))) for _ in range(1 if kind == "VVRelu" else 2)]
            out.append(instr(kind, dst, *srcs))
    return out


@settings(max_examples=60, deadline=None)
@given(step=steps(), state=st.sets(st.integers(0, SLOTS - 1), min_size=1, max_size=2))
def test_reordered_steps_compute_the_same_values(step, state):
    reordered = state_independent_first(step, [state_span(s) for s in sorted(state)])
    assert sorted(map(id, reordered)) == sorted(map(id, step))
    _, values = run(step)
    _, same = run(reordered)
    np.testing.assert_array_equal(same, values)


def test_the_lstm_step_keeps_the_matrix_unit_busy():
    # brainwave's LSTM(256): 32 products of 8 cycles a step; issued as the term reads, the unit
    # waited 48 cycles a step for the state; now only the first step's and the last's latency
    r = optimize(["LSTM(256, 256)"], (20, 1, 256), "brainwave")
    assert r.max_rel_error < 1e-4
    busy = r.unit_busy["mvu"]
    assert busy == 20 * 32 * 8
    assert r.cycles - busy < 400


def test_steps_keep_the_terms_order_where_buffers_share_memory(monkeypatch):
    # issuing a step's independent work first keeps its results live while the state is worked
    # on: done only where every buffer has memory of its own (198 KB of the vector registers
    # here), so that it never costs the program its memory plan
    def listings(target) -> tuple[str, str]:
        with monkeypatch.context() as m:
            first = optimize(["LSTM(256, 256)"], (6, 1, 256), target).listing
            m.setattr(codegen, "state_independent_first", lambda items, state: items)
            return first, optimize(["LSTM(256, 256)"], (6, 1, 256), target).listing

    reordered, plain = listings("brainwave")
    assert reordered != plain
    shared, same = listings(get_target("brainwave").with_memory("bw.vrf", capacity=64 * 1024))
    assert shared == same
