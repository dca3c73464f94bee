"""Instruction programs: instructions with strided operands whose addresses are affine in the
enclosing loop counters, loops kept as loops, and a listing in the target's syntax."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Affine:
    """base + sum(coeff * loop counter)."""

    base: int
    terms: tuple[tuple[int, int], ...] = ()

    def __add__(self, other: Affine | int) -> Affine:
        if isinstance(other, int):
            return Affine(self.base + other, self.terms)
        merged: dict[int, int] = dict(self.terms)
        for v, c in other.terms:
            merged[v] = merged.get(v, 0) + c
        return Affine(self.base + other.base, tuple(sorted((v, c) for v, c in merged.items() if c)))

    def scaled(self, k: int) -> Affine:
        return Affine(self.base * k, tuple((v, c * k) for v, c in self.terms))

    def at(self, counters: dict[int, int]) -> int:
        return self.base + sum(c * counters[v] for v, c in self.terms)

    def __str__(self) -> str:
        parts = [str(self.base)] if self.base or not self.terms else []
        parts += [f"{c}*i{v}" if c != 1 else f"i{v}" for v, c in self.terms]
        return "+".join(parts)


def loop_var(v: int, coeff: int = 1) -> Affine:
    return Affine(0, ((v, coeff),))


@dataclass(frozen=True)
class Operand:
    """A block of a memory: rows x cols elements, rows `stride` apart (a vector has rows = 1)."""

    space: str
    addr: Affine
    rows: int
    cols: int
    stride: int

    def __str__(self) -> str:
        shape = f"{self.cols}" if self.rows == 1 else f"{self.rows}x{self.cols}/{self.stride}"
        return f"{self.space}[{self.addr}:{shape}]"


@dataclass(frozen=True)
class Instr:
    """One instruction: what it computes (kind), where it runs (unit), timing, operands."""

    mnemonic: str
    kind: str
    unit: str
    occupancy: int
    latency: int
    dst: Operand
    srcs: tuple[Operand, ...]

    def listing(self) -> str:
        return f"{self.mnemonic:<8} {', '.join(str(o) for o in (self.dst, *self.srcs))}"


@dataclass
class Loop:
    """for i<var> in 0..count: body."""

    var: int
    count: int
    body: list[Instr | Loop] = field(default_factory=list)


Block = list[Instr | Loop]


@dataclass
class HostBuffer:
    """A DRAM region the host fills before the program runs (an input or a weight, possibly
    padded or re-laid out), given as an IR value term."""

    addr: int
    size: int
    expr: object
    what: str


@dataclass
class Program:
    """A complete program: setup (pinning weights on chip), the per-inference body, and the
    memory layout the host and the reader of the output need."""

    target: str
    setup: Block
    body: Block
    memory_sizes: dict[str, int]
    host_buffers: list[HostBuffer]
    output_addr: int
    output_shape: tuple[int, ...]
    output_strides: tuple[int, ...]

    def listing(self) -> str:
        lines = [f"; liftsat program for {self.target}"]
        for hb in self.host_buffers:
            lines.append(f"; host: dram[{hb.addr}:{hb.size}] <- {hb.what}")
        if self.setup:
            lines.append("setup:")
            lines += _list(self.setup, 1)
        lines.append("main:")
        lines += _list(self.body, 1)
        lines.append(f"; output: dram[{self.output_addr}] shape {self.output_shape} strides {self.output_strides}")
        return "\n".join(lines)

    def static_count(self) -> int:
        return _count(self.setup) + _count(self.body)

    def dynamic_count(self) -> int:
        return _dyn(self.body)

    def histogram(self) -> dict[str, int]:
        """Dynamic count of each mnemonic in the per-inference body."""
        hist: dict[str, int] = {}
        _hist(self.body, 1, hist)
        return dict(sorted(hist.items()))


def map_operands(block: Block, operand: Callable[[Operand], Operand],
                 counter: Callable[[int], int] = lambda v: v) -> Block:
    """The block with every operand through `operand` and every loop's counter through
    `counter` (called on a loop before its body's operands)."""
    def item(i: Instr | Loop) -> Instr | Loop:
        if isinstance(i, Loop):
            var = counter(i.var)
            return Loop(var, i.count, [item(x) for x in i.body])
        return replace(i, dst=operand(i.dst), srcs=tuple(operand(s) for s in i.srcs))

    return [item(i) for i in block]


def _list(block: Block, depth: int) -> list[str]:
    pad = "  " * depth
    out = []
    for item in block:
        if isinstance(item, Loop):
            out.append(f"{pad}loop i{item.var}, {item.count}")
            out += _list(item.body, depth + 1)
            out.append(f"{pad}endloop")
        else:
            out.append(pad + item.listing())
    return out


def _count(block: Block) -> int:
    return sum(1 + _count(i.body) if isinstance(i, Loop) else 1 for i in block)


def _dyn(block: Block) -> int:
    return sum(i.count * _dyn(i.body) if isinstance(i, Loop) else 1 for i in block)


def _hist(block: Block, mult: int, hist: dict[str, int]) -> None:
    for i in block:
        if isinstance(i, Loop):
            _hist(i.body, mult * i.count, hist)
        else:
            hist[i.mnemonic] = hist.get(i.mnemonic, 0) + mult
