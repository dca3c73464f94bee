"""Several targets from one e-graph (`--target all`, comma lists) and ranked alternatives
(`--alternatives K`): same results as separate runs, only the target's own ops and memories,
distinct and ordered alternatives, every program simulated and checked, deterministic."""

from __future__ import annotations

import json

import pytest

from extraction import alternatives
from extraction.greedy import extract_greedy, fixpoint
from frontend.layers import build_model
from liftsat.api import Result, SharedEGraph, optimize, optimize_targets
from liftsat.cli import main
from liftsat.targets import BUILTIN, TargetError, get_target, get_targets

CASES = {
    "fc": (["Linear(64, 32)", "ReLU()"], (2, 64)),
    "conv": (["Conv2d(4, 8, 3, padding=1)"], (1, 4, 6, 6)),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def together(request):
    layers, shape = CASES[request.param]
    return layers, shape, optimize_targets(layers, shape, list(BUILTIN))


def _uses_only_its_own(r: Result) -> None:
    t = get_target(r.target)
    for node in r.term.walk():
        if node.op in ("Dev", "DevOut"):
            assert node.args[0] in t.op_by_name, f"{r.target} program uses {node.args[0]}"
        if node.op == "ToChip":
            assert node.args[0] in t.memories, f"{r.target} program moves into {node.args[0]}"


def test_all_targets_match_separate_runs(together):
    layers, shape, both = together
    assert [r.target for r in both.results] == list(BUILTIN) and not both.failures
    for r in both.results:
        alone = optimize(layers, shape, r.target)
        assert r.term == alone.term
        assert (r.cycles, r.predicted_cycles, r.setup_cycles) == (alone.cycles, alone.predicted_cycles,
                                                                   alone.setup_cycles)
        assert r.max_rel_error < 1e-5
        _uses_only_its_own(r)


def test_the_shared_phase_is_reported_once_and_each_target_grows_from_it(together):
    _, _, both = together
    d = both.as_dict()
    assert d["targets"] == list(BUILTIN)
    assert d["egraph"]["enodes"] == both.egraph.enodes > 0
    for r in both.results:
        assert r.egraph.enodes >= both.egraph.enodes
        assert r.egraph.iterations > both.egraph.iterations


def test_all_is_deterministic():
    layers, shape = CASES["fc"]
    a = optimize_targets(layers, shape, ["systolic", "cpu"])
    b = optimize_targets(layers, shape, ["systolic", "cpu"])
    assert [(r.term, r.cycles) for r in a.results] == [(r.term, r.cycles) for r in b.results]


@pytest.fixture(scope="module")
def ranked():
    return optimize(["GRUCell(64, 64)"], (1, 64), "brainwave", alternatives=5)


def test_alternatives_are_distinct_ordered_and_checked(ranked):
    best = optimize(["GRUCell(64, 64)"], (1, 64), "brainwave")
    assert ranked.term == best.term and ranked.cycles == best.cycles
    programs = [ranked] + ranked.alternatives
    assert len(programs) == 5
    assert len({p.term for p in programs}) == 5
    predicted = [p.predicted_cycles for p in programs]
    assert predicted[1:] == sorted(predicted[1:])
    for p in programs:
        assert p.max_rel_error < 1e-5
        _uses_only_its_own(p)
    d = ranked.as_dict()
    assert [a["predicted_cycles"] for a in d["alternatives"]] == predicted[1:]
    for a, alt in zip(d["alternatives"], ranked.alternatives):
        ops = set(alt.ops) | set(ranked.ops)
        assert a["ops_vs_best"] == {op: alt.ops.get(op, 0) - ranked.ops.get(op, 0) for op in sorted(ops)
                                    if alt.ops.get(op, 0) != ranked.ops.get(op, 0)}
    assert any(a["ops_vs_best"] for a in d["alternatives"])  # per-gate products run more mv_mul


def test_alternatives_are_deterministic(ranked):
    again = optimize(["GRUCell(64, 64)"], (1, 64), "brainwave", alternatives=5)
    assert [a.term for a in again.alternatives] == [a.term for a in ranked.alternatives]
    assert [a.cycles for a in again.alternatives] == [a.cycles for a in ranked.alternatives]


def test_alternatives_combine_each_enode_about_three_times_to_a_fixpoint(monkeypatch):
    """k-best lists are combined cheapest change first, as greedy extraction prices, so on a
    recurrent cell's e-graph (cycles through its compositions and Forks) an e-node is combined
    about three times (in node-id order, these 3 k e-nodes were combined 35.6 k times), and they
    reach a fixpoint: combining any e-node again with its children's final lists changes none."""
    target = get_target("vta", 16)
    model = target.cost_model()
    graph = SharedEGraph(build_model(["GRUCell(64, 64)"], (1, 64), values=False).term).saturate(target)
    runs = []

    def counting(work, improve):
        visits = [0]

        def counted(it):
            visits[0] += 1
            return improve(it)

        fixpoint(work, counted)
        runs.append((work, improve, visits[0]))

    monkeypatch.setattr(alternatives, "fixpoint", counting)
    found = alternatives.k_cheapest(graph, graph.roots["root"], model, 5)
    (work, improve, visits), = runs
    assert len(work) > 3000 and visits < 4 * len(work)
    assert all(improve(it) is False for it in work)  # a change returns its rank, which may be 0.0
    assert found[0].term == extract_greedy(graph, graph.roots["root"], model).term
    assert [f.cycles for f in found] == sorted(f.cycles for f in found)


def test_target_lists():
    assert [t.name for t in get_targets("all")] == list(BUILTIN)
    assert [t.name for t in get_targets("systolic, vta")] == ["systolic", "vta"]
    for bad, says in (("systolic,systolic", "listed twice"), ("vta,", "empty target name"),
                      ("vta,tpu", "unknown target 'tpu'")):
        with pytest.raises(TargetError, match=says):
            get_targets(bad)


def cli(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_all_json_lists_results_side_by_side(capsys):
    code, out, err = cli(["optimize", "Linear(32, 16)", "--input", "1x32", "--target", "systolic,vta", "--json"],
                         capsys)
    assert code == 0, err
    d = json.loads(out)
    assert [r["target"] for r in d["results"]] == ["systolic", "vta"] and d["failures"] == {}
    assert {"enodes", "eclasses", "iterations", "seconds"} <= set(d["egraph"])
    assert all(r["cycles"] > 0 and r["max_rel_error"] < 1e-5 for r in d["results"])


def test_cli_comparison_table_and_alternatives(capsys):
    code, out, _ = cli(["optimize", "Linear(32, 16)", "--input", "1x32", "--target", "brainwave,cpu"], capsys)
    assert code == 0
    table = out.split("\n\n")[0].splitlines()
    assert table[0].startswith("Linear(32, 16): input 1x32; shared e-graph")
    assert [line.split()[0] for line in table[2:]] == ["brainwave", "cpu"]
    code, out, _ = cli(["optimize", "GRUCell(64, 64)", "--input", "1x64", "--alternatives", "3"], capsys)
    assert code == 0
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["1", "2", "3"]


@pytest.mark.parametrize("argv, says", [
    (["--target", "vta,vta"], "listed twice"),
    (["--target", "all", "--alternatives", "0"], "0 is not at least 1"),
])
def test_cli_bad_target_lists(argv, says, capsys):
    code, out, err = cli(["optimize", "Linear(8, 4)", "--input", "1x8", *argv], capsys)
    assert code == 2 and out == ""
    assert says in err and len(err.strip().splitlines()) == 1


def test_a_target_without_a_program_is_reported_beside_the_others(capsys):
    vecmat = "tests/targets/vecmat.toml"  # no sigmoid unit
    both = optimize_targets(["Linear(32, 16)", "Sigmoid()"], (1, 32), ["brainwave", vecmat])
    assert [r.target for r in both.results] == ["brainwave"] and both.results[0].max_rel_error < 1e-5
    assert list(both.failures) == ["vecmat"] and "no program" in both.failures["vecmat"]
    code, out, err = cli(["optimize", "Linear(32, 16)", "Sigmoid()", "--input", "1x32", "--target",
                          f"brainwave,{vecmat}"], capsys)
    assert code == 0 and "vecmat       no program" in out
    code, out, err = cli(["optimize", "Linear(32, 16)", "--input", "1x32", "--target", "brainwave,cpu",
                          "--max-iterations", "1"], capsys)
    assert code == 2 and out == "" and err.startswith("liftsat: error: no target has a program")


def test_a_program_that_does_not_fit_gives_way_to_the_next_cheapest(monkeypatch):
    """The cost model checks capacity on moves, stores and reductions only; when codegen finds the
    cheapest program overflowing a memory, the next cheapest that fits is generated instead."""
    import liftsat.api as api
    from hwmodels.codegen import CapacityError

    first = optimize(["GRUCell(64, 64)"], (1, 64), "brainwave")
    real = api.generate

    def overflowing(term, target):
        if term == first.term:
            raise CapacityError("bw.vrf overflow: the program needs 2 MiB, capacity 1 MiB")
        return real(term, target)

    monkeypatch.setattr(api, "generate", overflowing)
    r = optimize(["GRUCell(64, 64)"], (1, 64), "brainwave", alternatives=2)
    # the next cheapest by tree cost, as greedy and k-best extraction rank programs: its
    # prediction, which pays a shared sub-term once, may be lower (356 cycles against 364)
    assert r.term != first.term
    assert r.max_rel_error < 1e-5 and len(r.alternatives) == 1
    assert r.unbuildable == [f"predicted {first.predicted_cycles:.0f} cycles: bw.vrf overflow: the program needs "
                             "2 MiB, capacity 1 MiB"]
    assert r.as_dict()["unbuildable"] == r.unbuildable
