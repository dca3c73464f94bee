"""Every built-in target runs every layer the frontend has: Linear (with and without bias, batch 1
and more), ReLU, Tanh, Sigmoid and a GEMM, functionally (checked against numpy) and timing-only
(the same cycles), and a DeepBench inference GEMM at full size in timing-only mode. Listings use
only the target's own mnemonics. Also: staged loads (a memory loaded from another on-chip
memory, as the systolic array's preload), streaming a Map's rows to DRAM, and bad staging fields."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from test_cli import _assert_one_line_error, cli

from egraph_rules.ir import T, ta, ts
from hwmodels.codegen import _fuse_pair_maps
from hwmodels.description import TargetFileError
from liftsat import optimize
from liftsat.targets import BUILTIN, get_target

TARGETS = sorted(BUILTIN)
NEW = ("cpu", "snowflake", "systolic", "vta")

LAYERS = {
    "linear b1": (["Linear(40, 24)"], (1, 40)),
    "linear nobias b3": (["Linear(32, 20, bias=False)"], (3, 32)),
    "linear relu b2": (["Linear(48, 32)", "ReLU()"], (2, 48)),
    "linear tanh b1": (["Linear(32, 16, bias=False)", "Tanh()"], (1, 32)),
    "linear sigmoid b2": (["Linear(16, 40)", "Sigmoid()"], (2, 16)),
    "gemm": (["MatMul(48, 32)"], (5, 48)),
}
#: DeepBench inference_device 128x1500x1280 (M, N, K) as liftsat's MatMul: input K x N
DEEPBENCH = (["MatMul(1280, 128, a_t=True, b_t=True)"], (1280, 1500))


def _mnemonics(name: str) -> set[str]:
    t = get_target(name)
    return {o.mnemonic for o in t.ops} | {m.load_mnemonic for m in t.memories.values()} | {t.store_mnemonic}


@pytest.mark.parametrize("case", LAYERS)
@pytest.mark.parametrize("target", TARGETS)
def test_layers_run_on_every_builtin(target, case):
    layers, shape = LAYERS[case]
    r = optimize(layers, shape, target=target)          # raises if functional and timing cycles differ
    assert r.target == target and r.max_rel_error < 1e-4
    np.testing.assert_allclose(r.output, r.reference, rtol=1e-4, atol=1e-4 * float(np.abs(r.reference).max()))
    assert set(r.ops) <= _mnemonics(target)
    assert 0 < r.efficiency <= 1 and r.predicted_cycles > 0


@pytest.mark.parametrize("target", TARGETS)
def test_deepbench_gemm_full_size_timing_only(target):
    r = optimize(*DEEPBENCH, target=target, functional=False)
    assert r.output is None and math.isnan(r.max_rel_error) and r.output_shape == (1500, 128)
    assert r.cycles >= r.roofline_cycles > 0 and r.dynamic_instructions >= 1500
    d = r.as_dict()
    assert d["max_rel_error"] is None and d["max_abs_error"] is None and json.dumps(d)


def test_timing_only_gives_the_functional_cycles():
    layers, shape = LAYERS["linear relu b2"]
    a, b = optimize(layers, shape, target="vta"), optimize(layers, shape, target="vta", functional=False)
    assert (a.cycles, a.setup_cycles, a.ops) == (b.cycles, b.setup_cycles, b.ops)


def test_rows_stream_out_when_the_result_does_not_fit_on_chip():
    """700 x 1024 float32 results (2.7 MiB) through a 128 KiB accumulator: band by band, each
    band's rows stored before the next band (bands of 12 rows: a quarter of twice the 32 Ki-element
    accumulator over 1024 + 256 per row; 59 bands, the last padded with 8 zero rows)."""
    r = optimize(["MatMul(256, 1024)"], (700, 256), target="vta", functional=False)
    assert r.egraph.matches_per_rule.get("batched-linear-bands", 0) > 0
    assert r.ops["STORE"] == 59 * 12 * 1024 // 16


def test_the_cli_runs_every_builtin(capsys):
    for target in NEW:
        code, out, err = cli(["optimize", "Linear(20, 12)", "ReLU()", "--input", "2x20", "--target", target, "--json"],
                             capsys)
        assert code == 0 and err == "", err
        d = json.loads(out)
        assert d["target"] == target and d["max_rel_error"] < 1e-4 and set(d["ops"]) <= _mnemonics(target)
    code, out, err = cli(["optimize", *DEEPBENCH[0], "--input", "1280x1500", "--target", "systolic", "--timing-only"],
                         capsys)
    assert code == 0 and "not checked (timing-only simulation)" in out


def test_targets_lists_all_five(capsys):
    code, out, _ = cli(["targets"], capsys)
    assert code == 0
    for name in ("brainwave", "snowflake", "systolic", "vta", "cpu"):
        assert f"\n{name}: native dim" in f"\n{out}"


@pytest.mark.parametrize("target, mnemonics, peak", [
    ("snowflake", {"MAC", "MAX", "VMOV", "LOAD", "TMOV"}, 256),
    ("systolic", {"mvin", "mvout", "preload", "compute"}, 256),
    ("vta", {"LOAD", "GEMM", "ALU.ADD", "ALU.MAX", "STORE"}, 256),
    ("cpu", {"vfmadd231ps", "vaddps", "vmaxps", "vmovups"}, 16),
])
def test_builtin_isa_and_numbers(target, mnemonics, peak):
    t = get_target(target)
    assert mnemonics <= _mnemonics(target) and t.peak_macs_per_cycle == peak and len(t.assumptions) >= 5
    meanings = {o.op.meaning.op for o in t.ops}
    assert {"MVMul", "VVAdd", "VVMax", "VVRelu", "VVTanh", "VVSigm"} <= meanings   # VVMax: pooling will map


def test_cpu_vector_width_is_a_parameter():
    r = optimize(["Linear(12, 8)", "Tanh()"], (2, 12), target="cpu", native_dim=4)
    assert r.target == "cpu4" and r.max_rel_error < 1e-4
    assert get_target("cpu", 16).peak_macs_per_cycle == 32


def test_systolic_preloads_weights_from_the_scratchpad_on_the_mesh():
    t = get_target("systolic")
    mesh = t.memories["gm.mesh"]
    assert (mesh.load_from, mesh.loader, mesh.load_mnemonic, mesh.load_unit) == ("gm.sp", "mvu", "preload", "tile")
    r = optimize(["Linear(64, 48)"], (1, 64), target="systolic")
    assert r.max_rel_error < 1e-4 and r.ops["preload"] == r.ops["compute"] == 12
    assert r.ops["mvin"] == 4                      # the input vector; the 12 blocks stay in the scratchpad
    assert r.weights["W0"] == "pinned" and r.setup_cycles > 0
    lines = r.listing.splitlines()
    preload = next(i for i, line in enumerate(lines) if line.strip().startswith("preload"))
    assert "gm.mesh[" in lines[preload] and "gm.sp[" in lines[preload]
    setup = lines.index("setup:")
    assert sum(line.strip().startswith("mvin") and "gm.sp[" in line for line in lines[setup:lines.index("main:")]) >= 1
    # the cost model charges the preload to the mesh: one block per cycle and row
    assert t.cost_model().transfers("gm.mesh", T("TA", ta(ts("f32"), 16), 16))[1] == 16


def test_pair_making_maps_fuse_into_their_consumer():
    v, m = ta(ts("f32"), 4), T("TA", ta(ts("f32"), 4), 4)
    p = T("TP", m, v)
    fork = T("Fork", T("Fst", p), T("Snd", p))
    consumer, producer = T("Map", T("MVMul", p), 3), T("Map", fork, 3)
    assert _fuse_pair_maps([consumer, producer]) == [T("Map", T("Comp", T("MVMul", p), fork), 3)]
    assert _fuse_pair_maps([consumer, T("Map", T("Fst", p), 3)]) == [consumer, T("Map", T("Fst", p), 3)]
    assert _fuse_pair_maps([consumer, T("Map", fork, 2)]) == [consumer, T("Map", fork, 2)]


SYSTOLIC = Path(BUILTIN["systolic"])
BAD_STAGING = {
    "undeclared source": ('load_from = "gm.sp"', 'load_from = "gm.nowhere"', "'gm.nowhere' is not another"),
    "itself": ('load_from = "gm.sp"', 'load_from = "gm.mesh"', "'gm.mesh' is not another"),
    "unknown loader": ('loader = "mvu"', 'loader = "gpu"', "unknown loader 'gpu'"),
    "loader without source": ('load_from = "gm.sp"\n', "", "only loads from another on-chip memory"),
}


@pytest.mark.parametrize("old, new, words", BAD_STAGING.values(), ids=BAD_STAGING.keys())
def test_bad_staging_is_one_line(old, new, words, tmp_path, capsys):
    text = SYSTOLIC.read_text()
    assert old in text
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(TargetFileError, match="gm.mesh"):
        get_target(str(path))
    code, out, err = cli(["optimize", "Linear(16, 16)", "--input", "1x16", "--target", str(path)], capsys)
    _assert_one_line_error(code, out, err)
    assert words in err and str(path) in err


def test_staging_chains_are_refused(tmp_path):
    text = SYSTOLIC.read_text().replace('load_unit = "vector"\n\n[memories."gm.acc"]',
                                        'load_unit = "vector"\nload_from = "gm.acc"\n\n[memories."gm.acc"]', 1)
    path = tmp_path / "chain.toml"
    path.write_text(text)
    with pytest.raises(TargetFileError, match="'gm.sp' is not another on-chip memory loaded from DRAM"):
        get_target(str(path))


def test_results_that_fit_are_written_once_per_vector():
    """Batch 16 of Linear 1024x1024 on brainwave: the 64 KiB of results fit the VRF; each of the
    16 x 8 result vectors is written out once and the layer runs near its roofline."""
    r = optimize(["Linear(1024, 1024)"], (16, 1024), target="brainwave", functional=False)
    assert r.ops["v_wr"] == 128
    assert r.efficiency > 0.8
