"""The vendor baseline: each target's fixed template builds a device program without the
e-graph; it runs, matches numpy, is what its template says, and refuses what it does not cover."""

from __future__ import annotations

from dataclasses import replace

import pytest

from egraph_rules.ir import shape_of, ty
from frontend.layers import build_model
from liftsat.targets import BUILTIN, get_target
from liftsat.vendor import TEMPLATES, VendorUnsupported, vendor, vendor_program

#: (layers, input): batch 1 and more, sizes no native size divides, fused activations, a GEMM
#: stored transposed both ways, small convolutions (padded, strided and grouped, batch 2), an
#: activation alone
CASES = [
    (["Linear(50, 37)", "ReLU()"], (5, 50)),
    (["Linear(48, 20)", "Tanh()"], (1, 48)),
    (["Linear(20, 20, bias=False)", "Sigmoid()"], (2, 20)),
    (["MatMul(40, 24, a_t=True, b_t=True)"], (40, 3)),
    (["MatMul(40, 24)"], (3, 40)),
    (["Conv2d(3, 8, 3, padding=1)", "ReLU()"], (2, 3, 6, 6)),
    (["Conv2d(4, 6, 3, stride=2, groups=2)"], (1, 4, 7, 7)),
    (["ReLU()"], (3, 50)),
]


@pytest.mark.parametrize("target", sorted(BUILTIN))
@pytest.mark.parametrize("layers, shape", CASES)
def test_vendor_programs_match_numpy(target, layers, shape):
    r = vendor(layers, shape, target)
    assert r.max_rel_error < 1e-5, (target, layers, r.max_rel_error)
    assert shape_of(ty(r.term)) and r.cycles > 0


def test_every_builtin_target_has_a_template():
    assert set(TEMPLATES) == set(BUILTIN)


def test_brainwave_is_the_firmware_fc_pattern():
    """Per row, per output tile: one mv_mul per weight tile, vv_add to accumulate and add the
    bias, one activation and one write per output tile, the row's input tiles read once."""
    layers, rows, k, o = ["Linear(256, 200)", "ReLU()"], 3, 2, 2  # 256 inputs, 200 outputs: 2 x 2 tiles of 128
    r = vendor(layers, (rows, 256), "brainwave")
    assert r.plan.weights == "pinned" and r.plan.band == 1 and r.plan.bands == rows
    assert r.ops == {"mv_mul": rows * o * k, "vv_add": rows * o * k, "v_relu": rows * o, "v_wr": rows * o,
                     "v_rd": rows * k}
    streamed = vendor(["Linear(2048, 2048)"], (1, 2048), "brainwave", functional=False)  # 16 MiB > the MRF
    assert streamed.plan.weights == "streamed" and streamed.ops["m_rd"] == streamed.ops["mv_mul"] == 16 * 16


def test_systolic_preloads_each_weight_tile_once_per_band():
    for shape, bands in (((5, 50), 1), ((16, 1024), 3)):
        r = vendor([f"Linear({shape[1]}, {shape[1]})"], shape, "systolic", functional=False)
        tiles = (-(-shape[1] // 16)) ** 2
        assert r.plan.bands == bands
        assert r.ops["preload"] == tiles * bands
        assert r.ops["compute"] == tiles * r.plan.band * bands


def test_vendor_is_deterministic():
    a, b = (vendor(["Conv2d(3, 8, 3, padding=1)", "ReLU()"], (1, 3, 6, 6), "vta") for _ in range(2))
    assert a.term == b.term and a.cycles == b.cycles and a.program.listing() == b.program.listing()


def test_layers_without_a_template_are_refused_by_name():
    with pytest.raises(VendorUnsupported, match=r"MaxPool2d\(3, stride=2\).*on snowflake"):
        vendor(["MaxPool2d(3, stride=2)"], (1, 4, 9, 9), "snowflake")
    with pytest.raises(VendorUnsupported, match="one Linear, MatMul or Conv2d.*on cpu"):
        vendor(["Linear(8, 8)", "ReLU()", "Linear(8, 8)"], (1, 8), "cpu")
    with pytest.raises(VendorUnsupported, match="no vendor template for target mine"):
        vendor_program(build_model(["Linear(8, 8)"], (1, 8)), replace(get_target("cpu"), name="mine"))
