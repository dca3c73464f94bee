"""Timing-only simulation proves loops periodic and skips whole periods (hwmodels/simulator.py);
it must give exactly what executing every iteration gives: cycles, setup cycles, dynamic
instructions, unit activity (busy cycles, when each unit's last result is ready), and the final scoreboard (ready and last-read time of every block).

Programs: hand-built ones (nested loops, loop-carried chains, producer/consumer loops, strides
that are not whole blocks, negative strides, operands whose strides conflict, a unit that runs
ahead of the others), generated ones from `liftsat.optimize` (pinned, cell, streamed), and
seeded random programs in the shape code generation produces."""

from __future__ import annotations

import random

import numpy as np
import pytest

from frontend.layers import build_model, parse_layer
from hwmodels import simulator
from hwmodels.isa import Affine, Instr, Loop, Operand, Program
from hwmodels.simulator import SimulationError, simulate
from liftsat import optimize
from liftsat.targets import get_target

G = 4                                   # native block (vector) size of the hand-built programs


# ---------------------------------------------------------------- machines and the exactness check


class Walker(simulator._Machine):
    """Timing-only, executing every iteration: the fast path switched off."""

    def _info(self, loop, counters):
        return simulator._LoopInfo(False)


class CountingMachine(simulator._Machine):
    """The real timing-only machine, counting the instructions it actually executes."""

    walked = 0

    def step(self, ins, counters):
        self.walked += 1
        super().step(ins, counters)


def timing_run(cls, program: Program, g: int):
    """What `simulate(functional=False)` does, with a chosen machine: (its state after the
    setup, the machine at the end)."""
    m = cls(program, g, False)
    m.run(program.setup, {})
    after_setup = _state(m)
    m.reset_time()
    m.run(program.body, {})
    return after_setup, m


def _state(m: simulator._Machine):
    return {"end": m.end, "count": m.count, "dispatch": m.dispatch, "busy": dict(m.busy),
            "done": dict(m.done), "unit_free": dict(m.unit_free),
            "ready": {s: a.copy() for s, a in m.ready.items()},
            "lastread": {s: a.copy() for s, a in m.lastread.items()}}


def _assert_same_state(a: dict, b: dict) -> None:
    for k in ("end", "count", "dispatch", "busy", "done", "unit_free"):
        assert a[k] == b[k], k
    for k in ("ready", "lastread"):
        for space in a[k]:
            np.testing.assert_array_equal(a[k][space], b[k][space], err_msg=f"{k} of {space}")


def _outcome(run):
    try:
        return run(), None
    except SimulationError as exc:
        return None, str(exc)


def check_exact(program: Program, g: int, env: dict | None = None) -> int:
    """Functional, timing-only and walking timing-only runs agree exactly; returns how many loop
    iterations the timing-only run skipped. A program that fails must fail the same way in all."""
    fun, error = _outcome(lambda: simulate(program, g, env if env is not None else {}, functional=True))
    tim, error_timing = _outcome(lambda: simulate(program, g, None, functional=False))
    _, error_walking = _outcome(lambda: timing_run(Walker, program, g))
    assert error == error_timing == error_walking
    if error:
        return 0
    assert tim.cycles == fun.cycles
    assert tim.setup_cycles == fun.setup_cycles
    assert tim.dynamic_instructions == fun.dynamic_instructions == program.dynamic_count()
    assert tim.unit_busy == fun.unit_busy
    assert tim.unit_done == fun.unit_done
    assert max(tim.unit_done.values(), default=0) == tim.cycles
    fast_setup, fast = timing_run(simulator._Machine, program, g)
    walk_setup, walk = timing_run(Walker, program, g)
    _assert_same_state(fast_setup, walk_setup)
    _assert_same_state(_state(fast), _state(walk))
    assert fast.end == fun.cycles
    return fast.skipped_iterations


# ---------------------------------------------------------------- hand-built programs


def A(base: int, *terms: tuple[int, int]) -> Affine:
    return Affine(base, tuple(sorted(terms)))


def vec(space: str, addr: Affine, cols: int = G) -> Operand:
    return Operand(space, addr, 1, cols, cols)


def op(unit: str, occ: int, lat: int, dst: Operand, *srcs: Operand) -> Instr:
    return Instr("op", "load" if len(srcs) == 1 else "VVAdd", unit, occ, lat, dst, srcs)


def program(body: list, sizes: dict[str, int], setup: list | None = None) -> Program:
    return Program("hand", setup or [], body, {"dram": 16, **sizes}, [], 0, (1,), (1,))


def tiled_matvec(rows: int, dma: int = 2, mvu: int = 1, mfu: int = 1) -> Program:
    """Codegen's shape: per row, load x (8 vectors), 4 output blocks of 8 tile products and a
    partial-sum chain into an accumulator, then store the 4 blocks. Four nesting levels."""
    X, T, ACC = 0, 64, 128
    body = [Loop(0, rows, [
        Loop(1, 8, [op("dma", dma, dma + 20, vec("vrf", A(X, (1, G))), vec("dram", A(0, (0, 8 * G), (1, G))))]),
        Loop(2, 4, [
            Loop(3, 8, [Instr("mv", "MVMul", "mvu", mvu, mvu + 6, vec("vrf", A(T, (3, G))),
                              (Operand("mrf", A(0, (2, 8 * G * G), (3, G * G)), G, G, G), vec("vrf", A(X, (3, G)))))]),
            op("mfu", mfu, mfu + 3, vec("vrf", A(ACC, (2, G))), vec("vrf", A(T)), vec("vrf", A(T + G))),
            Loop(4, 6, [op("mfu", mfu, mfu + 3, vec("vrf", A(ACC, (2, G))), vec("vrf", A(ACC, (2, G))),
                           vec("vrf", A(T + 2 * G, (4, G))))]),
        ]),
        Loop(5, 4, [op("dma", dma, dma + 20, vec("dram", A(rows * 8 * G, (0, 4 * G), (5, G))),
                       vec("vrf", A(ACC, (5, G))))]),
    ])]
    setup = [Loop(6, 32, [Instr("m_rd", "load", "dma", 4, 30, Operand("mrf", A(0, (6, G * G)), G, G, G),
                                (Operand("dram", A(0, (6, G * G)), G, G, G),))])]
    return program(body, {"dram": rows * 12 * G + 32 * G * G, "vrf": 256, "mrf": 32 * G * G}, setup)


@pytest.mark.parametrize("units", [
    dict(dma=2, mvu=1, mfu=1),       # dispatch-bound
    dict(dma=40, mvu=1, mfu=1),      # DMA-bound: the queue in front of the DMA grows without end
    dict(dma=1, mvu=9, mfu=1),       # matrix-unit-bound
    dict(dma=0, mvu=0, mfu=0),       # zero occupancy
])
def test_nested_loops_are_exact(units):
    skipped = check_exact(tiled_matvec(40, **units), G)
    assert skipped > 25                 # the row loop became periodic and was skipped


def test_loop_carried_accumulation_is_exact():
    """acc += x[i]: each iteration waits for the previous one's latency (Delta > instructions)."""
    body = [Loop(0, 500, [op("mfu", 1, 9, vec("vrf", A(0)), vec("vrf", A(0)), vec("dram", A(0, (0, G))))])]
    assert check_exact(program(body, {"dram": 500 * G, "vrf": 64}), G) > 400


def test_ping_pong_chain_is_exact():
    """Two accumulators feeding each other, on two units with different latencies."""
    body = [Loop(0, 300, [
        op("mfu", 1, 7, vec("vrf", A(0)), vec("vrf", A(G)), vec("dram", A(0, (0, G)))),
        op("mvu", 2, 11, vec("vrf", A(G)), vec("vrf", A(0)), vec("dram", A(0, (0, G)))),
    ])]
    assert check_exact(program(body, {"dram": 300 * G, "vrf": 64}), G) > 200


def test_consumer_of_a_slow_producer_is_exact():
    """A loop that reads what an earlier, slower loop wrote: the scoreboard entries it will read
    are already in the future when it starts, spaced by the producer's period."""
    body = [
        Loop(0, 200, [op("dma", 10, 110, vec("vrf", A(0, (0, G))), vec("dram", A(0, (0, G))))]),
        Loop(1, 200, [op("mfu", 1, 4, vec("vrf", A(1024, (1, G))), vec("vrf", A(0, (1, G))), vec("vrf", A(2000)))]),
        Loop(2, 200, [op("dma", 3, 100, vec("dram", A(1024, (2, G))), vec("vrf", A(1024, (2, G))))]),
    ]
    assert check_exact(program(body, {"dram": 2048, "vrf": 2048 + G}), G) > 300


def test_strides_that_are_not_whole_blocks_are_exact():
    """Addresses step by 1, 2 and 6 elements of 4-element blocks, and strided 3-row tiles whose
    rows overlap from one iteration to the next: the block pattern repeats every 4 iterations."""
    tile = Operand("vrf", A(512, (0, 2)), 3, G, 10)
    body = [Loop(0, 120, [
        op("dma", 1, 12, vec("vrf", A(1, (0, 1))), vec("dram", A(3, (0, 6)))),
        op("mfu", 1, 5, vec("vrf", A(512, (0, 2))), vec("vrf", A(1, (0, 1))), vec("vrf", A(200))),
        Instr("t", "load", "mvu", 2, 8, Operand("vrf", A(900, (0, 2)), 3, G, 10), (tile,)),
    ])]
    assert check_exact(program(body, {"dram": 1024, "vrf": 1300}), G) > 0


def test_negative_strides_are_exact():
    body = [Loop(0, 150, [
        op("dma", 2, 30, vec("vrf", A(4 * 149, (0, -4))), vec("dram", A(0, (0, G)))),
        op("mfu", 1, 4, vec("dram", A(1000 + 4 * 149, (0, -4))), vec("vrf", A(4 * 149, (0, -4))), vec("vrf", A(700))),
    ])]
    assert check_exact(program(body, {"dram": 1700, "vrf": 800}), G) > 100


def test_conflicting_strides_fall_back_and_stay_exact():
    """out[2i] = in[i] + in[i] in one buffer: two stride classes meet on written blocks."""
    body = [Loop(0, 100, [op("mfu", 1, 6, vec("vrf", A(0, (0, 2 * G))), vec("vrf", A(0, (0, G))),
                             vec("vrf", A(0, (0, G))))])]
    check_exact(program(body, {"vrf": 100 * 2 * G + G}), G)


def test_a_unit_running_ahead_is_not_skipped_but_exact():
    """The known limit: the DMA chain falls further behind every iteration while the vector unit
    keeps pace with dispatch; no single shift describes both, so the loop is walked."""
    body = [Loop(0, 120, [
        op("dma", 20, 120, vec("vrf", A(0)), vec("dram", A(0, (0, G)))),
        op("mfu", 1, 4, vec("vrf", A(64, (0, G))), vec("vrf", A(32)), vec("vrf", A(36))),
    ])]
    assert check_exact(program(body, {"dram": 120 * G, "vrf": 64 + 120 * G}), G) == 0


def test_inner_loop_whose_time_grows_is_exact():
    """An inner loop whose trip count is fixed but whose work waits on an outer-loop chain."""
    body = [Loop(0, 80, [
        op("mvu", 5, 30, vec("vrf", A(0)), vec("vrf", A(0)), vec("dram", A(0, (0, G)))),
        Loop(1, 10, [op("mfu", 1, 3, vec("vrf", A(64, (1, G))), vec("vrf", A(0)), vec("dram", A(0, (1, G))))]),
        Loop(2, 10, [op("dma", 2, 40, vec("dram", A(400, (0, 10 * G), (2, G))), vec("vrf", A(64, (2, G))))]),
    ])]
    assert check_exact(program(body, {"dram": 400 + 800 * G, "vrf": 256}), G) > 50


@pytest.mark.parametrize("functional", [True, False])
def test_an_access_out_of_bounds_late_in_a_long_loop_is_still_found(functional):
    body = [Loop(0, 1000, [op("dma", 1, 20, vec("vrf", A(0, (0, G))), vec("dram", A(0)))])]
    p = program(body, {"dram": 64, "vrf": 900 * G})
    with pytest.raises(SimulationError, match=r"access vrf\[3600:3604\] outside the 3600 elements"):
        simulate(p, G, {} if functional else None, functional=functional)
    if not functional:                  # it skipped up to the failing iteration, and walked that
        m = CountingMachine(p, G, False)
        with pytest.raises(SimulationError, match="outside"):
            m.run(p.body, {})
        assert m.walked < 100 and m.count == 900


def test_timing_only_work_does_not_grow_with_trip_counts():
    """Executed (not skipped) instructions stay the same when the loop runs 10x longer."""
    walked = []
    for rows in (100, 1000):
        _, m = timing_run(CountingMachine, tiled_matvec(rows), G)
        assert m.count == tiled_matvec(rows).dynamic_count()
        walked.append(m.walked)
    assert walked[1] <= walked[0] * 1.2
    assert walked[0] * 5 < tiled_matvec(100).dynamic_count()


# ---------------------------------------------------------------- programs from liftsat.optimize


def _small_mrf(native: int, tiles: int):
    """brainwave with a matrix register file of `tiles` native tiles, so weights get streamed."""
    return get_target("brainwave", native).with_memory("bw.mrf", capacity=tiles * native * native * 4)


@pytest.mark.parametrize("layers, shape, native, mrf_tiles, weights", [
    (["Linear(256, 256)"], (8, 256), 32, None, "pinned"),
    (["GRUCell(64, 32)"], (1, 64), 32, None, "pinned"),
    (["GRUCell(64, 32)"], (12, 64), 32, None, "pinned"),
    (["Linear(64, 64)"], (16, 64), 32, 2, "streamed"),
    (["Linear(256, 256)"], (2, 256), 32, 8, "streamed"),
])
def test_generated_programs_are_exact(layers, shape, native, mrf_tiles, weights):
    target = _small_mrf(native, mrf_tiles) if mrf_tiles else get_target("brainwave", native)
    r = optimize(layers, shape, target=target)
    assert weights in r.weights.values()
    env = build_model([parse_layer(s) for s in layers], shape).env
    check_exact(r.program, native, env)


def test_generated_batch_loop_is_skipped():
    layers, shape = ["Linear(256, 256)", "ReLU()"], (40, 256)
    r = optimize(layers, shape, native_dim=32)
    assert check_exact(r.program, 32, build_model([parse_layer(s) for s in layers], shape).env) > 30
    _, m = timing_run(CountingMachine, r.program, 32)
    assert m.count == r.dynamic_instructions
    assert m.walked * 3 < r.dynamic_instructions


# ---------------------------------------------------------------- seeded random programs


def random_program(rng: random.Random) -> tuple[Program, int]:
    """Codegen-like: buffers with per-loop strides, accumulators, operands reused by later
    instructions (sometimes with a doubled stride, so stride classes collide), mixed units."""
    g = rng.choice([2, 4, 8])
    occ = {"dma": rng.choice([1, 2, 8, 30]), "mvu": rng.choice([1, 4, 8]), "mfu": rng.choice([0, 1, 2])}
    lat = {"dma": rng.choice([0, 10, 100]), "mvu": rng.choice([0, 5, 16]), "mfu": rng.choice([0, 3, 8])}
    sizes = {"dram": 0, "vrf": 0, "mrf": 0}
    made: list[tuple[str, int, tuple, int]] = []
    nvar = [0]

    def operand(space, scope, cols, reuse=True):
        same_shape = [o for o in made if o[3] == cols]
        if reuse and same_shape and rng.random() < 0.5:
            sp, base, terms, c = rng.choice(same_shape)
            terms = tuple((v, k * (2 if rng.random() < 0.15 else 1)) for v, k in terms if v in dict(scope))
            return Operand(sp, Affine(base, terms), 1, c, c)
        terms, span = [], cols
        for v, cnt in scope:
            if rng.random() < 0.5:
                k = span if rng.random() < 0.8 else g * rng.choice([1, 3])
                terms.append((v, k))
                span = max(span, k * cnt + cols)
        base = sizes[space]
        sizes[space] += span + 4 * g + g * rng.choice([0, 1])
        if terms and rng.random() < 0.2:
            v, k = terms[0]
            terms[0] = (v, -k)
            base += k * (dict(scope)[v] - 1)
        made.append((space, base, tuple(sorted(terms)), cols))
        return Operand(space, Affine(base, tuple(sorted(terms))), 1, cols, cols)

    def instr(scope):
        unit = rng.choice(list(occ))
        cols = g * rng.choice([1, 2])
        if rng.random() < 0.3:
            d = operand("vrf", scope, cols, reuse=False)
            srcs = (d, operand(rng.choice(["vrf", "dram"]), scope, cols))
        else:
            d = operand(rng.choice(["vrf", "vrf", "dram", "mrf"]), scope, cols)
            srcs = tuple(operand(rng.choice(["vrf", "dram", "mrf"]), scope, cols) for _ in range(rng.choice([1, 2])))
        return Instr("r", "load" if len(srcs) == 1 else "VVAdd", unit, occ[unit], occ[unit] + lat[unit], d, srcs)

    def block(depth, scope):
        out = []
        for _ in range(rng.randint(1, 4)):
            if depth < 3 and rng.random() < 0.5:
                v = nvar[0]
                nvar[0] += 1
                count = rng.choice([2, 5, 8, 16, 40, 100] if depth == 0 else [2, 3, 8, 12])
                out.append(Loop(v, count, block(depth + 1, scope + [(v, count)])))
            else:
                out.append(instr(scope))
        return out

    setup = block(1, []) if rng.random() < 0.3 else []
    body = block(0, [])
    return Program("random", setup, body, {s: n + 8 * g for s, n in sizes.items()}, [], 0, (1,), (1,)), g


def test_random_programs_are_exact():
    skipped = 0
    for seed in range(40):
        p, g = random_program(random.Random(seed))
        if p.dynamic_count() > 3000:
            continue
        skipped += check_exact(p, g) > 0
    assert skipped >= 6


def random_loop_after_slow_writes(rng: random.Random) -> tuple[Program, int]:
    """One loop (sometimes with an inner loop) after writes whose results arrive far in the
    future, some inside what the loop will read; then a loop reading what it wrote."""
    g = rng.choice([1, 2, 4])
    n = rng.choice([10, 30, 60])

    def at(base, stride=0, var=0):
        return vec("vrf", A(base, *([(var, stride)] if stride else [])), g)

    def moving():
        stride = rng.choice([0, 0, g, g, 2 * g])
        if (stride // g) * (n - 1) > 63:
            stride = 0
        return at(g * rng.randint(0, 63 - (stride // g) * (n - 1)), stride)

    before = [op(rng.choice("abc"), occ, occ + rng.choice([0, 50, 200, 1000, 3000]),
                 at(g * rng.randint(0, 63)), at(g * rng.randint(0, 63)))
              for occ in (rng.choice([0, 1, 3]) for _ in range(rng.randint(0, 6)))]
    body = [op(rng.choice("abc"), occ, occ + rng.choice([0, 1, 4, 12, 30]), moving(),
               *(moving() for _ in range(rng.choice([1, 2]))))
            for occ in (rng.choice([0, 1, 2, 5, 9]) for _ in range(rng.randint(1, 3)))]
    if rng.random() < 0.3:
        body = [Loop(1, rng.choice([2, 3, 5]), body[:1])] + body[1:]
    after = [Loop(2, 20, [op(rng.choice("abc"), 1, 5, at(0, g, 2), at(40 * g))])]
    return program(before + [Loop(0, n, body)] + after, {"vrf": 72 * g}), g


def test_random_loops_after_slow_writes_are_exact():
    skipped = 0
    for seed in range(100):
        skipped += check_exact(*random_loop_after_slow_writes(random.Random(seed))) > 0
    assert skipped >= 20
