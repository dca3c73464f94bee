"""The whole pipeline through `liftsat.optimize`: saturation, extraction, codegen, simulation,
checked against numpy. The large optimizations run once per module (fixtures)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from egraph_rules.interpreter import Interpreter
from egraph_rules.ir import numel, ta, ts, ty
from egraph_rules.saturate import Budget
from frontend.layers import LayerError, build_model, parse_layer
from liftsat import api, optimize
from liftsat.targets import TargetError, get_target

FC = ["Linear(1024, 1000)", "ReLU()"]


@pytest.fixture(scope="module")
def fc128():
    return optimize(FC, (1, 1024), target="brainwave")


@pytest.fixture(scope="module")
def fc128_again():
    return optimize(FC, (1, 1024), target="brainwave")


@pytest.fixture(scope="module")
def fc64():
    return optimize(FC, (1, 1024), target="brainwave", native_dim=64)


@pytest.fixture(scope="module")
def fc128_batch16():
    return optimize(FC, (16, 1024), target="brainwave")


def _check_accuracy(r, shape):
    assert r.output_shape == shape
    assert r.output.shape == shape and r.reference.shape == shape
    assert r.max_rel_error <= 1e-4
    np.testing.assert_allclose(r.output, r.reference, rtol=1e-4, atol=1e-4 * float(np.abs(r.reference).max()))


# ---------------------------------------------------------------- Linear(1024, 1000) + ReLU on BrainWave


def test_fc_is_accurate(fc128):
    _check_accuracy(fc128, (1, 1000))
    assert (fc128.output >= 0).all()
    assert fc128.target == "brainwave" and fc128.layers == FC and fc128.input_shape == (1, 1024)


def test_fc_uses_the_native_matrix_unit(fc128):
    tiles = math.ceil(1000 / 128) * math.ceil(1024 / 128)
    assert fc128.ops["mv_mul"] == tiles
    assert fc128.ops["v_relu"] == math.ceil(1000 / 128)
    assert "128x128" in fc128.listing
    assert "mv_mul" in fc128.listing


def test_fc_program_keeps_loops(fc128):
    assert "loop" in fc128.listing
    assert fc128.instructions * 4 < fc128.dynamic_instructions
    assert fc128.dynamic_instructions == sum(fc128.ops.values())


def test_fc_pins_its_weights(fc128):
    assert fc128.weights == {"W0": "pinned", "b0": "pinned"}
    assert fc128.setup_cycles > 0
    assert "m_rd" not in fc128.ops  # no weight traffic per inference


def test_fc_cycles_and_efficiency(fc128):
    model = build_model([parse_layer(t) for t in FC], (1, 1024))
    assert fc128.roofline_cycles == max(model.macs / 2048, model.io_bytes / 64)
    assert 0 < fc128.efficiency <= 1.5
    assert fc128.efficiency == pytest.approx(fc128.roofline_cycles / fc128.cycles)
    assert 0 < fc128.predicted_cycles < math.inf
    assert fc128.cycles >= fc128.roofline_cycles * 0.5


def test_fc_egraph_statistics(fc128):
    e = fc128.egraph
    assert 0 < e.eclasses <= e.enodes
    assert e.iterations > 0 and e.seconds >= 0
    assert e.saturated == (e.stop_reason == "saturated")
    assert fc128.extract_seconds >= 0


def test_fc_term_has_the_type_of_the_layer(fc128):
    assert ty(fc128.term) == ta(ts("f32"), 1000)
    assert {t.op for t in fc128.term.walk()} >= {"Dev", "ToOutput"}
    assert not {"Linear", "MVMul", "VVRelu"} & {t.op for t in fc128.term.walk()}


def test_fc_term_means_the_layer(fc128):
    """The extracted term, evaluated by the reference interpreter, is the numpy reference too."""
    model = build_model([parse_layer(t) for t in FC], (1, 1024))
    meanings = {op.name: op.meaning for op in get_target("brainwave").device_ops()}
    value = Interpreter(model.env, meanings).value(fc128.term)
    np.testing.assert_allclose(np.asarray(value).reshape(1, 1000), model.reference, rtol=1e-4, atol=1e-5)


def test_determinism(fc128, fc128_again):
    assert fc128.term == fc128_again.term
    assert fc128.cycles == fc128_again.cycles
    assert fc128.predicted_cycles == fc128_again.predicted_cycles
    assert fc128.listing == fc128_again.listing
    np.testing.assert_array_equal(fc128.output, fc128_again.output)


def test_native_dim_64(fc64, fc128):
    _check_accuracy(fc64, (1, 1000))
    assert fc64.target == "brainwave64"
    assert fc64.ops != fc128.ops
    assert fc64.ops["mv_mul"] == math.ceil(1000 / 64) * (1024 // 64)
    assert "64x64" in fc64.listing and "128x128" not in fc64.listing


def test_batch_16(fc128_batch16, fc128):
    _check_accuracy(fc128_batch16, (16, 1000))
    assert fc128_batch16.ops["mv_mul"] == 16 * fc128.ops["mv_mul"]
    assert 0 < fc128_batch16.efficiency <= 1.5
    assert fc128_batch16.efficiency > fc128.efficiency  # batching amortizes the fixed latencies


def test_as_dict_is_json(fc128):
    d = json.loads(json.dumps(fc128.as_dict()))
    assert d["output_shape"] == [1, 1000] and d["ops"] == fc128.ops and d["cycles"] == fc128.cycles


# ---------------------------------------------------------------- small layers at native 32 (fast)


SMALL = [
    (["Linear(64, 32)"], (1, 64)),
    (["Linear(100, 50)"], (1, 100)),
    (["Linear(40, 70, bias=False)", "Sigmoid()"], (1, 40)),
    (["Linear(32, 64)", "ReLU()", "Linear(64, 32)", "Tanh()"], (3, 32)),
    (["Sigmoid()", "Linear(64, 64, bias=False)"], (1, 64)),
    (["Tanh()"], (2, 64)),
    (["Linear(64, 100)", "ReLU()"], (2, 64)),
    (["Residual(Linear(64, 64), ReLU())"], (1, 64)),
    (["Linear(40, 48)", "Residual(Linear(48, 48), Tanh(), Linear(48, 48, bias=False))", "Sigmoid()"], (3, 40)),
    (["Residual(Residual(Linear(16, 16)), ReLU())", "Flatten()", "Linear(16, 4)"], (2, 16)),
]


@pytest.mark.parametrize("layers, shape", SMALL, ids=lambda v: "+".join(v) if isinstance(v, list) else "x".join(
    map(str, v)))
def test_small_layers(layers, shape):
    r = optimize(layers, shape, native_dim=32)
    _check_accuracy(r, build_model([parse_layer(t) for t in layers], shape).output_shape)
    assert r.cycles > 0 and r.cycles >= r.roofline_cycles * 0.5


@pytest.mark.parametrize("target", ["snowflake", "cpu"])
def test_residual_block_on_other_targets(target):
    r = optimize(["Residual(Linear(16, 16), ReLU())", "Linear(16, 4)"], (2, 16), target=target)
    _check_accuracy(r, (2, 4))


def test_batched_layer_with_features_not_a_multiple_of_the_native_dim():
    """BUG: with batch > 1, the input's padding is extracted inside the loop over rows, where
    codegen cannot pad (`CodegenError: Pad of a computed value`); batch 1 of the same layer works."""
    optimize(["Linear(3, 4)"], (1, 3), native_dim=4)
    r = optimize(["Linear(3, 4)"], (2, 3), native_dim=4)
    _check_accuracy(r, (2, 4))


def test_seed_changes_data_not_program():
    a = optimize(["Linear(64, 32)", "ReLU()"], (1, 64), native_dim=32, seed=1)
    b = optimize(["Linear(64, 32)", "ReLU()"], (1, 64), native_dim=32, seed=2)
    assert a.term == b.term and a.cycles == b.cycles
    assert not np.array_equal(a.output, b.output)


def test_weights_that_do_not_fit_are_streamed():
    small = get_target("brainwave", 32).with_memory("bw.mrf", capacity=2 * 32 * 32 * 4)   # two tiles, W0 needs four
    r = optimize(["Linear(64, 64)"], (1, 64), target=small)
    _check_accuracy(r, (1, 64))
    assert r.weights["W0"] == "streamed"
    assert r.ops["m_rd"] == 4
    pinned = optimize(["Linear(64, 64)"], (1, 64), native_dim=32)
    assert pinned.weights["W0"] == "pinned" and "m_rd" not in pinned.ops
    assert pinned.cycles < r.cycles


def test_a_contraction_too_long_for_the_chip_is_streamed_through_a_fold():
    """1024 / 32 partial products of 32 elements per output row do not fit in a 2 KiB vector
    register file together: reduce-map-to-fold makes the reduction consume each product as it is
    computed (a Fold from a vector of zeros), and the input row is loaded a chunk at a time."""
    base = get_target("brainwave", 32)
    small = base.with_memory("bw.vrf", capacity=16 * 32 * 4)
    r = optimize(["MatMul(1024, 32)"], (2, 1024), target=small)
    _check_accuracy(r, (2, 32))
    folds = [t for t in r.term.walk() if t.op == "Fold"]
    assert folds and all(f.args[1].args[1].args[1] == 1024 // 32 for f in folds)
    assert any(t.op == "Fill" and t.args[0] == 0.0 for t in r.term.walk())
    roomy = optimize(["MatMul(1024, 32)"], (2, 1024), target=base)
    _check_accuracy(roomy, (2, 32))
    assert not any(t.op == "Fold" for t in roomy.term.walk())   # the products fit: no Fold is offered


def test_a_folds_steps_are_double_buffered_where_memory_allows():
    """The streamed contraction above with room for one weight tile: the two steps per trip of
    its Fold share that tile's memory (each load waits for the other step's read); with room for
    two they keep one each, and the same program runs faster."""
    base = get_target("brainwave", 32)
    runs = {}
    for tiles in (1, 2):
        small = base.with_memory("bw.vrf", capacity=16 * 32 * 4).with_memory("bw.mrf", capacity=tiles * 32 * 32 * 4)
        runs[tiles] = optimize(["MatMul(1024, 32)"], (2, 1024), target=small)
        _check_accuracy(runs[tiles], (2, 32))
        assert runs[tiles].program.memory_sizes["bw.mrf"] == tiles * 32 * 32
    assert runs[1].term == runs[2].term
    assert runs[2].cycles < 0.6 * runs[1].cycles


def test_max_pooling_reduces_a_row_of_windows_per_step():
    """Each step of a max pool's reduction takes the maximum over at least a whole output row of
    windows (map-reduce-interchange-moved), so on VTA, whose ALU results take 48 cycles, the
    steps no longer wait for each other."""
    small = optimize(["MaxPool2d(3, stride=2)"], (1, 16, 11, 11), target="vta")
    _check_accuracy(small, (1, 16, 5, 5))
    alexnet = optimize(["MaxPool2d(3, stride=2)"], (1, 64, 55, 55), target="vta", functional=False)
    for r, pixels, channels in ((small, 5, 16), (alexnet, 27, 64)):
        [reduce] = [t for t in r.term.walk() if t.op == "Reduce"]
        taps, n = reduce.args[1].args[0], reduce.args[1].args[1]
        assert n == 9 and numel(taps) >= pixels * channels   # 9 taps, each at least a row of windows
    assert alexnet.cycles < 60_000                            # 169,717 with a reduction per window
    assert abs(alexnet.predicted_cycles / alexnet.cycles - 1) <= 0.10, (alexnet.predicted_cycles, alexnet.cycles)


def test_a_reduction_too_large_to_move_whole_keeps_its_accumulator_on_chip():
    """AlexNet's max pool on the systolic array: an output row's 9 rows of 27 windows (62,208
    bytes) fit in its 64 KiB accumulator, but not with their maxima. The reduction becomes a Fold
    from the first row (reduce-accumulator-on-chip) that moves one row per step, and the model
    charges what codegen emits, one move per row (as a Reduce moving both operands, it charged
    two: predicted 75,600 cycles, simulated 52,588)."""
    r = optimize(["MaxPool2d(3, stride=2)"], (1, 64, 55, 55), target="systolic")
    _check_accuracy(r, (1, 64, 27, 27))
    folds = [t for t in r.term.walk() if t.op == "Fold"]
    assert len(folds) == 1 and folds[0].args[1].args[1].args[1] == 8   # the 8 taps after the first
    assert r.ops["mvin"] == 27 * 9 * 27 * 64 // 16                      # every window row moved once
    assert abs(r.predicted_cycles / r.cycles - 1) <= 0.10, (r.predicted_cycles, r.cycles)


def test_systolic_weights_stay_in_the_scratchpad_and_are_preloaded_per_use():
    """Linear(256, 256) at batch 1: its weights fit in the systolic array's scratchpad but not in
    its mesh. The load through the scratchpad is split (tochip-staged), the move into the
    scratchpad is pinned at setup and each use only preloads its block from there (Restage)."""
    r = optimize(["Linear(256, 256)"], (1, 256), target="systolic")
    _check_accuracy(r, (1, 256))
    assert r.weights == {"W0": "pinned", "b0": "pinned"}
    assert any(t.op == "Restage" for t in r.term.walk())
    assert r.ops["preload"] == r.ops["compute"] == 256                # one preload per block used
    assert r.ops["mvin"] == 256 // 16                                 # per inference only the input moves in
    assert r.cycles < 6_000
    assert abs(r.predicted_cycles / r.cycles - 1) <= 0.10, (r.predicted_cycles, r.cycles)


def test_when_no_split_program_lays_out_the_target_is_grown_again_without_the_split(monkeypatch):
    """The programs of loads split through a staging memory can fill every candidate codegen
    tries (a GRU(2816) step on the systolic array overflows its accumulator with all of them);
    then the e-graph is grown again without the split."""
    systolic = get_target("systolic")
    assert "tochip-staged" in {r.name for r in api.target_rules(systolic)}
    assert "tochip-staged" not in {r.name for r in api.target_rules(systolic, staged=False)}
    assert "tochip-staged" not in {r.name for r in api.target_rules(get_target("vta"))}   # no staging memory
    splits, real = [], api._lay_out

    def first_lays_out_nothing(graph, *args):
        splits.append(graph.stats.matches_per_rule.get("tochip-staged", 0))
        return (None, None) if len(splits) == 1 else real(graph, *args)

    monkeypatch.setattr(api, "_lay_out", first_lays_out_nothing)
    r = optimize(["Linear(64, 48)"], (1, 64), target="systolic")
    assert splits[0] > 0 and splits[1] == 0 and r.max_rel_error < 1e-4
    assert not any(t.op == "Restage" for t in r.term.walk())


def test_weights_that_fit_alone_but_not_together_are_pinned_within_a_budget(monkeypatch):
    """Five 32x32 weights of one tile each and a matrix register file of four tiles: each weight
    fits in any share extraction is retried with (a quarter), but pinned together at setup they
    overflow it. The retry with a budget of three quarters for pinned constants pins three and
    reads the other two where they are used, faster than the last retry, which pins none."""
    small = get_target("brainwave", 32).with_memory("bw.mrf", capacity=4 * 32 * 32 * 4)
    r = optimize(["Linear(32, 32)", "ReLU()"] * 5, (1, 32), target=small)
    _check_accuracy(r, (1, 32))
    weights = [r.weights[f"W{2 * i}"] for i in range(5)]
    assert sorted(weights) == ["pinned"] * 3 + ["streamed"] * 2 and r.ops["m_rd"] == 2 and r.setup_cycles > 0
    assert r.unbuildable and all("bw.mrf overflow" in u for u in r.unbuildable)
    monkeypatch.setattr(api, "ROOM", api.ROOM[-1:])
    none = optimize(["Linear(32, 32)", "ReLU()"] * 5, (1, 32), target=small)
    _check_accuracy(none, (1, 32))
    assert set(none.weights.values()) == {"streamed"} and none.setup_cycles == 0 and none.ops["m_rd"] == 5
    assert r.cycles < none.cycles


def test_pinned_budgets_are_tried_after_less_room_per_value_has_no_program(monkeypatch):
    """A GRU(64) step on a systolic array whose accumulator holds ten 64-element vectors: its six
    biases pinned at setup leave too little for the gate vectors, and with a quarter of the
    accumulator per value there is no program at all. The budgets for pinned constants are
    still tried (at the last room that had a program), and one pins part of the biases. No
    extraction runs twice: each budget starts from the program found without one."""
    small = get_target("systolic").with_memory("gm.acc", capacity=10 * 64 * 4)
    runs, real = [], api.extract

    def counted(graph, target, extractor="greedy", time_limit=10.0, unpinned=frozenset()):
        runs.append((target.value_room, target.pinned_room, unpinned))
        return real(graph, target, extractor, time_limit, unpinned)

    monkeypatch.setattr(api, "extract", counted)
    r = optimize(["GRU(64, 64)"], (1, 2, 64), target=small)
    assert len(runs) == len(set(runs)) and any(unpinned for _, _, unpinned in runs)
    _check_accuracy(r, (2, 64))  # the last step's hidden state
    assert r.program.memory_sizes["gm.acc"] <= 10 * 64
    assert "partly pinned" in (r.weights["bih0"], r.weights["bhh0"])
    assert r.unbuildable and all("gm.acc overflow" in u for u in r.unbuildable)
    assert any("bytes live at once" in u for u in r.unbuildable)  # over capacity whatever the plan: none tried


def test_budget_stop_still_gives_a_correct_program():
    r = optimize(["Linear(64, 64)", "ReLU()"], (1, 64), native_dim=32, budget=Budget(iterations=5))
    assert not r.egraph.saturated
    assert r.egraph.stop_reason == "iteration limit (5)"
    assert 5 < r.egraph.iterations <= 10  # the shared phase's iterations, then the target's 5
    _check_accuracy(r, (1, 64))
    r = optimize(["Linear(64, 64)", "ReLU()"], (1, 64), native_dim=32, budget=Budget(nodes=500))
    assert r.egraph.stop_reason.startswith("node limit")
    _check_accuracy(r, (1, 64))


@pytest.mark.parametrize("call, error", [
    (lambda: optimize(["Linear(8, 4)"], (1, 16)), LayerError),
    (lambda: optimize(["Linear(8, 4)"], (1, 8), target="tpu"), TargetError),
    (lambda: optimize(["Linear(8, 4)"], (1, 8), native_dim=0), TargetError),
    (lambda: optimize(["Conv2d(8, 4)"], (1, 8)), LayerError),
])
def test_bad_requests(call, error):
    with pytest.raises(error):
        call()
