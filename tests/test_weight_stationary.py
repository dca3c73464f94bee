"""Weight-stationary GEMMs: a batch of rows through weights that do not fit on chip reads every
weight block once, not once per row (the weight loop goes outside the row loop)."""

from __future__ import annotations

from liftsat.api import optimize


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


def test_pinned_weights_keep_the_row_loop_outside():
    """Weights that fit on chip are pinned; the weight-stationary form is not offered (its guard
    needs weights larger than the targets' memories), so each row runs through pinned tiles."""
    r = optimize(["Linear(256, 256)"], (4, 256), target="brainwave", native_dim=32)
    assert r.weights["W0"] == "pinned" and r.max_rel_error <= 1e-4
    assert "mmmul-weight-stationary/32" not in {k for k, v in r.egraph.matches_per_rule.items() if v}


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
