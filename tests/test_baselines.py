"""The phase-ordered baseline: it compiles with the same rules, phase by phase, its programs run
and are correct, and committing after each phase loses what the e-graph keeps."""

from __future__ import annotations

import numpy as np

from frontend.layers import build_model
from hwmodels.codegen import generate
from hwmodels.simulator import simulate
from liftsat.api import optimize
from liftsat.baselines import PHASES, phase_ordered
from liftsat.targets import get_target


def _run(layers: list[str], shape: tuple[int, ...], target: str, functional: bool = True):
    t = get_target(target)
    model = build_model(layers, shape, values=functional)
    phases = phase_ordered(model.term, t)
    program = generate(phases[-1].program.term, t)
    run = simulate(program, t.native_dim, model.env if functional else None, functional=functional)
    return model, phases, run


def test_phase_ordered_programs_run_and_match_numpy():
    for target in ("brainwave", "systolic"):
        model, phases, run = _run(["Linear(48, 20)", "ReLU()"], (2, 48), target)
        assert [p.name for p in phases] == [name for name, _ in PHASES]
        assert phases[0].program is None  # a layer needs tiling before it runs
        assert str(phases[0]).startswith("lower: no runnable program yet")
        assert phases[1].program and phases[2].program
        assert phases[2].program.cycles <= phases[1].program.cycles  # a phase never commits to worse
        out = run.output.reshape(model.output_shape)
        np.testing.assert_allclose(out, model.reference, rtol=1e-5, atol=1e-5)


def test_a_phase_commits_to_the_cheapest_program_codegen_lays_out():
    """ReLU over 16x1024 on the systolic array: a program that loads the whole input into the
    64 KiB accumulator is predicted as fast as one loading it row by row and moves no more
    data, but its results would overflow the accumulator; the last phase commits to the next
    cheapest, which runs and matches numpy, as liftsat's compile does."""
    model, phases, run = _run(["ReLU()"], (16, 1024), "systolic")
    np.testing.assert_allclose(run.output.reshape(model.output_shape), model.reference)
    assert phases[-1].program.cycles == optimize(["ReLU()"], (16, 1024), "systolic").predicted_cycles


def test_committing_early_loses_the_weight_stationary_order():
    """Tiling commits to rows outside weight blocks before restructuring could hoist the weight
    loop; the shared e-graph keeps both orders and extracts kernels-outer."""
    layers, shape = ["Linear(512, 512)"], (16, 512)
    *_, run = _run(layers, shape, "snowflake", functional=False)
    mine = optimize(layers, shape, "snowflake", functional=False)
    assert mine.cycles * 5 < run.cycles
