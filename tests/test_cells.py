"""Recurrent cells (GRUCell, LSTMCell): frontend checks, end-to-end runs on brainwave and the
other targets, cells in blocks of hidden units, and the stacked-gates equivalence in the
e-graph."""

from __future__ import annotations

import pytest

from egraph_rules.ir import T, comp, ta, tensor_type, tp, ts
from egraph_rules.saturate import Budget, EGraphError, Saturator
from frontend.layers import LayerError, build_model, parse_layer
from liftsat import api
from liftsat.api import optimize
from liftsat.rulesets import rules_for
from liftsat.targets import get_target

F32 = ts("f32")


def model(layers: list[str], shape: tuple[int, int]):
    return build_model([parse_layer(s) for s in layers], shape)


@pytest.mark.parametrize("layers, shape, message", [
    (["GRUCell(8, 4)", "GRUCell(4, 4)"], (1, 8), "only one recurrent cell"),
    (["LSTMCell(8, 4)", "ReLU()"], (1, 8), "must be the last layer"),
    (["GRUCell(6, 4)"], (1, 8), "expects 6 input features, but receives 8"),
    (["GRUCell(8, 0)"], (1, 8), "hidden_size must be a positive integer"),
])
def test_bad_cell_stacks_are_named(layers, shape, message):
    with pytest.raises(LayerError, match=message):
        model(layers, shape)


def test_lstm_cell_returns_hidden_and_cell_state():
    m = model(["LSTMCell(8, 4)"], (1, 8))
    assert m.output_shape == (2, 1, 4)
    assert m.reference.shape == (2, 1, 4)


@pytest.fixture(scope="module")
def gru_batch3():
    return optimize(["GRUCell(64, 32)"], (3, 64), native_dim=32)


def test_gru_cell_runs_on_brainwave(gru_batch3):
    r = gru_batch3
    assert r.output_shape == (3, 32)
    assert r.max_rel_error <= 1e-4
    for op in ("mv_mul", "vv_a_sub_b", "v_sigm", "v_tanh", "vv_mul"):
        assert r.ops.get(op, 0) > 0, op
    assert r.egraph.saturated


@pytest.mark.parametrize("target", ["snowflake", "vta", "systolic"])
@pytest.mark.parametrize("layer, shape", [("GRUCell(40, 24)", (3, 40)), ("GRU(32, 32)", (3, 2, 32))])
def test_gru_runs_on_targets_without_a_subtraction(target, layer, shape):
    """h' = n + z (h - n): where the device has no subtraction, h - n runs as an add and a
    multiply by a pinned constant of -1s (`sub-as-negated-add`, `Fill`). On the systolic array
    the three gates' weight tiles do not fit its two-tile mesh side by side; they lay out
    because tiles whose lifetimes do not overlap share it."""
    assert not any(op.meaning.op == "VVSub" for op in get_target(target).device_ops())
    r = optimize([layer], shape, target)
    assert r.max_rel_error <= 1e-4
    mul = {"snowflake": "MUL", "vta": "ALU.MUL", "systolic": "acc_mul"}[target]
    assert r.ops[mul] > 0


def test_lstm_cell_runs_on_brainwave():
    r = optimize(["LSTMCell(32, 32)"], (1, 32), native_dim=32)
    assert r.output_shape == (2, 1, 32)
    assert r.max_rel_error <= 1e-4
    assert r.ops["v_tanh"] == 2 and r.ops["v_sigm"] == 3


def _blocked(term) -> bool:
    """Whether a program reads weight_ih laid out block by block of hidden units (the host
    re-indexing of lstmcell-hidden-blocks and grucell-hidden-blocks ends in a Transpose)."""
    return any(t.op == "App" and t.args[1].op == "Var" and t.args[1].args[0] == "Wih0"
               and any(u.op == "Transpose" for u in t.args[0].walk()) for t in term.walk())


def _small_accumulator():
    """The systolic array with a 1 Ki-element accumulator: LSTM(256)'s four 256-element gate
    vectors fill it, and GRU(352)'s three 352-element ones."""
    return get_target("systolic").with_memory("gm.acc", capacity=1024 * 4)


@pytest.mark.parametrize("layer, shape", [("LSTMCell(256, 256)", (2, 256)), ("LSTM(256, 256)", (3, 2, 256))])
def test_an_lstm_whose_gates_fill_the_accumulator_runs_in_blocks_of_hidden_units(layer, shape):
    """Where the four gate vectors fill the result memory, the cell runs block by block of 16
    hidden units (lstmcell-hidden-blocks, 1024 / 64), right against numpy; on the systolic array
    itself the same cell runs over whole gate vectors."""
    r = optimize([layer], shape, _small_accumulator())
    assert r.max_rel_error <= 1e-4
    assert _blocked(r.term)
    whole = optimize([layer], shape, "systolic")
    assert whole.max_rel_error <= 1e-4 and not _blocked(whole.term)


def test_lstm_4096_runs_on_the_systolic_array():
    """LSTM(4096)'s step over whole gate vectors needs 224 KiB of the 64 KiB accumulator, and no
    program could be laid out; in blocks of 256 hidden units it runs, predicted within 1%."""
    r = optimize(["LSTMCell(4096, 4096)"], (1, 4096), "systolic", functional=False)
    assert _blocked(r.term)
    assert abs(r.predicted_cycles / r.cycles - 1) <= 0.01


def _grown(monkeypatch) -> list[bool]:
    """Records, for each e-graph a target's programs are grown in, whether its cells were forced
    into blocks of hidden units."""
    grown: list[bool] = []
    saturate = api.SharedEGraph.saturate

    def recorded(self, target, staged=True, blocked_cells=False):
        grown.append(blocked_cells)
        return saturate(self, target, staged, blocked_cells)

    monkeypatch.setattr(api.SharedEGraph, "saturate", recorded)
    return grown


@pytest.mark.parametrize("layer, shape", [("GRUCell(352, 352)", (2, 352)), ("GRU(352, 352)", (3, 2, 352))])
def test_a_gru_whose_gates_fill_the_accumulator_runs_in_blocks_of_hidden_units(layer, shape, monkeypatch):
    """Where the three gate vectors fill the result memory, the cell runs as one Map over blocks
    of 16 hidden units of h' = n + z (h - n) (grucell-hidden-blocks), right against numpy, from
    the first e-graph grown: its guard chose the blocks, not a retry."""
    grown = _grown(monkeypatch)
    r = optimize([layer], shape, _small_accumulator())
    assert r.max_rel_error <= 1e-4
    assert _blocked(r.term) and grown == [False]


def test_a_cell_whose_whole_vector_step_does_not_fit_is_compiled_again_in_blocks(monkeypatch):
    """GRUCell(288)'s gate vectors take 864 of the 1 Ki-element accumulator, so it is lowered
    over whole vectors first, but the step keeps more of them live than fit: no such program
    lays out. The e-graph is grown again with the cell in blocks of hidden units, and that
    program runs, right against numpy (on the real systolic array: GRU(4096))."""
    grown = _grown(monkeypatch)
    r = optimize(["GRUCell(288, 288)"], (1, 288), _small_accumulator())
    assert r.max_rel_error <= 1e-4
    assert _blocked(r.term) and grown[0] is False and grown[-1] is True
    assert r.unbuildable and all("overflow" in u for u in r.unbuildable)


@pytest.mark.parametrize("layer, shape, retried", [
    ("GRU(4096, 4096)", (2, 4, 4096), True),    # 3 x 4096 < 16 Ki: whole vectors first, then blocks of 256
    ("LSTM(3072, 3072)", (2, 4, 3072), True),
    ("LSTM(4096, 4096)", (2, 4, 4096), False),  # its gates fill the accumulator: in blocks from the start
    ("GRU(3000, 3000)", (2, 1, 3000), False),   # no block size (256 .. 16) divides 3000
    ("Linear(64, 64)", (1, 64), False),
])
def test_only_a_cell_that_could_run_in_blocks_is_compiled_again_in_blocks(layer, shape, retried):
    term = build_model([parse_layer(layer)], shape, values=False).term
    systolic = get_target("systolic")
    assert api._attempts(term, systolic) == [(True, False), (False, False)] + (
        [(True, True), (False, True)] if retried else [])


def _gate_and_stacked(nh: int):
    """GRUCell(8, nh) saturated at native size 4, its statistics, and two terms: the r gate's
    product, and the first nh rows of the product with the r and z blocks stacked."""
    ni = 8
    m = model([f"GRUCell({ni}, {nh})"], (1, ni))
    pair = tp(ta(F32, ni), ta(F32, nh))
    w = T("Var", "Wih0", tensor_type("f32", (3 * nh, ni)))

    def product(start: int, rows: int):
        block = T("Const", T("App", T("Slice", start, rows, w.args[1]), w), pair)
        return comp(T("MVMul", tp(tensor_type("f32", (rows, ni)), ta(F32, ni))), T("Fork", block, T("Fst", pair)))

    gate_r = product(0, nh)
    stacked_r = T("Comp", T("Slice", 0, nh, ta(F32, 2 * nh)), product(0, 2 * nh))
    sat = Saturator(rules_for([get_target("brainwave", 4)]))
    sat.add("root", m.term)
    stats = sat.run(Budget(nodes=200_000, iterations=8, seconds=60))
    return sat, stats, gate_r, stacked_r


def test_gate_products_are_slices_of_one_stacked_product():
    """The products of x with the r and z blocks of weight_ih are, in the e-graph, slices of one
    product with the two blocks stacked (the ISA-Mapper-style merge). At native size 4, 6-row
    blocks end in a partial tile, which stacking packs."""
    sat, stats, gate, stacked = _gate_and_stacked(6)
    graph = sat.serialize({"gate": gate, "stacked": stacked}, stats)
    assert graph.roots["gate"] == graph.roots["stacked"]


def test_blocks_of_whole_tiles_are_not_stacked():
    """8-row gate blocks at native size 4 fill whole tiles: stacked they are the same tiles, so
    the merge does not build the stacked product (unguarded, it doubled the e-graphs of GRU and
    LSTM steps at DeepBench sizes for no program)."""
    sat, stats, _, stacked = _gate_and_stacked(8)
    with pytest.raises(EGraphError, match="not found in the serialized e-graph"):
        sat.serialize({"stacked": stacked}, stats)


def test_the_extractor_picks_the_stacked_product_when_it_is_cheaper():
    """GRUCell(64, 64) at native size 128: each gate's 64 rows would fill a 128-row tile of its own
    (3 tiles per product, 6 mv_mul), while the three gates stacked are 192 rows, 2 tiles (4
    mv_mul). The extracted program runs the stacked products; programs with per-gate products
    are among the alternatives and are predicted no cheaper."""
    r = optimize(["GRUCell(64, 64)"], (1, 64), alternatives=4)
    assert r.ops["mv_mul"] == 4 and r.max_rel_error <= 1e-4
    unstacked = [a for a in r.alternatives if a.ops["mv_mul"] > 4]
    assert unstacked and all(a.predicted_cycles >= r.predicted_cycles for a in unstacked)
    assert all(a.max_rel_error <= 1e-4 for a in r.alternatives)


def test_a_cell_inside_a_layer_stack():
    """Layers before the cell feed its input; the cell's output feeds the layers after it."""
    r = optimize(["Linear(40, 64)", "Tanh()", "GRUCell(64, 32)", "Linear(32, 8)"], (2, 40), native_dim=32)
    assert r.output_shape == (2, 8)
    assert r.max_rel_error <= 1e-4


@pytest.mark.parametrize("layers, shape", [
    (["GRUCell(100, 70)"], (2, 100)),
    (["LSTMCell(100, 70)"], (1, 100)),
    (["ReLU()"], (1, 1000)),
])
def test_sizes_that_are_not_a_multiple_of_the_native_dim(layers, shape):
    """Computed vectors are zero padded on chip (a mask multiply) where the rules pad them."""
    r = optimize(layers, shape)
    assert r.max_rel_error <= 1e-4
    assert r.egraph.saturated
