"""Weight-stationary GEMMs: a batch of rows through weights that do not fit on chip reads every
weight block once, not once per row (the weight loop goes outside the row loop); through pinned
weights, the same loop order hides the accumulation's latency."""

from __future__ import annotations

from egraph_rules.saturate import Budget
from liftsat.api import optimize
from liftsat.rulesets import memory_guards
from liftsat.targets import get_target


def test_streamed_weights_are_read_once_for_the_whole_batch():
    """Linear(512, 512) on snowflake (1 MiB of weights, 512 KiB buffers): at batch 16 the program
    reads each weight block once and uses it for all 16 rows, so it takes about twice the cycles of
    batch 1 (its MACs are 16 times as many), where a row-by-row program takes 16 times."""
    one = optimize(["Linear(512, 512)"], (1, 512), target="snowflake")
    batch = optimize(["Linear(512, 512)"], (16, 512), target="snowflake")
    assert batch.max_rel_error <= 1e-4 and one.max_rel_error <= 1e-4
    assert batch.weights["W0"] == "streamed"
    assert batch.ops["MAC"] == 16 * one.ops["MAC"]
    assert batch.cycles < 2.5 * one.cycles


def test_output_columns_padded_to_whole_blocks_still_read_each_weight_block_once():
    """Linear(512, 500) on snowflake: 500 output columns are not whole 16-wide blocks, so the
    weight-stationary rewrite pads the weights with zero columns and slices each result row back
    to 500 (their store lays the joined blocks out for the slice). At batch 16 each weight block
    is then loaded once for all rows (1.06x the cycles of batch 1; row by row it took 15.9x)."""
    one = optimize(["Linear(512, 500)"], (1, 512), target="snowflake")
    batch = optimize(["Linear(512, 500)"], (16, 512), target="snowflake")
    assert batch.max_rel_error <= 1e-4 and one.max_rel_error <= 1e-4
    assert batch.weights["W0"] == "streamed"
    assert batch.ops["MAC"] == 16 * one.ops["MAC"]
    assert batch.ops["LOAD"] < 2 * one.ops["LOAD"]
    assert batch.cycles < 1.5 * one.cycles
    assert abs(batch.predicted_cycles / batch.cycles - 1) <= 0.10, (batch.predicted_cycles, batch.cycles)


def test_padded_output_columns_are_written_into_rows_with_room_for_whole_blocks():
    """MatMul(512, 35) over 24 rows on the systolic array: the weights padded to 48 columns are
    pinned, each band's rows run through each tile once, and each result row (three 16-wide
    blocks) is written into its output row, which has room for 48, and sliced to 35 there. The
    cheapest program lays out, 6,668 cycles (39,389 row by row); its output matches numpy."""
    r = optimize(["MatMul(512, 35, a_t=True, b_t=True)"], (512, 24), target="systolic")
    assert r.max_rel_error <= 1e-4
    assert r.unbuildable == []
    assert r.weights["B"] == "pinned"
    assert r.egraph.matches_per_rule.get("mmmul-weight-stationary-tiles/16", 0) > 0
    assert r.cycles < 10_000
    assert abs(r.predicted_cycles / r.cycles - 1) <= 0.10, (r.predicted_cycles, r.cycles)


def test_weights_that_fit_run_in_bands_where_that_hides_the_accumulation_latency():
    """Conv2d(16, 32, 3) + ReLU over 256 output pixels on VTA: the weights (4,608 elements) fit
    on chip, yet the rows run in bands of 93 and each band weight-stationary. Row by row, each
    pixel's nine tile products were summed by a chain of dependent ALU adds, each waiting out
    the ALU's 46-cycle latency (132,956 cycles); in bands, each step of the sum adds a band's
    rows, which hides it. Each band loads its rows once and its 18 weight tiles beside its bias
    blocks: 16,870 cycles, predicted 16,557. A program loading each band's rows once per block of
    output channels is predicted as fast (the model's busiest unit is not the DMA) and runs 19,288;
    the model's `work` breaks the tie, which egglog 14's node ids broke the other way."""
    r = optimize(["Conv2d(16, 32, 3, padding=1)", "ReLU()"], (1, 16, 16, 16), target="vta")
    assert r.max_rel_error <= 1e-4
    assert r.egraph.matches_per_rule.get("batched-linear-bands", 0) > 0
    assert r.egraph.matches_per_rule.get("mmmul-weight-stationary-tiles/16", 0) > 0
    assert r.ops["GEMM"] == 3 * 93 * 9 * 2              # three bands of 93 rows (the last padded), 9 x 2 tiles
    assert r.ops["LOAD"] < 3_000                        # 2,565; 5,076 with each band loaded per block
    assert r.cycles < 18_000
    assert abs(r.predicted_cycles / r.cycles - 1) <= 0.10, (r.predicted_cycles, r.cycles)


def test_rows_that_do_not_fit_run_in_bands():
    """Linear(1024, 256) over 64 rows on snowflake: the weights (1 MiB) and the 64 rows with their
    results do not fit its 512 KiB buffers, so the rows run in bands of 25 (the last one padded),
    each band weight-stationary: three passes over the weights instead of 64 (a row-by-row
    program would take about 64 times the cycles of one row; this one takes about 6)."""
    one = optimize(["Linear(1024, 256)"], (1, 1024), target="snowflake", functional=False)
    banded = optimize(["Linear(1024, 256)"], (64, 1024), target="snowflake")
    assert banded.max_rel_error <= 1e-4
    assert banded.egraph.matches_per_rule.get("batched-linear-bands", 0) > 0
    assert banded.cycles < 8 * one.cycles


def test_weights_count_as_pinned_only_where_the_matrix_unit_reads_them():
    """The systolic array reads its weights from its mesh (two 16 x 16 blocks); weights pinned in
    its scratchpad are preloaded into the mesh at every use, so the weight-stationary rules are
    offered for any weights larger than the mesh. Elsewhere the matrix unit reads its largest
    memory (BrainWave's matrix register file)."""
    assert memory_guards(get_target("systolic")).pinnable == 2 * 16 * 16
    brainwave = get_target("brainwave")
    assert memory_guards(brainwave).pinnable == brainwave.memories["bw.mrf"].capacity // 4


def test_bands_count_the_result_memory_twice_where_the_rows_live_elsewhere():
    """VTA and the systolic array read a GEMM's rows from another memory than the one its results
    go to, which then holds only results and partial products; on BrainWave rows and results
    share the vector register file."""
    for name, rows in (("vta", "vta.inp"), ("systolic", "gm.sp")):
        t = get_target(name)
        g = memory_guards(t)
        assert g.banded == 2 * g.resident == 2 * t.result_capacity // 4
        assert g.apart == (t.memories[rows].capacity // 4 * 3 // 4, g.resident // 4)   # a wider band's room
    g = memory_guards(get_target("brainwave"))
    assert g.banded == g.resident and g.apart is None


def test_a_band_fills_the_rows_memory_where_rows_and_results_are_apart():
    """AlexNet conv3 on VTA: its im2col GEMM's rows (1,728 elements) are read from the input
    buffer (32,768 elements), its results (384 a row) go to the accumulator (32,768). A quarter of
    the two together gave bands of 7 rows (3.53 M simulated cycles); three quarters of the input
    buffer for the rows and a quarter of the accumulator for the results give bands of
    min(24,576 // 1,728, 8,192 // 384) = 14, a pass over the weights per 14 rows (2.10 M)."""
    r = optimize(["Conv2d(192, 384, 3, padding=1)"], (1, 192, 13, 13), target="vta", functional=False)
    bands = {t.args[0] for t in r.term.walk() if t.op == "Split"}
    assert 14 in bands and 7 not in bands, bands
    assert r.cycles < 2_500_000
    assert abs(r.predicted_cycles / r.cycles - 1) <= 0.10, (r.predicted_cycles, r.cycles)


def test_systolic_convolution_preloads_each_tile_once_per_band_of_rows():
    """Conv2d(1, 32, (5, 20)) over 494 output pixels on the systolic array: per band of 62 rows
    (the accumulator's share), each of the 14 weight tiles is preloaded once and every row of
    the band streams through it (mmmul-weight-stationary-tiles), instead of one preload per
    pixel and tile. 118,508 simulated cycles with a preload per pixel; 466,818 with every block
    moved from DRAM per use."""
    r = optimize(["Conv2d(1, 32, (5, 20), stride=(2, 8), padding=(8, 8))"], (1, 1, 40, 151), target="systolic")
    assert r.max_rel_error <= 1e-4
    assert r.egraph.matches_per_rule.get("mmmul-weight-stationary-tiles/16", 0) > 0
    assert r.ops["compute"] == 8 * 62 * 14 and r.ops["preload"] == 8 * 14   # 8 bands of 62 rows
    assert r.cycles < 40_000
    assert abs(r.predicted_cycles / r.cycles - 1) <= 0.10, (r.predicted_cycles, r.cycles)


def test_a_transposed_accumulator_view_moved_in_place_is_read_where_it_is():
    """Conv2d(3, 32, 3) on an 8 x 8 image on the systolic array, weight-stationary: its bias add
    reads each pixel's row of the [block][pixel] results, moved where they already are
    (tochip-hoist-from-map moved the whole array before the loop). That view is transposed;
    codegen laid it out again in pixel order through DRAM (a store and a load per native vector,
    1,128 cycles) until `leftcomp` let tochip-elide drop the move and `const-ignores-input`
    freed the bias of the re-indexing, so the loop reads the results where they are (872
    cycles). Saturation stops at the iteration limit: in 7 s with egglog 13.2, in 16 s with
    egglog 14, which the default 10 s stopped first with a program moving the im2col rows in
    more pieces (1,064 cycles)."""
    r = optimize(["Conv2d(3, 32, 3, padding=1)"], (1, 3, 8, 8), target="systolic", budget=Budget(seconds=120))
    assert r.max_rel_error <= 1e-4
    assert r.ops["preload"] == 2 * 2 and r.ops["compute"] == 64 * 2 * 2      # 2 x 2 tiles, 64 pixels
    assert r.ops["mvout"] == 64 * 2                                           # the result only
    assert r.cycles < 900 and abs(r.predicted_cycles / r.cycles - 1) <= 0.02


def test_an_activation_after_padded_bands_runs_in_the_band_loop():
    """Conv2d(16, 32, 3) + ReLU on 16 x 16 on the systolic array: six bands of 46 rows, the last
    padded. The ReLU over the 256 pixels moves through the Split and the Slice that drop the
    padding (map-through-slice) into each band, so each band's output is
    activated and stored before the next band: the whole output never sits in the accumulator
    beside a band's products (16,960 of its 16,384 elements), which left only the per-pixel
    program (78,728 simulated cycles). Saturation stops at the node limit: it takes 9.3 s with
    egglog 13.2 and 12 s with egglog 14, so the default 10 s could stop it first, earlier on a
    busier machine, with a slower program (20,644 cycles on egglog 14)."""
    r = optimize(["Conv2d(16, 32, 3, padding=1)", "ReLU()"], (1, 16, 16, 16), target="systolic",
                 budget=Budget(seconds=120))
    assert r.max_rel_error <= 1e-4
    assert r.egraph.matches_per_rule.get("map-through-slice", 0) > 0
    assert r.ops["preload"] == 6 * 2 * 9 and r.ops["relu"] == 6 * 46 * 2     # padding rows activated too
    assert r.cycles < 20_000
    assert abs(r.predicted_cycles / r.cycles - 1) <= 0.10, (r.predicted_cycles, r.cycles)


def _stored_in_the_block_loop(layer: str):
    """`layer` over 16 rows of 64 on a systolic array whose accumulator (16 KiB) cannot hold the
    16 x 320 results (20 KiB) at once: the program must store each block of 16 output columns in
    the loop over blocks, where its sum is. (The model charges each block's store as if the mesh
    waited for it, 1.6-1.7x the simulated cycles here, where a block's work is short: "Known
    limits" in the README.)"""
    small = get_target("systolic").with_memory("gm.acc", capacity=16 * 1024)
    return optimize([layer], (16, 64), target=small, budget=Budget(seconds=120))


def test_each_block_of_results_is_stored_where_it_is_summed():
    """MatMul(64, 320): the tiling rule ends its program with the blocks' results joined into rows;
    `compose-assoc` re-associates that Map of Join when the GEMM's e-class gains it late, and
    `tooutput-through-view` passes it and the transpose of whole rows before it, so the store
    goes into the loop over blocks: all 16 rows run through each weight tile once, with one
    block's results on chip at a time (before: 9,732 cycles in bands, now 2,820)."""
    r = _stored_in_the_block_loop("MatMul(64, 320)")
    assert r.max_rel_error <= 1e-4 and r.unbuildable == []
    assert r.ops["preload"] == 64 * 320 // 16 // 16          # each tile into the mesh once
    assert r.ops["compute"] == 16 * r.ops["preload"]         # all 16 rows through it
    assert r.ops["mvout"] == 16 * 320 // 16


def test_a_bias_is_added_where_each_block_of_results_is():
    """Linear(64, 320): the same with a bias, added to each block's rows in the loop over blocks
    (`mmmul-bias-weight-stationary-tiles`), so the block is stored there too (before:
    10,021 cycles in bands, now 5,713)."""
    r = _stored_in_the_block_loop("Linear(64, 320)")
    assert r.max_rel_error <= 1e-4 and r.unbuildable == []
    assert r.egraph.matches_per_rule.get("mmmul-bias-weight-stationary-tiles/16", 0) > 0
    assert r.ops["preload"] == 64 * 320 // 16 // 16
    assert r.ops["compute"] == 16 * r.ops["preload"]
    assert r.ops["mvout"] == 16 * 320 // 16


def test_a_weight_move_fused_back_into_its_loop_is_not_stacked_again():
    """Linear(1024, 1024) at batch 16 on brainwave: `tochip-hoist-from-map` takes the weights' move
    out of the loop over blocks, `map-fusion` fuses it back in and `fork-distribute` puts it on
    the branch that reads only the row, a composition (f . m) . m whose both halves compose-assoc
    has hidden. Its `leftcomp` records make it f . m, so the e-graph saturates (26 iterations in
    all); without that, the branch gained one more move every third step and saturation stopped
    at the iteration limit (3,211 e-nodes), with the same program."""
    r = optimize(["Linear(1024, 1024)"], (16, 1024), target="brainwave")
    assert r.egraph.saturated, r.egraph.stop_reason
    assert r.egraph.enodes < 3000
    assert r.max_rel_error <= 1e-4
    assert r.ops["mv_mul"] == 16 * 8 * 8  # each row through each of the 8 x 8 weight tiles once
