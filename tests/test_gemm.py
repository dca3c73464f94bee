"""GEMM in DeepBench's convention (C = op(A) . op(B), either operand stored transposed): the
frontend layer, its errors, and runs on brainwave."""

from __future__ import annotations

import pytest

from egraph_rules.saturate import Budget
from frontend.layers import LayerError, build_model, parse_layer
from liftsat.api import optimize
from liftsat.targets import get_target


@pytest.mark.parametrize("layer, stored", [
    ("MatMul(64, 32)", (5, 64)),
    ("MatMul(64, 32, a_t=True)", (64, 5)),
    ("MatMul(64, 32, b_t=True)", (5, 64)),
    ("MatMul(64, 32, a_t=True, b_t=True)", (64, 3)),
])
def test_gemm_with_either_operand_transposed_runs_on_brainwave(layer, stored):
    r = optimize([layer], stored, native_dim=32)
    rows = stored[1] if "a_t=True" in layer else stored[0]
    assert r.output_shape == (rows, 32)
    assert r.max_rel_error <= 1e-4
    assert r.ops["mv_mul"] > 0


@pytest.mark.parametrize("layers, stored, message", [
    (["MatMul(64, 32)", "ReLU()"], (5, 64), "must be the only layer"),
    (["MatMul(64, 32)"], (5, 60), "no dimension of 64 features"),
    (["MatMul(64, 32, a_t=True)"], (5, 64), "no dimension of 64 features"),
    (["MatMul(64, 32, a_t=1)"], (64, 5), "a_t must be True or False"),
])
def test_bad_gemms_are_named(layers, stored, message):
    with pytest.raises(LayerError, match=message):
        build_model([parse_layer(s) for s in layers], stored)


def test_partial_sums_that_overflow_are_not_extracted():
    """Computing whole rows of partial sums would be predicted cheaper for this DeepBench
    training GEMM on snowflake, but 160 tiles x 2560 partial sums (1.6 MB) overflow its 512 KiB mbuf:
    extraction must pass over those programs, so the one it picks lays out and runs. (Its
    saturation reaches the iteration limit in about 10 s; the seconds budget is left room so
    that the machine's speed does not decide where it stops.)"""
    r = optimize(["MatMul(2560, 2560, a_t=True, b_t=True)"], (2560, 64), "snowflake", functional=False,
                 budget=Budget(seconds=120))
    assert not r.unbuildable
    assert r.cycles == pytest.approx(r.predicted_cycles, rel=0.01)


def test_values_that_overflow_together_are_retried_with_less_room():
    """On VTA the cheapest programs of this DeepBench training convolution keep a band of
    results (100 KB) and one pixel's partial products (38 KB) in the 128 KiB accumulator at
    once; each fits alone, so extraction is retried with less room per value until one lays out."""
    r = optimize(["Conv2d(192, 32, (5, 5), stride=(1, 1), padding=(2, 2))"], (16, 192, 28, 28), "vta",
                 functional=False)
    assert r.unbuildable and all("vta.acc overflow" in u for u in r.unbuildable)
    assert r.cycles > 0


@pytest.mark.parametrize("layer, stored", [
    ("MatMul(256, 256)", (1, 256)),
    ("MatMul(256, 256, a_t=True, b_t=True)", (256, 2)),
])
@pytest.mark.parametrize("target", ["brainwave", "vta"])
def test_gemm_weights_that_fit_are_pinned(layer, stored, target):
    """A GEMM's second operand is a weight: each row goes through a bias-free Linear layer, so
    when the weight fits on chip it is loaded once at setup, not re-read from DRAM per row."""
    r = optimize([layer], stored, target)
    assert r.weights == {"B": "pinned"}
    assert r.max_rel_error <= 1e-4
    assert r.setup_cycles > 0
    # reading the 256 KiB weight from DRAM alone would take longer than the whole inference
    assert r.cycles < 256 * 256 * 4 / get_target(target).dram.bandwidth
