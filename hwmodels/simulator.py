"""Cycle-counting simulator: executes a program's instructions.

Timing: instructions dispatch in order, one per cycle, into decoupled units (DMA, matrix unit,
vector unit). An instruction starts when its unit is free, its sources have been written, and
its destination is no longer being read or written (a scoreboard over native-size blocks); it
keeps its unit busy for `occupancy` cycles and its result is readable after `latency`.
Functional mode also computes every value with numpy; timing-only mode skips the data and gives
the same cycles. Every access is bounds-checked against the memory the program allocated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from egraph_rules.interpreter import BINARY, UNARY, Interpreter
from hwmodels.isa import Block, Instr, Loop, Operand, Program


class SimulationError(RuntimeError):
    """The program did something the machine cannot: an access outside a memory, an unknown op."""


@dataclass
class SimResult:
    """Measured cycles (per inference, and of the one-off setup), the output, unit activity."""

    cycles: int
    setup_cycles: int
    output: np.ndarray | None
    dynamic_instructions: int
    unit_busy: dict[str, int] = field(default_factory=dict)


class _Machine:
    def __init__(self, program: Program, block: int, functional: bool):
        self.p = program
        self.g = block
        self.functional = functional
        self.mem = {s: np.zeros(n, np.float32) if functional else None for s, n in program.memory_sizes.items()}
        nblocks = {s: n // block + 2 for s, n in program.memory_sizes.items()}
        self.ready = {s: np.zeros(n, np.int64) for s, n in nblocks.items()}
        self.lastread = {s: np.zeros(n, np.int64) for s, n in nblocks.items()}
        self.reset_time()

    def reset_time(self) -> None:
        self.dispatch = 0
        self.unit_free: dict[str, int] = {}
        self.busy: dict[str, int] = {}
        self.end = 0
        self.count = 0
        for s in self.ready:
            self.ready[s][:] = 0
            self.lastread[s][:] = 0

    def _blocks(self, op: Operand, at: int) -> tuple[str, slice | np.ndarray]:
        size = self.p.memory_sizes.get(op.space)
        if size is None:
            raise SimulationError(f"unknown memory {op.space}")
        last = at + (op.rows - 1) * op.stride + op.cols
        if at < 0 or last > size:
            raise SimulationError(f"access {op.space}[{at}:{last}] outside the {size} elements allocated")
        if op.rows == 1 or op.stride == op.cols:
            return op.space, slice(at // self.g, (last - 1) // self.g + 1)
        starts = at + np.arange(op.rows) * op.stride
        return op.space, np.unique(np.concatenate([starts // self.g, (starts + op.cols - 1) // self.g]))

    def _view(self, op: Operand, at: int) -> np.ndarray:
        m = self.mem[op.space]
        if op.rows == 1:
            return m[at : at + op.cols]
        return np.lib.stride_tricks.as_strided(m[at:], shape=(op.rows, op.cols), strides=(op.stride * 4, 4))

    def run(self, block: Block, counters: dict[int, int]) -> None:
        for item in block:
            if isinstance(item, Loop):
                for i in range(item.count):
                    counters[item.var] = i
                    self.run(item.body, counters)
                del counters[item.var]
            else:
                self.step(item, counters)

    def step(self, ins: Instr, counters: dict[int, int]) -> None:
        dst_at = ins.dst.addr.at(counters)
        src_at = [s.addr.at(counters) for s in ins.srcs]
        dsp, dblk = self._blocks(ins.dst, dst_at)
        sblks = [self._blocks(s, a) for s, a in zip(ins.srcs, src_at)]
        start = max(self.dispatch, self.unit_free.get(ins.unit, 0),
                    int(self.ready[dsp][dblk].max()), int(self.lastread[dsp][dblk].max()))
        for sp, blk in sblks:
            start = max(start, int(self.ready[sp][blk].max()))
        done = start + ins.latency
        self.unit_free[ins.unit] = start + ins.occupancy
        self.busy[ins.unit] = self.busy.get(ins.unit, 0) + ins.occupancy
        for sp, blk in sblks:
            self.lastread[sp][blk] = np.maximum(self.lastread[sp][blk], start + ins.occupancy)
        self.ready[dsp][dblk] = done
        self.dispatch += 1
        self.count += 1
        self.end = max(self.end, done)
        if self.functional:
            self.compute(ins, dst_at, src_at)

    def compute(self, ins: Instr, dst_at: int, src_at: list[int]) -> None:
        srcs = [self._view(s, a) for s, a in zip(ins.srcs, src_at)]
        dst = self._view(ins.dst, dst_at)
        if ins.kind in ("load", "store"):
            dst[...] = srcs[0]
        elif ins.kind in UNARY:
            dst[...] = UNARY[ins.kind](srcs[0])
        elif ins.kind in BINARY:
            dst[...] = BINARY[ins.kind](srcs[0], srcs[1])
        else:
            raise SimulationError(f"no semantics for instruction kind {ins.kind!r} ({ins.mnemonic})")


def simulate(program: Program, block: int, env: Mapping[str, np.ndarray] | None = None,
             functional: bool = True) -> SimResult:
    """Run the setup, then one inference; functional mode needs `env` (values of every Var)."""
    m = _Machine(program, block, functional)
    if functional:
        if env is None:
            raise SimulationError("functional simulation needs input and weight values")
        interp = Interpreter(env)
        for hb in program.host_buffers:
            data = np.asarray(interp.value(hb.expr), dtype=np.float32).ravel()
            if data.size != hb.size:
                raise SimulationError(f"host buffer {hb.what}: {data.size} values for {hb.size} elements")
            m.mem["dram"][hb.addr : hb.addr + hb.size] = data
    m.run(program.setup, {})
    setup_cycles = m.end
    m.reset_time()
    m.run(program.body, {})
    out = None
    if functional:
        view = np.lib.stride_tricks.as_strided(
            m.mem["dram"][program.output_addr :], shape=program.output_shape,
            strides=tuple(s * 4 for s in program.output_strides))
        out = np.array(view)
    return SimResult(m.end, setup_cycles, out, m.count, dict(sorted(m.busy.items())))
