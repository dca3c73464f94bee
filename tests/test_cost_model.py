"""The cost model against the simulator: predictions within 10% of simulated cycles on small
layers on every built-in target, its latency terms from target data, and determinism."""

from __future__ import annotations

import math
import random

import pytest

from egraph_rules.ir import ta, tensor_type, tp, ts
from egraph_rules.saturate import Budget
from extraction.greedy import INF, GraphView, computations, greedy_choice
from frontend.layers import build_model
from hwmodels.target import COMPONENTS, NEVER
from liftsat.api import SharedEGraph, optimize
from liftsat.targets import BUILTIN, get_target

F32 = ts("f32")
#: (layers, input shape, targets) whose predicted cycles must be within 10% of the simulated ones
CASES = [
    (["MatMul(256, 128)"], (16, 256), tuple(BUILTIN)),
    (["ReLU()"], (4, 1024), tuple(BUILTIN)),                            # dispatch does not wait for loads
    (["Linear(256, 256)"], (1, 256), ("cpu", "snowflake")),
    (["Linear(512, 128)", "ReLU()"], (1, 512), ("cpu", "snowflake")),
    (["Linear(256, 256)"], (1, 256), ("vta",)),                      # partial sums reduced where they are
    (["MaxPool2d(3, stride=2)"], (1, 16, 9, 9), tuple(BUILTIN)),   # windows loaded once, a step per row of them
    (["Conv2d(16, 32, 1)", "ReLU()"], (1, 16, 4, 4), tuple(BUILTIN)),    # the ReLU reads the result where it is
    (["Linear(1024, 512)"], (4, 1024), ("cpu",)),    # a streamed weight slab read in 8 x 8 tiles
    (["Linear(1024, 1024)"], (1, 1024), ("brainwave",)),   # the input's first vector waited for from cold
    (["MatMul(1760, 35, a_t=True, b_t=True)"], (1760, 64), ("snowflake",)),   # issue-bound, a store per row
]


#: cases the model is known to miss, and why (strict: a fix makes them pass, and fail here)
KNOWN_MISSES = {
    ("MatMul(256, 128)", "brainwave"): "the 16 rows' products, one column block of them after the other, are summed "
    "by a loop of adds, then stored by a loop of stores, which streams behind the adds; the model has the matrix unit "
    "wait for the whole store after the last product (592 predicted), where the DMA unit is done last, at 497 (484 "
    "predicted)",
    ("MaxPool2d(3, stride=2)", "brainwave"): "the 16 pooled pixels' 16 channels are stored as 16 whole vectors "
    "(128 wide), which stream behind the vector unit's max steps; the model has the vector unit wait for the whole "
    "store after its last step (1,616 predicted), where the DMA unit is done last, at 1,380 cycles as predicted",
    ("Conv2d(16, 32, 1)", "brainwave"): "the model has the matrix unit wait for the weight tile's load and the "
    "pixels' from cold, then for the whole store's drain after its last product (1,696 predicted); the simulator has "
    "it done at 1,276 and the DMA unit last, at 1,523 (1,588 predicted). It ran 1,553 (1.092) until the ReLU's "
    "padding, a mask multiply, ran as a loop of its own ahead of the ReLUs' (Codegen.fission, 2026-11-30)",
    ("Conv2d(16, 32, 1)", "vta"): "the 16 pixels run weight-stationary (554 cycles; 2,775 pixel by pixel): in so small "
    "a program the chain of dependent loops, the last GEMM, its bias ALU.ADD, ALU.MAXI and STORE each waiting out "
    "the one before (81, 48, 47 cycles, then the store's 151), is the critical path; the model charges the loads' "
    "and the store's waits, not the loops' latencies (461 predicted)",
    ("Conv2d(16, 32, 1)", "systolic"): "the 16 pixels run weight-stationary (379 cycles with egglog 13.2, 363 with "
    "egglog 14; 1,789 pixel by pixel), the DMA unit last; the model has the mesh and the vector unit done at 428 "
    "(after waiting for the weights' staging and the rows' loads from cold), the simulator at 226 and 278",
}


def _case(layers: list[str], shape: tuple[int, ...], target: str):
    reason = KNOWN_MISSES.get((layers[0], target))
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(layers, shape, target, marks=marks)


@pytest.mark.parametrize("layers,shape,target", [_case(c[0], c[1], t) for c in CASES for t in c[2]])
def test_prediction_within_ten_percent_of_simulation(layers: list[str], shape: tuple[int, ...], target: str) -> None:
    """Saturation is bounded by nodes and iterations only (no seconds), so the program, and
    which cases are known misses, do not depend on how busy the machine is: the systolic
    Conv2d(16, 32, 1) + ReLU reaches the node limit in 5-8 s on egglog 13.2 and, with both cores
    busy, ran out of the default 10 s once (a pixel-by-pixel program, predicted within 10%)."""
    r = optimize(layers, shape, target, functional=False, budget=Budget(seconds=math.inf))
    assert abs(r.predicted_cycles / r.cycles - 1) <= 0.10, (r.predicted_cycles, r.cycles)


@pytest.mark.parametrize("target", ["systolic", "vta"])
def test_lone_activation_is_predicted_exactly(target: str) -> None:
    # loads, activations and stores of a row overlap those of the next; the dispatcher never waits
    r = optimize(["ReLU()"], (4, 1024), target, functional=False)
    assert r.predicted_cycles == r.cycles


@pytest.mark.parametrize("target", sorted(BUILTIN))
def test_units_are_what_the_prediction_is_the_longest_of(target: str) -> None:
    rng = random.Random(target)
    cm = get_target(target).cost_model()
    for _ in range(50):
        c = tuple(rng.choice([0.0, rng.uniform(0, 1e6)]) for _ in COMPONENTS)
        units = cm.by_unit(c)
        assert set(units) == {"dma", "mvu", "mfu", "issue", "chain"}
        assert max(units.values()) == cm.scalar(c)
        assert units["dma"] == c[COMPONENTS.index("dma")] + c[COMPONENTS.index("dma_wait")]


def test_activation_after_a_convolution_reads_its_result_on_chip() -> None:
    r = optimize(["Conv2d(16, 32, 1)", "ReLU()"], (1, 16, 4, 4), "snowflake", functional=False)
    assert r.ops["LOAD"] == 16                      # one input trace per pixel, none for the ReLU


def test_prediction_is_deterministic() -> None:
    a = optimize(["Linear(256, 256)"], (4, 256), "vta", functional=False)
    b = optimize(["Linear(256, 256)"], (4, 256), "vta", functional=False)
    assert (a.predicted_cycles, a.term, a.cycles) == (b.predicted_cycles, b.term, b.cycles)


def test_load_wait_is_the_latency_its_own_transfers_do_not_cover() -> None:
    cm = get_target("brainwave").cost_model()
    lat = cm.t.dram.latency
    mv_mul = cm.ops["bw.mv_mul"].occupancy                  # the slowest reader of the vector registers
    one = cm.local("ToChip", ("bw.vrf", ta(F32, 128)))
    per = 128 * 4 // cm.t.dram.bandwidth
    # the first run's readers wait for the vector to arrive; issue runs ahead: it does not wait;
    # a loop reloading it runs no faster than load, latency and read, one after the other; the
    # DMA unit waits for the buffer's readers (left to the loop around the load)
    assert one == (per, per + lat, per + lat, 1, 0, lat, 0, per + lat, per + lat + mv_mul, 0, 0, 0)
    assert cm.settled(one, 1) == (per + lat, per + lat, per + lat, 1, per + lat + mv_mul, 0, 0, per + lat, 0, 0, 0, 0)
    # double-buffered: the DMA unit does not wait, and a load's round trip spans two runs
    assert cm.settled(one, 2) == (per, per + lat, per + lat, 1, (per + lat + mv_mul) / 2, 0, 0, per + lat, 0, 0, 0, 0)
    eight = cm.local("ToChip", ("bw.vrf", ta(F32, 1024)))
    assert eight[1] == eight[7] == per + lat           # the first vector, from cold; later runs are prefetched
    assert cm.settled(eight, 1)[0] == 8 * per + lat - 7 * per   # the DMA waits: seven more vectors hide part
    assert eight[8] == per + lat + mv_mul
    huge = cm.local("ToChip", ("bw.mrf", tensor_type("f32", (1024, 1024))))
    assert cm.settled(huge, 1)[0] == 64 * 128 * 128 * 4 // cm.t.dram.bandwidth   # 64 tiles hide all of it


def test_a_loop_pays_its_loads_cold_start_once() -> None:
    cm = get_target("brainwave").cost_model()
    load = cm.local("ToChip", ("bw.vrf", ta(F32, 1024)))
    looped = cm.node("Map", (None, 5), [load])
    cold, dma_wait, recurrence = load[7], load[5], load[8]
    assert cold > 0 and dma_wait > 0
    assert looped == (5 * (load[0] + dma_wait), 5 * load[1] - 4 * cold, 5 * load[2] - 4 * cold, 5 * load[3],
                      5 * recurrence, 0, 0, cold, 0, 0, 0, 0)
    assert cm.node("Const", (None, None), [load]) == (0.0,) * len(COMPONENTS)   # computed at setup: never paid
    assert cm.counted(load, 5, 1) == looped
    assert cm.scalar(looped) == 5 * recurrence         # little work per run: the loads' recurrence decides
    fold = (None, tp(ta(F32, 1024), ta(ta(F32, 1024), 5)))   # a Fold's steps load into two buffers
    assert cm.node("Fold", fold, [load]) == (5 * load[0], *looped[1:4], 5 * recurrence / 2, *looped[5:])


def test_loads_outside_every_loop_run_once() -> None:
    cm = get_target("brainwave").cost_model()
    load = cm.local("ToChip", ("bw.vrf", ta(F32, 128)))
    assert cm.counted(load, 1) == load                  # not a loop's body: the loop around it settles it
    assert cm.scalar(load) == max(cm.settled(load, 1))


def test_a_load_its_memory_units_do_not_tile_is_never_taken() -> None:
    cm = get_target("brainwave", 32).cost_model()
    assert cm.t.memories["bw.mrf"].load_unit == "tile"
    assert cm.local("ToChip", ("bw.mrf", tensor_type("f32", (64, 32)))) != NEVER
    assert cm.local("ToChip", ("bw.mrf", tensor_type("f32", (48, 32)))) == NEVER   # 1.5 tiles of rows
    assert cm.local("ToChip", ("bw.mrf", ta(F32, 32))) == NEVER                     # not even one tile
    assert cm.local("ToChip", ("bw.vrf", ta(F32, 64))) != NEVER
    assert cm.local("ToChip", ("bw.vrf", ta(F32, 48))) == NEVER                     # 1.5 native vectors


def test_tile_reads_of_a_vector_loaded_slab_wait_for_the_tiles_last_row() -> None:
    cm = get_target("cpu").cost_model()
    assert cm.t.tile_read_spaces == {"cpu.cache"}                      # cpu.gemv reads an 8 x 8 tile there
    assert get_target("systolic").tile_read_spaces == {"gm.sp"}            # the mesh's preload reads tiles there
    assert not get_target("brainwave").tile_read_spaces                 # its tiles are loaded whole
    lat, per = cm.t.dram.latency, 8 * 4 // cm.t.dram.bandwidth
    slab = tensor_type("f32", (8, 1024))           # 1024 vectors; the first tile needs 7 rows and one more vector
    assert cm.first_read_units("cpu.cache", slab) == 7 * 128 + 1
    got = cm.local("ToChip", ("cpu.cache", slab))
    vector_read = max(0, lat - 1023 * per)         # what the loader waits: the first vector's latency, covered
    assert got[:4] == (1024 * per + vector_read, lat + 897 * per, lat + 897 * per, 1024)   # from cold: 897 vectors
    tile_read = lat + (2 * 897 - 1 - 1024) * per   # repeated: less the 127 moved after them
    repeat = [a - b for a, b in zip(cm.counted(got, 2), got)]
    # the units are read in another order than they are loaded: every run waits beyond the loader
    assert repeat[:4] == [1024 * per + vector_read, tile_read - vector_read, tile_read - vector_read, 1024]
    tiles = tensor_type("f32", (128, 8, 8))        # tile-major: the first tile is the first 8 vectors
    assert cm.first_read_units("cpu.cache", tiles) == 8
    assert cm.first_read_units("cpu.cache", ta(F32, 1024)) == 1
    stack = tensor_type("f32", (18, 8))            # 18 vector operands (an im2col row): read one at a time
    assert cm.first_read_units("cpu.cache", stack) == 1


def test_staged_load_waits_for_its_whole_staging() -> None:
    cm = get_target("systolic").cost_model()
    tile = tensor_type("f32", (16, 16))
    got = cm.local("ToChip", ("gm.mesh", tile))
    staging = 16 * 16 * 4 // cm.t.dram.bandwidth       # sixteen row moves into the scratchpad
    assert got[1] == 16 + cm.t.dram.latency + staging  # preload on the mesh's unit, after the staging
    assert got[7] == cm.t.dram.latency + staging       # later runs are staged while the mesh computes
    assert cm.settled(got, 1)[0] == 2 * staging + cm.t.dram.latency   # the DMA waits for the previous staging
    assert got[8] == staging + cm.t.dram.latency + 16 + cm.ops["gm.compute"].occupancy  # stage, preload, read


def test_store_drains_before_its_reader() -> None:
    cm = get_target("cpu").cost_model()
    v = ta(F32, 64)
    busy, units = cm.t.transfer_cycles(v, cm.t.native_dim)
    drain = busy + cm.t.dram.latency
    issued = max(busy, units) + cm.t.dram.latency
    assert cm.local("ToOutput", (v,)) == (drain,) * 3 + (issued, drain, 0, issued - units, 0, 0, 0, 0, 0)


def test_a_row_that_is_not_whole_vectors_is_stored_in_whole_ones() -> None:
    """Codegen gives every row computed on chip room for whole native vectors and stores it in
    whole ones: 700 rows of 35 on brainwave (128 wide) are 700 stores of 8 cycles, not 192; rows
    of whole vectors cost what moving their elements does."""
    bw = get_target("brainwave")
    assert bw.store_cycles(ta(ta(F32, 35), 700)) == (700 * 8, 700)
    assert bw.store_cycles(ta(F32, 35)) == (8, 1)
    assert bw.store_cycles(ta(ta(F32, 256), 3)) == bw.transfer_cycles(ta(ta(F32, 256), 3), 128)


def test_a_gemm_whose_result_rows_are_short_is_predicted_with_whole_vector_stores() -> None:
    """DeepBench's 35 x 700 x 2048 on brainwave stores 700 result rows of 35 as 700 whole vectors
    (its DMA unit busy 96,864 cycles, the last thing done): predicted within 1% (0.959 when the
    stores were charged by their elements)."""
    r = optimize(["MatMul(2048, 35, a_t=True, b_t=True)"], (2048, 700), "brainwave", functional=False)
    assert r.ops["v_wr"] == 700
    assert abs(r.predicted_cycles / r.cycles - 1) <= 0.01, (r.predicted_cycles, r.cycles)


def test_the_dispatcher_waits_for_the_last_run_of_a_store_only() -> None:
    # the dispatcher issues a loop's next iteration without waiting for this one's stores to
    # drain (the simulator dispatches one instruction a cycle, whatever the units wait for);
    # the units still wait every run: the next iteration's result overwrites the stored vector
    # once the store has read it
    cm = get_target("snowflake").cost_model()
    v = ta(F32, 48)                                    # three native vectors
    busy, units = cm.t.transfer_cycles(v, cm.t.native_dim)
    lat = cm.t.dram.latency
    store = cm.local("ToOutput", (v,))
    looped = cm.node("Map", (None, 100), [store])
    issue, mvu = COMPONENTS.index("issue"), COMPONENTS.index("mvu")
    assert looped[issue] == 100 * units + (busy + lat - units)
    assert looped[mvu] == 100 * store[mvu] == 100 * (busy + lat)
    assert cm.node("Map", (None, 10), [looped])[issue] == 1000 * units + (busy + lat - units)


def test_a_stored_band_overlaps_the_next_run_of_its_loop() -> None:
    # codegen queues a run's stores behind the next run's loads (defer_stores), so in later runs
    # the op units wait only for the row the next run overwrites first; the DMA still stores it all
    cm = get_target("snowflake").cost_model()
    band, row = ta(ta(F32, 32), 10), ta(F32, 32)
    busy, _ = cm.t.transfer_cycles(band, cm.t.native_dim)
    row_busy, _ = cm.t.transfer_cycles(row, cm.t.native_dim)
    lat = cm.t.dram.latency
    store = cm.local("ToOutput", (band,))
    looped = cm.node("Map", (None, 100), [store])
    dma, mvu = COMPONENTS.index("dma"), COMPONENTS.index("mvu")
    assert store[mvu] == busy + lat
    assert looped[mvu] == (busy + lat) + 99 * (row_busy + lat)
    assert looped[dma] == 100 * (busy + lat)
    assert cm.node("Map", (None, 100), [cm.local("ToOutput", (row,))])[mvu] == 100 * (row_busy + lat)


def test_a_chained_store_streams_behind_its_op() -> None:
    # an op whose result is stored as it is computed (DevOut): in a loop, each run's store drains
    # while the next run computes, so the units wait for one whole drain, after the last run, and
    # before it only as long as a store outlasts its op; the DMA unit waits out one latency
    cm = get_target("brainwave").cost_model()
    v = ta(F32, 128)
    mv_mul = cm.ops["bw.mv_mul"]
    busy, units = cm.t.store_cycles(v)
    lat = cm.t.dram.latency
    alone = cm.local("DevOut", ("bw.mv_mul", None, v))
    dma, mvu, mfu, issue = (COMPONENTS.index(u) for u in ("dma", "mvu", "mfu", "issue"))
    last = mv_mul.latency - mv_mul.occupancy + busy + lat       # the last result read, then stored
    assert alone[mvu] == mv_mul.occupancy + last and alone[mfu] == last and alone[dma] == busy + lat
    looped = cm.node("Map", (None, 33), [alone])
    assert busy == mv_mul.occupancy                                 # as fast as the op: hidden
    assert looped[mvu] == 33 * mv_mul.occupancy + last
    assert looped[dma] == 33 * busy + lat
    assert looped[issue] == 33 * (1 + units) + (mv_mul.latency - 1 + busy + lat - units)
    relu = cm.ops["bw.v_relu"]                                      # a store outlasting its op
    stored = cm.node("Map", (None, 10), [cm.local("DevOut", ("bw.v_relu", None, v))])
    assert stored[mfu] == 10 * relu.occupancy + 9 * (busy - relu.occupancy) + relu.latency - relu.occupancy + busy + lat
    assert cm.local("DevOut", ("sf.max", None, v)) == NEVER         # not an op of this target


def test_a_chained_stores_buffers_are_reused_by_the_loop_around_its_loop() -> None:
    # codegen gives each run of the innermost loop its own buffer for the stored value; a loop
    # around it runs into the same buffers again, so its later runs wait for the stores before,
    # charged as for stores apart: every inner run's drain
    cm = get_target("vta").cost_model()
    v = ta(F32, 16)
    busy, _ = cm.t.store_cycles(v)
    drain = busy + cm.t.dram.latency
    chained = cm.local("DevOut", ("vta.add", None, v))
    inner = cm.node("Map", (None, 2), [chained])
    outer = cm.node("Map", (None, 124), [inner])
    mvu, chain, cold, reuse_next = (COMPONENTS.index(u) for u in ("mvu", "chain", "cold", "reuse_next"))
    assert inner[reuse_next] == 2 * drain and inner[chain] == 0
    assert outer[mvu] == pytest.approx(124 * inner[mvu] - 123 * inner[cold] + 123 * 2 * drain)
    assert outer[chain] == pytest.approx(123 * 2 * drain) and outer[reuse_next] == 0
    assert cm.node("Map", (None, 1), [inner])[mvu] == inner[mvu]     # run once: nothing reused


def test_a_gemv_stores_each_result_vector_as_it_is_computed() -> None:
    """DeepBench's GEMV 4224x1x128 on brainwave: 33 products, each stored behind the next; the
    model had the matrix unit wait for all 33 stores after the last product (736 predicted)."""
    r = optimize(["MatMul(128, 4224, a_t=True, b_t=True)"], (128, 1), "brainwave", functional=False)
    assert any(t.op == "DevOut" for t in r.term.walk())
    assert abs(r.predicted_cycles / r.cycles - 1) <= 0.05, (r.predicted_cycles, r.cycles)


def test_reduction_chain_waits_for_the_operator_latency() -> None:
    cm = get_target("vta").cost_model()
    add = cm.ops["vta.add"]
    got = cm.local("Reduce", (None, ta(ta(F32, 16), 9)))
    assert got[1] == 9 * (add.latency - add.occupancy)   # eight steps, and the reader of the last one
    wide = cm.local("Reduce", (None, ta(ta(F32, 16 * 64), 9)))   # 64 independent adds per step hide it
    assert wide == (0.0,) * len(COMPONENTS)


def test_node_is_local_plus_scaled_children() -> None:
    cm = get_target("snowflake").cost_model()
    kid = cm.local("Dev", ("sf.max", None, None))
    args = (None, ta(ta(F32, 16), 5))
    want = tuple(a + 4 * b for a, b in zip(cm.local("Reduce", args), kid))
    assert cm.node("Reduce", args, [kid]) == want


@pytest.mark.parametrize("target", sorted(BUILTIN))
def test_combiner_is_local_plus_scaled_children_on_every_enode(target: str) -> None:
    """The combiner greedy extraction prices e-nodes with (its short cuts for re-indexings
    included) gives local + each child's cost counted its scale times, or NEVER, on every e-node
    of a saturated e-graph, with the children's costs greedy chose."""
    tgt = get_target(target)
    cm = tgt.cost_model()
    graph = SharedEGraph(build_model(["Linear(64, 48)", "ReLU()"], (2, 64), values=False).term).saturate(tgt)
    view = GraphView(graph)
    best = greedy_choice(graph, cm, view)
    work = computations(graph, view, cm)
    assert len({len(c.kids) for c in work}) >= 3
    for c in work:
        kids = [best[k].cost for k in c.kids]
        want = cm.local(c.op, c.args)
        if INF in want or any(INF in k for k in kids):
            want = NEVER
        else:
            for k, s in zip(kids, cm.scales(c.op, c.args, len(kids))):
                want = tuple(a + b for a, b in zip(want, cm.counted(k, s, cm.buffers(c.op))))
        assert cm.combiner(c.op, c.args, len(kids))(kids) == want
