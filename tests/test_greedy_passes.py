"""Greedy extraction's two rankings: sub-programs as programs and as loop bodies. Each wins on
some layer, extraction keeps the cheaper whole program, and the program it keeps runs as
fast as predicted and computes the layer."""

from __future__ import annotations

import numpy as np
import pytest

from extraction.greedy import LOOP_RUNS, GraphView, chosen_program, extract_greedy, greedy_choice
from extraction.ilp import extract_ilp
from frontend.layers import build_model
from hwmodels.codegen import generate
from liftsat.api import SharedEGraph, run_checked
from liftsat.targets import get_target

#: (layer, input shape, the ranking whose program is cheaper, by how much at least)
CASES = [
    # DeepBench's 14x14x256 1x1 training convolution on 16 images: ranked as a loop body, an
    # image's products run weight tile by weight tile with its stores after them (106,156
    # cycles predicted), not pixel by pixel with a store per pixel (152,320)
    ("Conv2d(256, 1024, 1, stride=2)", (16, 256, 14, 14), LOOP_RUNS, 0.25),
    # so small a layer that its one-off waits decide: ranked as a program (1,980 against 2,256)
    ("Conv2d(128, 256, 1)", (4, 128, 4, 4), 1.0, 0.1),
]


@pytest.fixture(scope="module", params=CASES, ids=[f"{c[0]}-{'x'.join(map(str, c[1]))}" for c in CASES])
def passes(request):
    layer, shape, winner, margin = request.param
    target = get_target("brainwave")
    model = build_model([layer], shape)
    graph = SharedEGraph(model.term).saturate(target)
    cm, view, root = target.cost_model(), GraphView(graph), graph.roots["root"]
    found = {runs: chosen_program(root, greedy_choice(graph, cm, view, runs), view, cm) for runs in (1.0, LOOP_RUNS)}
    return graph, model, target, found, winner, margin


def test_greedy_keeps_the_cheaper_ranking_and_each_ranking_wins_somewhere(passes):
    graph, _, target, found, winner, margin = passes
    loser = LOOP_RUNS if winner == 1.0 else 1.0
    assert found[winner].cycles < (1 - margin) * found[loser].cycles
    best = extract_greedy(graph, graph.roots["root"], target.cost_model())
    assert (best.term, best.cycles) == (found[winner].term, found[winner].cycles)


def test_both_programs_compute_the_layer_and_the_loop_ranked_one_runs_faster(passes):
    """The small layer's two programs run within 1% of each other (1,641 and 1,636 cycles: the
    model over-predicts both, the loser more); the convolution's run 103,722 and 140,580."""
    _, model, target, found, winner, _ = passes
    runs = {}
    for key, program in found.items():
        timing, _, err, _ = run_checked(generate(program.term, target), model, target, functional=True)
        assert err <= 1e-4 * max(1.0, float(np.abs(model.reference).max()))
        runs[key] = timing.cycles
    if winner == LOOP_RUNS:
        assert runs[LOOP_RUNS] < 0.8 * runs[1.0]
        assert abs(found[LOOP_RUNS].cycles / runs[LOOP_RUNS] - 1) <= 0.10
    else:
        assert runs[winner] <= 1.01 * runs[LOOP_RUNS]


def test_the_ilp_starts_from_the_cheaper_ranking(passes):
    graph, _, target, found, winner, _ = passes
    r = extract_ilp(graph, graph.roots["root"], target.cost_model(), time_limit=2.0)
    assert r.greedy.term == found[winner].term
    assert r.cycles <= r.greedy_dag_cycles
