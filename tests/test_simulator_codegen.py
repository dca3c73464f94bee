"""Code generation and the cycle-counting simulator, on terms of device ops written by hand
(no saturation), at native dimension 4 so programs stay small (Snowflake at its own 16 where
a store must take longer than the op before it, as there)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egraph_rules.ir import T, Term, comp, ta, tensor_type, tp, ts
from hwmodels.codegen import CodegenError, Codegen, InputError, _compiled, _placed, generate
from hwmodels.isa import Affine, Instr, Loop, Operand, Program, loop_var
from hwmodels.simulator import SimulationError, simulate
from liftsat.targets import get_target

N = 4
TARGET = get_target("brainwave", N)
MRF, VRF = "bw.mrf", "bw.vrf"
F32 = ts("f32")


def V(n: int) -> Term:
    return ta(F32, n)


def M(n: int, k: int) -> Term:
    return tensor_type("f32", (n, k))


def dev(name: str) -> Term:
    return TARGET.op_by_name[f"bw.{name}"].op.term


def relu_program(length: int) -> Term:
    """x -> ReLU(x) on a vector of `length` (a multiple of N), one v_relu per native vector."""
    blocks = length // N
    f = comp(T("ToOutput", V(length)), T("Join", M(blocks, N)), T("Map", dev("v_relu"), blocks),
             T("Split", N, V(length)), T("ToChip", VRF, V(length)))
    return T("App", f, T("Var", "x", V(length)))


def pinned_mvmul_program() -> Term:
    """x -> W x with W moved to the matrix register file once, as a constant (setup)."""
    w = T("Var", "W", M(N, N))
    operands = T("Fork", T("Const", T("App", T("ToChip", MRF, M(N, N)), w), V(N)), T("ToChip", VRF, V(N)))
    return T("App", comp(T("ToOutput", V(N)), dev("mv_mul"), operands), T("Var", "x", V(N)))


def reduce_program(rows: int) -> Term:
    """X -> sum of the rows of X, with vv_add in a loop."""
    f = comp(T("ToOutput", V(N)), T("Reduce", dev("vv_add"), M(rows, N)), T("ToChip", VRF, M(rows, N)))
    return T("App", f, T("Var", "X", M(rows, N)))


def both(program: Program, env: dict):
    """Functional and timing-only simulation of the same program."""
    run = simulate(program, N, env, functional=True)
    timing = simulate(program, N, None, functional=False)
    return run, timing


# ---------------------------------------------------------------- functional = timing, outputs


@settings(max_examples=6, deadline=None)
@given(blocks=st.integers(1, 40), seed=st.integers(0, 1000))
def test_relu_program(blocks, seed):
    x = np.random.default_rng(seed).standard_normal(blocks * N).astype(np.float32)
    run, timing = both(generate(relu_program(blocks * N), TARGET), {"x": x})
    assert run.cycles == timing.cycles and run.setup_cycles == timing.setup_cycles
    assert run.dynamic_instructions == timing.dynamic_instructions == 3 * blocks
    assert timing.output is None
    np.testing.assert_array_equal(run.output, np.maximum(x, 0))


def test_a_chained_store_compiles_as_the_op_then_the_store():
    # DevOut (an op with its store chained to it) is the same instructions as the op, then the
    # store, in the loop that runs it: each vector stored as it is computed
    blocks = 6
    chained = T("DevOut", "bw.v_relu", V(N), V(N))
    f = comp(T("Join", M(blocks, N)), T("Map", chained, blocks), T("Split", N, V(blocks * N)),
             T("ToChip", VRF, V(blocks * N)))
    apart = comp(T("Join", M(blocks, N)), T("Map", comp(T("ToOutput", V(N)), dev("v_relu")), blocks),
                 T("Split", N, V(blocks * N)), T("ToChip", VRF, V(blocks * N)))
    x = np.random.default_rng(3).standard_normal(blocks * N).astype(np.float32)
    program = generate(T("App", f, T("Var", "x", V(blocks * N))), TARGET)
    assert program == generate(T("App", apart, T("Var", "x", V(blocks * N))), TARGET)
    assert [[i.mnemonic for i in loop.body] for loop in program.body] == [["v_rd"], ["v_relu", "v_wr"]]
    run, timing = both(program, {"x": x})
    assert run.cycles == timing.cycles
    np.testing.assert_array_equal(run.output, np.maximum(x, 0))


def test_pinned_weights_load_in_setup():
    rng = np.random.default_rng(1)
    w, x = rng.standard_normal((N, N)).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    program = generate(pinned_mvmul_program(), TARGET)
    assert [i.mnemonic for i in program.setup] == ["m_rd"]
    assert program.histogram() == {"mv_mul": 1, "v_rd": 1, "v_wr": 1}
    run, timing = both(program, {"W": w, "x": x})
    assert run.setup_cycles > 0 and run.setup_cycles == timing.setup_cycles
    assert run.cycles == timing.cycles
    np.testing.assert_allclose(run.output, w.astype(np.float64) @ x, rtol=1e-5, atol=1e-6)
    assert "setup:" in program.listing() and "m_rd" in program.listing()


@pytest.mark.parametrize("rows", [1, 2, 3, 7])
def test_reduce_program(rows):
    x = np.random.default_rng(rows).standard_normal((rows, N)).astype(np.float32)
    program = generate(reduce_program(rows), TARGET)
    assert program.histogram().get("vv_add", 0) == rows - 1
    run, timing = both(program, {"X": x})
    assert run.cycles == timing.cycles
    np.testing.assert_allclose(run.output, x.sum(axis=0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows, m", [(2, 1), (3, 2), (4, 3)])
def test_reduce_whose_operator_loops_over_rejoined_rows(rows, m):
    """A reduction whose operator is a Map whose body ends in a Join: each step writes the
    loop's results into the accumulator seen through the Join's inverse."""
    pair, wide = tp(V(2 * N), V(2 * N)), M(m, 2 * N)
    halves = T("Fork", comp(T("Split", N, V(2 * N)), T("Fst", pair)), comp(T("Split", N, V(2 * N)), T("Snd", pair)))
    add = comp(T("Join", M(2, N)), T("Map", dev("vv_add"), 2), T("Zip", tp(M(2, N), M(2, N))), halves)
    op = comp(T("Map", add, m), T("Zip", tp(wide, wide)))
    f = comp(T("ToOutput", wide), T("Reduce", op, ta(wide, rows)), T("ToChip", VRF, ta(wide, rows)))
    x = np.random.default_rng(rows * m).standard_normal((rows, m, 2 * N)).astype(np.float32)
    program = generate(T("App", f, T("Var", "X", ta(wide, rows))), TARGET)
    assert program.histogram()["vv_add"] == (rows - 1) * m * 2
    run, timing = both(program, {"X": x})
    assert run.cycles == timing.cycles
    np.testing.assert_allclose(run.output, x.sum(axis=0), rtol=1e-5, atol=1e-5)


def test_cycles_follow_the_timing_model():
    """One vector through load, relu and store: each waits for the previous result."""
    program = generate(relu_program(N), TARGET)
    run = simulate(program, N, {"x": np.ones(N, np.float32)})
    dma_occ = -(-N * 4 // TARGET.dram.bandwidth)
    relu = TARGET.op_by_name["bw.v_relu"]
    load_done = dma_occ + TARGET.dram.latency
    relu_done = load_done + relu.latency
    assert run.cycles == relu_done + dma_occ + TARGET.dram.latency
    assert run.unit_busy == {"dma": 2 * dma_occ, "mfu": relu.occupancy}
    assert run.unit_done == {"dma": run.cycles, "mfu": relu_done}


def test_more_work_takes_more_cycles():
    short = simulate(generate(relu_program(4 * N), TARGET), N, None, functional=False)
    long = simulate(generate(relu_program(40 * N), TARGET), N, None, functional=False)
    assert long.cycles > short.cycles


# ---------------------------------------------------------------- loops stay loops


def test_listing_keeps_loops():
    program = generate(relu_program(64 * N), TARGET)
    listing = program.listing()
    assert "loop i" in listing and "endloop" in listing
    assert listing.count("v_relu") == 1
    assert program.static_count() == 6
    assert program.dynamic_count() == 3 * 64
    assert program.static_count() * 10 < program.dynamic_count()
    assert program.histogram() == {"v_rd": 64, "v_relu": 64, "v_wr": 64}


def test_program_counts_nested_loops():
    op = Operand("dram", Affine(0), 1, N, N)
    ins = Instr("v_relu", "VVRelu", "mfu", 1, 9, op, (op,))
    program = Program("t", [], [ins, Loop(0, 3, [ins, Loop(1, 5, [ins])])], {"dram": 16}, [], 0, (N,), (1,))
    assert program.static_count() == 5
    assert program.dynamic_count() == 1 + 3 * (1 + 5)
    assert program.histogram() == {"v_relu": 19}
    assert program.listing().count("endloop") == 2


def test_affine_addresses():
    a = Affine(3) + loop_var(0).scaled(4) + loop_var(1, 2)
    assert a.at({0: 2, 1: 5}) == 3 + 8 + 10
    assert (a + loop_var(0, -4)).terms == ((1, 2),)
    assert str(Affine(0) + loop_var(2)) == "i2"
    assert str(a) == "3+4*i0+2*i1"
    assert (a + 5).base == 8


# ---------------------------------------------------------------- simulator errors


def _one_instr_program(dst: Operand, src: Operand, sizes=None) -> Program:
    ins = Instr("v_rd", "load", "dma", 1, 101, dst, (src,))
    return Program("t", [], [ins], sizes or {"dram": 16, VRF: 8}, [], 0, (N,), (1,))


@pytest.mark.parametrize("functional", [True, False])
@pytest.mark.parametrize("dst, src", [
    (Operand(VRF, Affine(8), 1, N, N), Operand("dram", Affine(0), 1, N, N)),      # past the end of the VRF
    (Operand(VRF, Affine(6), 1, N, N), Operand("dram", Affine(0), 1, N, N)),      # straddles the end
    (Operand(VRF, Affine(0), 1, N, N), Operand("dram", Affine(-4), 1, N, N)),     # negative address
    (Operand(VRF, Affine(0), 1, N, N), Operand("dram", Affine(0), 4, N, 5)),      # strided rows past the end
    (Operand(VRF, Affine(0), 1, N, N), Operand("sram", Affine(0), 1, N, N)),      # no such memory
])
def test_out_of_bounds_access_is_an_error(functional, dst, src):
    program = _one_instr_program(dst, src)
    with pytest.raises(SimulationError):
        simulate(program, N, {} if functional else None, functional=functional)


def test_in_bounds_access_at_the_edge_is_fine():
    program = _one_instr_program(Operand(VRF, Affine(4), 1, N, N), Operand("dram", Affine(12), 1, N, N))
    assert simulate(program, N, None, functional=False).cycles == 101


def test_out_of_bounds_inside_a_loop_is_found():
    ins = Instr("v_rd", "load", "dma", 1, 101, Operand(VRF, loop_var(0, N), 1, N, N),
                (Operand("dram", Affine(0), 1, N, N),))
    program = Program("t", [], [Loop(0, 3, [ins])], {"dram": 16, VRF: 8}, [], 0, (N,), (1,))
    with pytest.raises(SimulationError, match="outside"):
        simulate(program, N, None, functional=False)


def test_functional_simulation_needs_values():
    with pytest.raises(SimulationError, match="needs input"):
        simulate(generate(relu_program(N), TARGET), N, None, functional=True)


def test_unknown_instruction_kind_is_an_error():
    op = Operand(VRF, Affine(0), 1, N, N)
    program = Program("t", [], [Instr("v_magic", "Magic", "mfu", 1, 1, op, (op,))], {"dram": 8, VRF: 8}, [], 0,
                      (N,), (1,))
    with pytest.raises(SimulationError, match="no semantics"):
        simulate(program, N, {}, functional=True)


# ---------------------------------------------------------------- codegen errors


def test_matrix_register_file_overflow():
    tiny = TARGET.with_memory(MRF, capacity=N * N * 4 - 4)          # one float short of a native tile
    with pytest.raises(CodegenError, match="overflow"):
        generate(pinned_mvmul_program(), tiny)
    generate(pinned_mvmul_program(), TARGET.with_memory(MRF, capacity=N * N * 4))   # exactly one tile fits


def test_vector_register_file_overflow():
    tiny = TARGET.with_memory(VRF, capacity=64)
    generate(relu_program(2 * N), tiny)                                 # 16 elements fit
    with pytest.raises(CodegenError, match="overflow"):
        generate(relu_program(4 * N), tiny)                             # 32 do not


def test_a_stage_whose_loop_overflows_streams_after_what_came_before():
    """A Map whose result fits the vector register file but whose per-row load does not is
    compiled again with each row stored as it is computed; the stage before it stays in the
    program (its loads, products and stores), and the result is right."""
    rows = 3
    first = comp(T("ToDram", M(rows, N)), T("Map", dev("v_relu"), rows), T("ToChip", VRF, M(rows, N)))
    second = T("Map", comp(dev("v_relu"), T("ToChip", VRF, V(N))), rows)
    term = T("App", comp(T("ToOutput", M(rows, N)), second, first), T("Var", "x", M(rows, N)))
    # room for the first stage (input and result), the second's result, and one element short of its row
    program = generate(term, TARGET.with_memory(VRF, capacity=(3 * rows * N + N - 1) * 4))
    assert program.histogram() == {"v_rd": 2 * rows, "v_relu": 2 * rows, "v_wr": 2 * rows}
    x = np.random.default_rng(3).standard_normal((rows, N)).astype(np.float32)
    run, timing = both(program, {"x": x})
    np.testing.assert_array_equal(run.output, np.maximum(x, 0))
    assert run.cycles == timing.cycles


def test_rows_shorter_than_a_vector_are_packed_before_a_join():
    """Rows of 2 computed on chip have room for a whole native vector each, so Join cannot view
    them as one dense vector: they are stored whole, in order, each at the end of the previous
    row's data, and loaded back dense."""
    rows = 6
    row = comp(T("Slice", 0, 2, V(N)), dev("v_relu"))
    joined = comp(T("Join", M(rows, 2)), T("Map", row, rows), T("Split", N, V(rows * N)), T("ToChip", VRF, V(rows * N)))
    f = comp(T("ToOutput", V(N)), dev("v_relu"), T("Slice", 0, N, V(rows * 2)), joined)
    program = generate(T("App", f, T("Var", "x", V(rows * N))), TARGET)
    assert program.histogram() == {"v_rd": rows + 3, "v_relu": rows + 1, "v_wr": rows + 1}
    x = np.random.default_rng(5).standard_normal(rows * N).astype(np.float32)
    run, timing = both(program, {"x": x})
    np.testing.assert_array_equal(run.output, np.maximum(x.reshape(rows, N)[:, :2].reshape(-1)[:N], 0))
    assert run.cycles == timing.cycles


def test_codegen_rejects_bad_terms():
    x = T("Var", "x", V(N))
    with pytest.raises(CodegenError, match="applied"):
        generate(T("Id", V(N)), TARGET)
    with pytest.raises(CodegenError, match="DRAM"):                    # no ToOutput at the end
        generate(T("App", comp(dev("v_relu"), T("ToChip", VRF, V(N))), x), TARGET)
    with pytest.raises(CodegenError, match="operand in bw.vrf"):       # operand left in DRAM
        generate(T("App", comp(T("ToOutput", V(N)), dev("v_relu")), x), TARGET)
    with pytest.raises(CodegenError, match="no device op"):
        generate(T("App", comp(T("ToOutput", V(N)), T("Dev", "bw.fft", V(N), V(N)), T("ToChip", VRF, V(N))), x),
                 TARGET)
    with pytest.raises(CodegenError, match="cannot run"):              # not lowered to a device op
        generate(T("App", comp(T("ToOutput", V(N)), T("VVRelu", V(N)), T("ToChip", VRF, V(N))), x), TARGET)
    with pytest.raises(CodegenError, match="not a native block"):      # a device op at the wrong size
        generate(T("App", comp(T("ToOutput", V(2 * N)), T("Dev", "bw.v_relu", V(2 * N), V(2 * N)),
                               T("ToChip", VRF, V(2 * N))), T("Var", "x", V(2 * N))), TARGET)
    with pytest.raises(CodegenError, match="loads bw.vrf from DRAM"):   # a Restage needs a staging memory
        generate(T("App", comp(T("ToOutput", V(N)), dev("v_relu"), T("Restage", VRF, V(N))), x), TARGET)


def test_a_restage_of_a_value_not_in_the_staging_memory_is_a_codegen_error():
    """The cost model charges a Restage only the move out of the staging memory, so codegen
    must not quietly load from DRAM first."""
    systolic = get_target("systolic", N)
    w, v = ta(V(N), N), V(N)
    moves = T("Fork", comp(T("Restage", "gm.mesh", w), T("Fst", tp(w, v))), comp(T("ToChip", "gm.sp", v), T("Snd", tp(w, v))))
    f = comp(T("ToOutput", v), T("Dev", "gm.compute", tp(w, v), v), moves)
    with pytest.raises(CodegenError, match="Restage to gm.mesh of a value in dram: it must be in gm.sp"):
        generate(T("App", f, T("Pair", T("Var", "w", w), T("Var", "x", v))), systolic)
    staged = T("Fork", comp(T("Restage", "gm.mesh", w), T("ToChip", "gm.sp", w), T("Fst", tp(w, v))),
               comp(T("ToChip", "gm.sp", v), T("Snd", tp(w, v))))
    program = generate(T("App", comp(T("ToOutput", v), T("Dev", "gm.compute", tp(w, v), v), staged),
                         T("Pair", T("Var", "w", w), T("Var", "x", v))), systolic)
    assert program.histogram() == {"mvin": N + 1, "preload": 1, "compute": 1, "mvout": 1}   # w's rows, x
    rng = np.random.default_rng(3)
    env = {"w": rng.standard_normal((N, N)).astype(np.float32), "x": rng.standard_normal(N).astype(np.float32)}
    run, timing = both(program, env)
    np.testing.assert_allclose(run.output, env["w"] @ env["x"], rtol=1e-5)
    assert run.cycles == timing.cycles


def test_a_re_indexing_of_an_array_of_pairs_is_a_codegen_error():
    """Split of Zip's result (an array of pairs held in two buffers) has no strided view: a
    CodegenError naming the re-indexing, not an AttributeError from inside codegen."""
    pair_t = tp(M(4, N), M(4, N))
    loaded = [comp(T("ToChip", VRF, M(4, N)), T(side, pair_t)) for side in ("Fst", "Snd")]
    f = comp(T("ToOutput", M(4, N)), T("Join", ta(M(2, N), 2)), T("Map", T("Map", dev("vv_add"), 2), 2),
             T("Split", 2, ta(tp(V(N), V(N)), 4)), T("Zip", pair_t), T("Fork", *loaded))
    with pytest.raises(CodegenError, match="Split re-indexes an array held in one buffer"):
        generate(T("App", f, T("Pair", T("Var", "a", M(4, N)), T("Var", "b", M(4, N)))), TARGET)


def test_host_pads_inputs():
    """Pad of host data becomes a padded host buffer, not an instruction."""
    f = comp(T("ToOutput", V(N)), dev("v_relu"), T("ToChip", VRF, V(N)), T("Pad", 0, 1, V(N - 1)))
    program = generate(T("App", f, T("Var", "x", V(N - 1))), TARGET)
    x = np.array([-1.0, 2.0, -3.0], np.float32)
    run = simulate(program, N, {"x": x})
    np.testing.assert_array_equal(run.output, [0, 2, 0, 0])
    assert any("Pad" in hb.what for hb in program.host_buffers)


def test_host_pads_inputs_with_a_fill_value():
    """PadWith of host data: the host writes the fill into the padded buffer (-inf stays -inf
    through the device's max); on a computed value, codegen refuses naming the op."""
    pad = T("PadWith", 1, 0, -np.inf, V(N - 1))
    ops = T("Fork", comp(T("ToChip", VRF, V(N)), pad), T("Const", T("App", T("ToChip", VRF, V(N)), T("Var", "y", V(N))),
                                                            V(N - 1)))
    program = generate(T("App", comp(T("ToOutput", V(N)), dev("vv_max"), ops), T("Var", "x", V(N - 1))), TARGET)
    x, y = np.array([-1.0, 2.0, -3.0], np.float32), np.array([-np.inf, -4.0, 3.0, -6.0], np.float32)
    np.testing.assert_array_equal(simulate(program, N, {"x": x, "y": y}).output, [-np.inf, -1.0, 3.0, -3.0])
    assert any(hb.what.startswith("PadWith(1, 0, -inf)") for hb in program.host_buffers)
    computed = comp(T("ToOutput", V(N + 1)), T("PadWith", 0, 1, -np.inf, V(N)), dev("v_relu"), T("ToChip", VRF, V(N)))
    with pytest.raises(CodegenError, match=r"PadWith\(fill -inf\) of a computed value"):
        generate(T("App", computed, T("Var", "x", V(N))), TARGET)


def test_a_pad_of_a_value_in_dram_is_refused_without_retrying_the_views_around_it(monkeypatch):
    """A value stored to DRAM cannot be zero padded on chip, wherever the views around the pad
    put its result: codegen names the pad and compiles it once, where it used to compile it
    again for each enclosing view (exponentially, when those views dropped a destination: a
    GRU(3000) step on the systolic array took over a minute per candidate program)."""
    calls, pad_on_chip = [], Codegen.pad_on_chip
    monkeypatch.setattr(Codegen, "pad_on_chip", lambda self, *a: calls.append(a) or pad_on_chip(self, *a))
    n, views = 2 * N, [T("Join", M(3, N)), T("Split", N, V(3 * N))] * 10
    f = comp(T("ToOutput", V(3 * N)), *views, T("Pad", 0, N, V(n)), T("ToDram", V(n)), T("Join", M(2, N)),
             T("Map", dev("v_relu"), 2), T("Split", N, V(n)), T("ToChip", VRF, V(n)))
    with pytest.raises(InputError, match="only a computed vector on chip can be zero padded"):
        generate(T("App", f, T("Var", "x", V(n))), TARGET)
    assert len(calls) == 1


def test_pair_operands_come_from_both_register_files():
    a, b = (T("Var", n, V(N)) for n in "ab")
    operands = T("Fork", comp(T("ToChip", VRF, V(N)), T("Fst", tp(V(N), V(N)))),
                 comp(T("ToChip", VRF, V(N)), T("Snd", tp(V(N), V(N)))))
    program = generate(T("App", comp(T("ToOutput", V(N)), dev("vv_mul"), operands), T("Pair", a, b)), TARGET)
    av, bv = np.arange(N, dtype=np.float32), np.full(N, 3.0, np.float32)
    np.testing.assert_array_equal(simulate(program, N, {"a": av, "b": bv}).output, av * bv)


def test_buffers_whose_lifetimes_do_not_overlap_share_memory():
    """Three ReLUs in a row need four vectors, one per value, but at most two are live at once:
    with room for two, the third ReLU writes where the loaded input was, and the result is right."""
    x = T("Var", "x", V(N))
    term = T("App", comp(T("ToOutput", V(N)), dev("v_relu"), dev("v_relu"), dev("v_relu"), T("ToChip", VRF, V(N))), x)
    roomy = generate(term, TARGET)
    assert roomy.memory_sizes[VRF] == 4 * N
    program = generate(term, TARGET.with_memory(VRF, capacity=2 * N * 4))
    assert program.memory_sizes[VRF] == 2 * N
    writes = [ins.dst.addr.base for ins in program.body if ins.dst.space == VRF]
    assert writes == [0, N, 0, N]                                       # load, relu, relu, relu
    xv = np.random.default_rng(9).standard_normal(N).astype(np.float32)
    run, timing = both(program, {"x": xv})
    np.testing.assert_array_equal(run.output, np.maximum(xv, 0))
    assert run.cycles == timing.cycles
    with pytest.raises(CodegenError, match="overflow: the program has 32 bytes live at once"):
        generate(term, TARGET.with_memory(VRF, capacity=2 * N * 4 - 4))


def tile_products(tiles: int) -> Term:
    """Ws -> each N x N tile of Ws times x: a Map whose body loads its tile (x is pinned)."""
    x = T("Const", T("App", T("ToChip", VRF, V(N)), T("Var", "x", V(N))), M(N, N))
    body = comp(dev("mv_mul"), T("Fork", T("ToChip", MRF, M(N, N)), x))
    return comp(T("Map", body, tiles), T("Split", N, M(tiles * N, N)))


def tile_products_program(tiles: int) -> Term:
    return T("App", comp(T("ToOutput", M(tiles, N)), tile_products(tiles)), T("Var", "Ws", M(tiles * N, N)))


@pytest.mark.parametrize("latency,room,per_iteration", [(1, 3, True), (100, 3, False), (1, 2, False)])
def test_loads_that_stream_get_a_buffer_per_iteration_where_they_fit(latency, room, per_iteration):
    """A tile load that takes at least its latency to transfer (16 elements at 64 bytes per cycle:
    latency 1) is given a buffer per iteration of the Map around it, so the DMA need not wait for
    the previous iteration's product to read its tile; a load shorter than its latency, or tiles
    that do not all fit, keep one buffer. The products are right either way."""
    tiles = 3
    target = TARGET.with_memory(MRF, capacity=room * N * N * 4).with_memory("dram", latency=latency)
    program = generate(tile_products_program(tiles), target)
    loads = [ins for ins in program.body[0].body if ins.mnemonic == "m_rd"]
    assert len(loads) == 1 and isinstance(program.body[0], Loop)
    assert bool(loads[0].dst.addr.terms) == per_iteration
    rng = np.random.default_rng(5)
    ws, xv = rng.standard_normal((tiles * N, N)).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    run, timing = both(program, {"Ws": ws, "x": xv})
    want = np.stack([ws[i * N:(i + 1) * N].astype(np.float64) @ xv for i in range(tiles)])
    np.testing.assert_allclose(run.output, want, rtol=1e-5, atol=1e-6)
    assert run.cycles == timing.cycles


def test_a_program_that_fits_only_without_buffers_per_iteration_is_compiled_again_without():
    """The tiles' three buffers fit the matrix register file alone, but not beside a matrix
    pinned there for the whole program (which the products are then multiplied by): the program
    is compiled again with one tile buffer, which fits, and computes the same."""
    tiles = 3
    pinned = T("Const", T("App", T("ToChip", MRF, M(N, N)), T("Var", "W2", M(N, N))), V(N))
    second = T("Map", comp(dev("mv_mul"), T("Fork", pinned, T("Id", V(N)))), tiles)
    term = T("App", comp(T("ToOutput", M(tiles, N)), second, tile_products(tiles)), T("Var", "Ws", M(tiles * N, N)))
    target = TARGET.with_memory(MRF, capacity=tiles * N * N * 4).with_memory("dram", latency=1)
    program = generate(term, target)
    assert program.memory_sizes[MRF] == 2 * N * N
    assert not program.body[0].body[0].dst.addr.terms                   # the tiles' one buffer
    rng = np.random.default_rng(6)
    ws, w2, xv = (rng.standard_normal(s).astype(np.float32) for s in ((tiles * N, N), (N, N), (N,)))
    run, timing = both(program, {"Ws": ws, "W2": w2, "x": xv})
    want = np.stack([w2.astype(np.float64) @ (ws[i * N:(i + 1) * N].astype(np.float64) @ xv) for i in range(tiles)])
    np.testing.assert_allclose(run.output, want, rtol=1e-4, atol=1e-5)
    assert run.cycles == timing.cycles


@pytest.mark.parametrize("room,per_iteration", [(7, True), (2, False)])
def test_a_value_each_iteration_stores_gets_a_buffer_per_iteration_where_they_fit(room, per_iteration):
    """A Map storing each iteration's result computes it into a buffer per iteration when they
    all fit, so the next iteration's v_relu does not wait for this one's v_wr to read it (which
    waits behind every transfer queued on the DMA before it); else into one buffer. Same output."""
    rows = 6
    body = comp(T("ToOutput", V(N)), dev("v_relu"), T("ToChip", VRF, V(N)))
    term = T("App", comp(T("Map", body, rows), T("Split", N, V(rows * N))), T("Var", "x", V(rows * N)))
    program = generate(term, TARGET.with_memory(VRF, capacity=room * N * 4))
    loop = next(item for item in program.body if isinstance(item, Loop))
    relu = next(ins for ins in loop.body if ins.mnemonic == "v_relu")
    assert bool(relu.dst.addr.terms) == per_iteration
    x = np.random.default_rng(7).standard_normal(rows * N).astype(np.float32)
    run, timing = both(program, {"x": x})
    np.testing.assert_array_equal(run.output.reshape(-1), np.maximum(x, 0))
    assert run.cycles == timing.cycles


def relu_of_sums_program(rows: int) -> Term:
    """(X, Y) -> ReLU(X + Y) row by row: a Map whose body is v_relu after vv_add, both on the
    vector unit, which runs its instructions in order."""
    both_rows = tp(M(rows, N), M(rows, N))
    operands = T("Fork", comp(T("ToChip", VRF, M(rows, N)), T("Fst", both_rows)),
                 comp(T("ToChip", VRF, M(rows, N)), T("Snd", both_rows)))
    f = comp(T("ToOutput", M(rows, N)), T("Map", comp(dev("v_relu"), dev("vv_add")), rows), T("Zip", both_rows), operands)
    return T("App", f, T("Pair", T("Var", "X", M(rows, N)), T("Var", "Y", M(rows, N))))


@pytest.mark.parametrize("room,stage_by_stage", [(24, True), (20, False)])
def test_a_map_of_dependent_ops_on_one_unit_is_compiled_stage_by_stage_where_it_fits(room, stage_by_stage):
    """In one loop, each row's v_relu would hold the in-order vector unit for its vv_add's
    latency; compiled stage by stage (a loop of adds into a buffer of every row's sum, then a
    loop of ReLUs) the other rows' adds fill that wait, and the program is faster than the one
    loop the compile without per-iteration buffers gives. Where the sums' buffer does not fit
    (20 vectors: X, Y, the output and one sum), the one loop. Same output either way."""
    rows = 6
    target = TARGET.with_memory(VRF, capacity=room * N * 4)
    program = generate(relu_of_sums_program(rows), target)
    loops = [item for item in program.body if isinstance(item, Loop)]
    ops = [[ins.mnemonic for ins in loop.body if isinstance(ins, Instr)] for loop in loops]
    assert (["vv_add"] in ops and ["v_relu"] in ops) == stage_by_stage
    assert (["vv_add", "v_relu"] in ops) != stage_by_stage
    rng = np.random.default_rng(8)
    x, y = (rng.standard_normal((rows, N)).astype(np.float32) for _ in range(2))
    run, timing = both(program, {"X": x, "Y": y})
    np.testing.assert_array_equal(run.output.reshape(rows, N), np.maximum(x + y, 0))
    assert run.cycles == timing.cycles
    unspread = _placed(_compiled(relu_of_sums_program(rows), target, False, False), target, stored_live=True)
    one_loop = simulate(unspread, N, None, functional=False)
    add = TARGET.op_by_name["bw.vv_add"]
    if stage_by_stage:
        assert one_loop.cycles - run.cycles >= (rows - 1) * (add.latency - add.occupancy)   # a wait per row but one
    else:
        assert run.cycles == one_loop.cycles


def relu_of_padded_rows_program(rows: int, k: int) -> Term:
    """X -> each row's first k elements (of X's rows ReLU'd on chip) padded with zeros and ReLU'd:
    the padding, done on chip, is a multiply by a mask on the vector unit, which the ReLU then
    reads on the same in-order unit."""
    stages = [T("ToOutput", M(rows, N)), T("Map", comp(dev("v_relu"), T("Pad", 0, N - k, V(k))), rows),
              T("Map", T("Slice", 0, k, V(N)), rows), T("Map", dev("v_relu"), rows), T("ToChip", VRF, M(rows, N))]
    return T("App", comp(*stages), T("Var", "X", M(rows, N)))


def test_a_pad_on_chip_and_the_op_reading_it_are_compiled_stage_by_stage():
    """The mask multiply that pads each row and the ReLU that reads it run as a loop each, the
    rows' padded vectors in a buffer between them, so the other rows' multiplies fill each
    ReLU's wait for its row: faster than the one loop by a wait per row but one. Same output."""
    rows, k = 6, 3
    program = generate(relu_of_padded_rows_program(rows, k), TARGET)
    loops = [item for item in program.body if isinstance(item, Loop)]
    ops = [[ins.mnemonic for ins in loop.body if isinstance(ins, Instr)] for loop in loops]
    assert ["vv_mul"] in ops and ["v_relu"] in ops and ["vv_mul", "v_relu"] not in ops
    x = np.random.default_rng(9).standard_normal((rows, N)).astype(np.float32)
    run, timing = both(program, {"X": x})
    want = np.zeros((rows, N), np.float32)
    want[:, :k] = np.maximum(x[:, :k], 0)
    np.testing.assert_array_equal(run.output.reshape(rows, N), want)
    assert run.cycles == timing.cycles
    unspread = _placed(_compiled(relu_of_padded_rows_program(rows, k), TARGET, False, False), TARGET, stored_live=True)
    one_loop = simulate(unspread, N, None, functional=False)
    mul = TARGET.op_by_name["bw.vv_mul"]
    assert one_loop.cycles - run.cycles >= (rows - 1) * (mul.latency - mul.occupancy)


SNOWFLAKE = get_target("snowflake")


def tanh_rows_stored_program(rows: int, k: int) -> Term:
    """X -> tanh of every vector on chip, split into rows of k that a Map ReLUs and stores row
    by row (Snowflake: a store, 4 cycles a vector, outlasts the MAX that ReLUs it, 1 cycle)."""
    n, native = rows * k, SNOWFLAKE.native_dim
    op = {name: SNOWFLAKE.op_by_name[f"sf.{name}"].op.term for name in ("tanh", "relu")}
    stages = [T("Map", comp(T("ToOutput", tensor_type("f32", (k, native))), T("Map", op["relu"], k)), rows),
              T("Split", k, tensor_type("f32", (n, native))), T("Map", op["tanh"], n),
              T("ToChip", "sf.mbuf", tensor_type("f32", (n, native)))]
    return T("App", comp(*stages), T("Var", "X", tensor_type("f32", (n, native))))


@pytest.mark.parametrize("rows, k", [(8, 8), (2, 32)])
def test_rows_stored_one_by_one_are_computed_in_the_storing_loop(rows, k, monkeypatch):
    """The tanh of each row runs in the loop that ReLUs and stores the rows, so the first row is
    stored once its tanh is done, not once every row's is: the stores, the slowest unit's work,
    start (rows - 1) * k tanh earlier. Same output."""
    native = SNOWFLAKE.native_dim
    program = generate(tanh_rows_stored_program(rows, k), SNOWFLAKE)
    outer = [item for item in program.body if isinstance(item, Loop) and item.count == rows]
    assert [ins.mnemonic for loop in outer[0].body for ins in loop.body] == ["TANH", "MAX", "TMOV"]
    x = np.random.default_rng(4).standard_normal((rows * k, native)).astype(np.float32)
    run = simulate(program, native, {"X": x}, functional=True)
    np.testing.assert_allclose(run.output.reshape(rows * k, native), np.maximum(np.tanh(x), 0), rtol=1e-6, atol=1e-6)
    assert run.cycles == simulate(program, native, None, functional=False).cycles
    monkeypatch.setattr(Codegen, "rows_streamed", lambda self, stages: stages)
    whole = simulate(generate(tanh_rows_stored_program(rows, k), SNOWFLAKE), native, None, functional=False)
    tanh = SNOWFLAKE.op_by_name["sf.tanh"]
    assert whole.cycles - run.cycles >= (rows - 1) * k * tanh.occupancy


def test_rows_shorter_than_the_latency_are_not_computed_in_the_storing_loop():
    """Where a row's tanh take fewer cycles than a tanh's latency, the MAX after them would wait
    on every row: the tanh stay one loop over all rows, before the loop that stores."""
    rows, k = 16, 4
    assert k * SNOWFLAKE.op_by_name["sf.tanh"].occupancy < SNOWFLAKE.op_by_name["sf.tanh"].latency
    program = generate(tanh_rows_stored_program(rows, k), SNOWFLAKE)
    top = [(item.count, [ins.mnemonic for ins in item.body if isinstance(ins, Instr)])
           for item in program.body if isinstance(item, Loop)]
    assert (rows * k, ["TANH"]) in top
