"""The BrainWave-style target: a native-dimension matrix-vector unit fed from a matrix register
file, a vector function unit, and DMA between DRAM and the register files.

Assumptions (numbers stated here only): 250 MHz; float32; DRAM 64 B/cycle with 100 cycles
latency; the matrix unit does 2048 MACs per cycle (a 128x128 tile in 8 cycles) with 16 more
cycles of pipeline latency; the vector unit processes 128 elements per cycle with 8 cycles of
latency; matrix register file 8 MiB, vector register file 1 MiB. Weights that fit in the MRF are
pinned at deployment (BrainWave's persistent-weight design point) and cost no cycles per
inference; weights that do not fit are streamed tile by tile.
"""

from __future__ import annotations

import math

from egraph_rules.hardware_rules import DeviceOp
from egraph_rules.ir import T, ta, tp, ts
from hwmodels.target import Memory, OpSpec, Target

CLOCK_MHZ = 250.0
DRAM_BYTES_PER_CYCLE = 64
DRAM_LATENCY = 100
MVU_MACS_PER_CYCLE = 2048
MVU_PIPELINE = 16
MFU_LANES = 128
MFU_PIPELINE = 8
MRF_BYTES = 8 << 20
VRF_BYTES = 1 << 20

MRF, VRF = "bw.mrf", "bw.vrf"


def brainwave(native_dim: int = 128) -> Target:
    """The BrainWave-style target at a native dimension (128 default; 64 and 32 are the
    poster's smaller operator variants)."""
    if native_dim <= 0:
        raise ValueError(f"brainwave native dimension must be positive, got {native_dim}")
    n = native_dim
    s = ts("f32")
    vec, mat = ta(s, n), ta(ta(s, n), n)
    mv_occ = max(1, math.ceil(n * n / MVU_MACS_PER_CYCLE))
    mfu_occ = max(1, math.ceil(n / MFU_LANES))

    def vector_op(name: str, mnemonic: str, meaning, operands: tuple[str, ...]) -> OpSpec:
        return OpSpec(DeviceOp(f"bw.{name}", meaning, operands, VRF), mnemonic, "mfu", mfu_occ, mfu_occ + MFU_PIPELINE)

    ops = (
        OpSpec(DeviceOp("bw.mv_mul", T("MVMul", tp(mat, vec)), (MRF, VRF), VRF), "mv_mul", "mvu", mv_occ,
               mv_occ + MVU_PIPELINE),
        vector_op("vv_add", "vv_add", T("VVAdd", tp(vec, vec)), (VRF, VRF)),
        vector_op("vv_mul", "vv_mul", T("VVMul", tp(vec, vec)), (VRF, VRF)),
        vector_op("v_relu", "v_relu", T("VVRelu", vec), (VRF,)),
        vector_op("v_tanh", "v_tanh", T("VVTanh", vec), (VRF,)),
        vector_op("v_sigm", "v_sigm", T("VVSigm", vec), (VRF,)),
    )
    return Target(
        name="brainwave" if n == 128 else f"brainwave{n}",
        clock_mhz=CLOCK_MHZ,
        native_dim=n,
        dtypes=("f32",),
        dram=Memory("dram", 1 << 34, DRAM_BYTES_PER_CYCLE, DRAM_LATENCY),
        memories={MRF: Memory(MRF, MRF_BYTES, DRAM_BYTES_PER_CYCLE, DRAM_LATENCY),
                  VRF: Memory(VRF, VRF_BYTES, DRAM_BYTES_PER_CYCLE, DRAM_LATENCY)},
        ops=ops,
        peak_macs_per_cycle=MVU_MACS_PER_CYCLE,
        load_mnemonics={MRF: "m_rd", VRF: "v_rd"},
        store_mnemonic="v_wr",
        persistent_weights=True,
        assumptions=tuple(line.strip() for line in (__doc__ or "").split("\n\n")[1].split(";")),
    )
