"""Targets as TOML descriptions: the built-ins, a test-only accelerator described only in a file
(tests/targets/vecmat.toml: native dimension 8, its own memories and mnemonics), one-line errors
naming file and field for bad files, and `liftsat targets`."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest
from test_cli import _assert_one_line_error, cli

from egraph_rules.ir import fout
from hwmodels.description import TargetFileError
from liftsat import optimize
from liftsat.targets import BUILTIN, TargetError, get_target

ROOT = Path(__file__).resolve().parent.parent
VECMAT = Path(__file__).resolve().with_name("targets") / "vecmat.toml"
VECMAT_MNEMONICS = {"gemv", "vadd", "vrelu", "vtanh", "ldw", "lda", "sta"}


# ---------------------------------------------------------------- built-ins


def test_every_builtin_loads():
    assert "brainwave" in BUILTIN
    for name, path in BUILTIN.items():
        assert path.parent == ROOT / "hwmodels" / "targets"
        t = get_target(name)
        assert t.name == name and t.assumptions
        for spec in t.ops:
            fout(spec.op.meaning)
            assert set(spec.op.operand_spaces) | {spec.op.result_space} <= set(t.memories)
        assert get_target(str(path)) == t


def test_brainwave_keeps_its_numbers():
    """The numbers of the Python model that the description replaced."""
    t = get_target("brainwave")
    assert (t.clock_mhz, t.native_dim, t.dtypes, t.peak_macs_per_cycle) == (250.0, 128, ("f32",), 2048)
    assert (t.dram.bandwidth, t.dram.latency, t.dram.capacity) == (64, 100, 1 << 34)
    mrf, vrf = t.memories["bw.mrf"], t.memories["bw.vrf"]
    assert (mrf.capacity, mrf.load_mnemonic, mrf.load_unit) == (8 << 20, "m_rd", "tile")
    assert (vrf.capacity, vrf.load_mnemonic, vrf.load_unit) == (1 << 20, "v_rd", "vector")
    assert t.store_mnemonic == "v_wr" and t.persistent_weights
    timing = {o.mnemonic: (o.unit, o.occupancy, o.latency) for o in t.ops}
    assert timing == {"mv_mul": ("mvu", 8, 24), **{m: ("mfu", 1, 9) for m in
                                                     ("vv_add", "vv_mul", "vv_a_sub_b", "vv_max", "v_relu", "v_tanh", "v_sigm")}}
    assert get_target("brainwave", 64).op_by_name["bw.mv_mul"].latency == 18
    assert get_target("brainwave", 256).op_by_name["bw.v_relu"].occupancy == 2


@pytest.mark.parametrize("native_dim, name", [(None, "brainwave"), (128, "brainwave"), (64, "brainwave64"),
                                              (32, "brainwave32")])
def test_native_dim_override_names_the_target(native_dim, name):
    t = get_target("brainwave", native_dim)
    assert t.name == name and t.native_dim == (native_dim or 128)
    assert fout(t.op_by_name["bw.v_relu"].op.meaning).args[1] == t.native_dim


def test_targets_are_package_data():
    with (ROOT / "pyproject.toml").open("rb") as fh:
        setuptools = tomllib.load(fh)["tool"]["setuptools"]
    assert "hwmodels.targets" in setuptools["packages"]
    assert "*.toml" in setuptools["package-data"]["hwmodels.targets"]


def test_unknown_target_names_the_choices():
    with pytest.raises(TargetError, match="'tpu'.*brainwave"):
        get_target("tpu")


# ---------------------------------------------------------------- a target only a file describes


def test_a_memory_can_be_resized_without_a_target_file():
    base = get_target("systolic")
    small = base.with_memory("gm.acc", capacity=4096).with_memory("dram", latency=7)
    assert small.memories["gm.acc"].capacity == 4096 and small.result_capacity == 4096
    assert small.dram.latency == 7 and small.dram.bandwidth == base.dram.bandwidth
    assert list(small.memories) == list(base.memories)
    assert {n: m for n, m in small.memories.items() if n != "gm.acc"} == {
        n: m for n, m in base.memories.items() if n != "gm.acc"}
    assert base.memories["gm.acc"].capacity == 65536 and base.result_capacity == 65536   # the original is kept


@pytest.mark.parametrize("name, changes, words", [
    ("gm.accumulator", {"capacity": 1024}, "systolic has no memory 'gm.accumulator'; its memories: dram, gm.sp"),
    ("gm.acc", {"size": 1024}, "no 'size' to change; it has capacity, bandwidth, latency"),
    ("gm.acc", {"capacity": 0}, "gm.acc.capacity must be an integer of at least 1, got 0"),
    ("dram", {"latency": 1.5}, "dram.latency must be an integer of at least 0, got 1.5"),
])
def test_a_bad_memory_change_names_the_memory_and_the_field(name, changes, words):
    with pytest.raises(TargetError) as info:
        get_target("systolic").with_memory(name, **changes)
    assert words in str(info.value)


def test_vecmat_is_not_builtin_and_loads():
    assert "vecmat" not in BUILTIN
    t = get_target(str(VECMAT))
    assert (t.name, t.native_dim, t.clock_mhz, t.peak_macs_per_cycle) == ("vecmat", 8, 100.0, 8)
    assert set(t.memories) == {"vm.wbuf", "vm.act"} and t.memories["vm.wbuf"].load_unit == "tile"
    assert {o.mnemonic: (o.occupancy, o.latency) for o in t.ops} == {
        "gemv": (8, 11), "vadd": (2, 4), "vrelu": (2, 4), "vtanh": (2, 4)}
    wide = get_target(str(VECMAT), 16)
    assert wide.name == "vecmat16" and wide.op_by_name["vm.gemv"].occupancy == 16


@pytest.mark.parametrize("layers, shape, out", [
    (["Linear(16, 8)"], (1, 16), (1, 8)),
    (["Linear(16, 8, bias=False)"], (2, 16), (2, 8)),
    (["Linear(20, 12)", "ReLU()"], (2, 20), (2, 12)),                       # not a multiple of 8
    (["Linear(20, 12, bias=False)", "Tanh()"], (1, 20), (1, 12)),
    (["Linear(16, 16)", "ReLU()", "Linear(16, 8)"], (3, 16), (3, 8)),
])
def test_linear_layers_compile_and_run_on_vecmat(layers, shape, out):
    r = optimize(layers, shape, target=str(VECMAT))
    assert r.target == "vecmat" and r.output_shape == out
    assert r.max_rel_error <= 1e-4
    np.testing.assert_allclose(r.output, r.reference, rtol=1e-4, atol=1e-4 * float(np.abs(r.reference).max()))
    assert set(r.ops) <= VECMAT_MNEMONICS and "gemv" in r.ops


def test_weights_larger_than_the_weight_buffer_are_streamed_on_vecmat():
    r = optimize(["Linear(96, 64)"], (1, 96), target=str(VECMAT))      # 24 KiB of weights, 16 KiB buffer
    assert r.max_rel_error <= 1e-4
    assert r.weights["W0"] == "streamed" and r.ops["ldw"] == 96


def test_vecmat_through_the_cli(capsys):
    code, out, err = cli(["optimize", "Linear(20, 12)", "ReLU()", "--input", "2x20", "--target", str(VECMAT),
                          "--json"], capsys)
    assert code == 0 and err == ""
    d = json.loads(out)
    assert d["target"] == "vecmat" and d["output_shape"] == [2, 12] and d["max_rel_error"] <= 1e-4
    assert set(d["ops"]) <= VECMAT_MNEMONICS
    code, out, _ = cli(["optimize", "Linear(16, 8)", "--input", "1x16", "--target", str(VECMAT), "--listing"], capsys)
    assert code == 0 and out.startswith("; liftsat program for vecmat") and "gemv" in out


def test_an_op_the_target_lacks_is_a_one_line_error(capsys):
    code, out, err = cli(["optimize", "Linear(8, 8)", "Sigmoid()", "--input", "1x8", "--target", str(VECMAT)], capsys)
    _assert_one_line_error(code, out, err)
    assert "vecmat" in err


# ---------------------------------------------------------------- bad files

BAD_FILES = {
    # case: (text in vecmat.toml (its first occurrence is replaced), replacement, field named in the error
    #        (None: the whole file), words of the problem)
    "missing field": ('store_mnemonic = "sta"\n', "", "store_mnemonic", "missing field"),
    "missing memory field": ("latency = 1\n", "", 'memories."vm.act".latency', "missing field"),
    "negative capacity": ("capacity = 4096", "capacity = -4096", 'memories."vm.act".capacity', "at least 1"),
    "zero capacity": ("capacity = 4096", 'capacity = "0 * K"', 'memories."vm.act".capacity', "at least 1"),
    "meaning does not type-check": ('K), K), TA(TS("f32"), K)))', 'K), K), TA(TS("f32"), K + 1)))',
                                    'ops."vm.gemv".meaning', "does not type-check"),
    "unknown unit": ('unit = "mvu"', 'unit = "tpu"', 'ops."vm.gemv".unit', "unknown unit 'tpu'"),
    "undeclared operand memory": ('operands = ["vm.wbuf", "vm.act"]', 'operands = ["vm.weights", "vm.act"]',
                                  'ops."vm.gemv".operands', "'vm.weights' is not declared"),
    "undeclared result memory": ('result = "vm.act"', 'result = "vm.out"', 'ops."vm.gemv".result',
                                 "'vm.out' is not declared"),
    "operand count": ('operands = ["vm.wbuf", "vm.act"]', 'operands = ["vm.act"]', 'ops."vm.gemv".operands',
                      "needs 2 operand memories"),
    "unknown field": ('load_unit = "vector"', 'load_unit = "vector"\nlaod = 1', 'memories."vm.act".laod',
                      "unknown field"),
    "unknown load unit": ('load_unit = "vector"', 'load_unit = "row"', 'memories."vm.act".load_unit',
                          "unknown load unit 'row'"),
    "native dim names no parameter": ('native_dim = "K"', 'native_dim = "N"', "native_dim", "'N'"),
    "wrong type": ("clock_mhz = 100 ", 'clock_mhz = "fast" ', "clock_mhz", "expected a number"),
    "clock not a number": ("clock_mhz = 100 ", "clock_mhz = nan ", "clock_mhz", "positive number"),
    "parameter name taken": ("LANES = 4", "ceil = 4", "parameters.ceil", "cannot be a parameter name"),
    "memory called dram": ('[memories."vm.act"]', "[memories.dram]", "memories", "'dram'"),
    "invalid TOML": ('name = "vecmat"', "name = vecmat", None, "not valid TOML: Invalid value (at line"),
    "duplicate key": ('name = "vecmat"', 'name = "vecmat"\nname = "again"', None, "not valid TOML"),
}


def _value_cases(line: str, field: str, bad: dict[str, str]) -> dict[str, tuple[str, str, str, str]]:
    """Bad-file cases that give one line of vecmat.toml another value: value -> words of the problem."""
    key = line.split(" = ")[0]
    return {f"{key} {v}": (line, f"{key} = {json.dumps(v)}", field, words) for v, words in bad.items()}


BAD_FILES |= _value_cases('occupancy = "K"', 'ops."vm.gemv".occupancy', {
    "__import__('os').getpid()": "is not allowed",
    "K ** 2": "K ** 2 is not allowed",
    "K.bit_length()": "is not allowed",
    "(lambda: 3)()": "is not allowed",
    "max(K, key=1)": "is not allowed",
    'TS("f32")': "is not allowed",
    "M * K": "unknown name 'M'",
    "K // (K - K)": "cannot compute",
    "K / 3": "whole number",
    "K +": "cannot parse",
})
BAD_FILES |= _value_cases("""meaning = 'VVRelu(TA(TS("f32"), K))'""", 'ops."vm.relu".meaning', {
    'VVRelux(TA(TS("f32"), K))': "unknown IR constructor 'VVRelux'",
    'Map(VVRelu(TA(TS("f32"), K)), 2)': "Map is not an operation",
    'VVRelu(TP(TA(TS("f32"), K), TA(TS("f32"), K)))': "does not type-check",
    'VVRelu(TA(TS("i8"), K))': "'i8'",
    'os.system("rm")': "is not allowed",
    "print(K)": "unknown IR constructor 'print'",
    'VVRelu(TA(TS("f32"), K)': "cannot parse",
})


def _bad_file(tmp_path: Path, old: str, new: str) -> Path:
    text = VECMAT.read_text()
    assert old in text
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize("old, new, field, words", BAD_FILES.values(), ids=BAD_FILES.keys())
def test_bad_file_is_one_line_naming_file_and_field(old, new, field, words, tmp_path, capsys):
    path = _bad_file(tmp_path, old, new)
    argv = ["optimize", "Linear(8, 8)", "--input", "1x8", "--target", str(path)]
    code, out, err = cli(argv, capsys)
    _assert_one_line_error(code, out, err)
    assert err.startswith(f"liftsat: error: {path}: {field + ': ' if field else ''}"), err
    assert words in err


def test_bad_file_error_is_a_target_error(tmp_path):
    path = _bad_file(tmp_path, 'unit = "mvu"', 'unit = "tpu"')
    with pytest.raises(TargetFileError) as info:
        get_target(str(path))
    assert isinstance(info.value, TargetError)
    assert (info.value.file, info.value.field) == (path, 'ops."vm.gemv".unit')


def test_missing_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "nowhere.toml"
    code, out, err = cli(["optimize", "Linear(8, 8)", "--input", "1x8", "--target", str(path)], capsys)
    _assert_one_line_error(code, out, err)
    assert str(path) in err and "cannot read" in err


# ---------------------------------------------------------------- liftsat targets


def test_targets_lists_the_builtins(capsys):
    code, out, err = cli(["targets"], capsys)
    assert code == 0 and err == ""
    assert "brainwave: native dim 128, 250 MHz, 2048 MACs/cycle, DRAM 64 B/cycle" in out
    assert "bw.mrf 8 MiB, bw.vrf 1 MiB" in out
    assert "mv_mul, vv_add, vv_mul, vv_a_sub_b, vv_max, v_relu, v_tanh, v_sigm" in out
    assert "vecmat" not in out


def test_targets_json(capsys):
    code, out, _ = cli(["targets", "--json"], capsys)
    assert code == 0
    items = json.loads(out)
    assert [d["name"] for d in items] == list(BUILTIN)
    assert next(d for d in items if d["name"] == "brainwave") == {"name": "brainwave", "native_dim": 128, "clock_mhz": 250.0, "peak_macs_per_cycle": 2048,
                        "dram_bytes_per_cycle": 64, "memory_bytes": {"bw.mrf": 8 << 20, "bw.vrf": 1 << 20},
                        "ops": ["mv_mul", "vv_add", "vv_mul", "vv_a_sub_b", "vv_max", "v_relu", "v_tanh", "v_sigm"]}
