"""A target is data: memories, device operators with timing, peak rates, instruction syntax.

The cost model here predicts cycles from that data alone: every unit (DMA, matrix unit, vector
unit, instruction issue) accumulates busy cycles, plus the latency no unit can hide (a load's
wait for its first unit, a store's drain, a reduction's chain); loops multiply their bodies,
except that a load repeated in a loop waits from cold only the first time (its later runs are
prefetched while the body works). A loop that reloads a buffer cannot run faster than that
buffer's load-to-read recurrence (half of it a run where runs take turns with two buffers, as a
Fold's steps do): those add up in a `chain` that is weighed like a unit. A program is as slow
as its busiest unit or its chain (the units run decoupled). The simulator measures the real
thing.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property

from egraph_rules.hardware_rules import DeviceOp
from egraph_rules.ir import IRTypeError, Term, dtype_name, fin, nbytes, numel, shape_of, ta, ts

INF = math.inf
UNITS = ("dma", "mvu", "mfu", "issue")
#: a cost's components: each unit's cycles; `chain`, the cycles of loads' recurrences and
#: stores' drains; `dma_wait`, the DMA unit's waits for the readers of the buffers its loads
#: overwrite, and `recur`, the loads' recurrences (`CycleCost.recurrence`), both of which the
#: innermost loop around a load settles by how many buffers its body's loads get
#: (`CycleCost.settled`); `drain`, how many of the issue cycles are stores' drains, which only a
#: store's last run makes the dispatcher wait for; `cold`, how many of the op units' cycles are
#: loads' waits that only a load's first run pays (`CycleCost.counted`); `tail`, how many of the
#: DMA unit's cycles only a loop's last run pays (a chained store's DRAM latency,
#: `CycleCost.chained_store`); `reuse`, a chained store's drain, which the innermost loop around
#: it passes on, all its runs', as `reuse_next`, for each later run of the loop around that one
#: to wait for (`CycleCost.reused`)
COMPONENTS = UNITS + ("chain", "dma_wait", "drain", "cold", "recur", "tail", "reuse", "reuse_next")
_DMA, _CHAIN, _DMA_WAIT, _ISSUE, _DRAIN, _COLD, _RECUR, _TAIL, _REUSE, _REUSE_NEXT = (
    COMPONENTS.index(c) for c in ("dma", "chain", "dma_wait", "issue", "drain", "cold", "recur", "tail", "reuse",
                                  "reuse_next"))
#: the units a device op can run on: the matrix unit and the vector unit
OP_UNITS = ("mvu", "mfu")
#: for each component, the component holding how much of it only one run of a loop pays (the op
#: units' loads' cold start, issue's stores' drain, the DMA unit's chained stores' latency;
#: `drain`, `cold`, `tail` and `reuse_next` are paid once whole); None: every run pays all of it
#: (`CycleCost.counted`)
_PAID_ONCE = tuple(_COLD if u in OP_UNITS else _DRAIN if u == "issue" else _TAIL if u == "dma"
                   else i if i in (_DRAIN, _COLD, _TAIL, _REUSE_NEXT) else None for i, u in enumerate(COMPONENTS))
#: the components a wait on the critical path lengthens: the DMA unit, the op units and the
#: chain (`_exposed`); `_WAITED`, those but the DMA unit, for a wait the DMA unit works through
_EXPOSED = tuple(COMPONENTS.index(u) for u in ("dma", *OP_UNITS, "chain"))
_WAITED = _EXPOSED[1:]
#: the units that can load an on-chip memory
LOADERS = ("dma", "mvu", "mfu")
#: what one load into an on-chip memory moves: a native vector (N elements) or tile (N x N)
LOAD_UNITS = ("vector", "tile")
#: a memory's numbers and the least each may be: capacity (bytes), bandwidth (bytes per cycle),
#: latency (cycles)
MEMORY_LEAST = {"capacity": 1, "bandwidth": 1, "latency": 0}


def whole_units(shape: tuple[int, ...], n: int, tile: bool) -> bool:
    """Whether a value of this shape moves in whole native units, as load and store instructions
    move it: rows of whole N-element vectors and, for N x N tiles, whole blocks of N rows."""
    dims = 2 if tile else 1
    return len(shape) >= dims and not any(d % n for d in shape[-dims:])


class TargetError(ValueError):
    """Unknown target or bad target parameter."""


@dataclass(frozen=True)
class Memory:
    """An on-chip memory (or DRAM): capacity in bytes, bytes moved per cycle, access latency,
    and how data is loaded into it (mnemonic; a native vector or tile per load). Loads come from
    DRAM by the DMA unit, or, when `load_from` names another on-chip memory, from that memory
    (data from DRAM is staged there first) by the `loader` unit at this memory's bandwidth and
    latency."""

    name: str
    capacity: int
    bandwidth: int
    latency: int
    load_mnemonic: str = ""
    load_unit: str = "vector"
    load_from: str = ""
    loader: str = "dma"


@dataclass(frozen=True)
class OpSpec:
    """A device operator: its e-graph description, its mnemonic, the unit it runs on and its
    timing (cycles the unit is busy; cycles until the result can be read)."""

    op: DeviceOp
    mnemonic: str
    unit: str
    occupancy: int
    latency: int


@dataclass(frozen=True)
class Target:
    """An accelerator description."""

    name: str
    clock_mhz: float
    native_dim: int
    dtypes: tuple[str, ...]
    dram: Memory
    memories: dict[str, Memory]
    ops: tuple[OpSpec, ...]
    peak_macs_per_cycle: int
    store_mnemonic: str
    #: weights pinned on chip are loaded once at deployment, not per inference
    persistent_weights: bool = True
    assumptions: tuple[str, ...] = field(default=())
    #: the share of an on-chip memory one value may fill in the cost model; codegen lays out all
    #: live values together, so extraction is retried with less room when none fits
    value_room: float = 1.0
    #: the same for a constant pinned on chip at setup, which stays there the whole program
    pinned_room: float = 1.0

    @property
    def op_by_name(self) -> dict[str, OpSpec]:
        return {o.op.name: o for o in self.ops}

    @cached_property
    def result_capacity(self) -> int:
        """Bytes of the largest memory a device op writes its results to."""
        return max(self.memories[o.op.result_space].capacity for o in self.ops)

    @cached_property
    def staging(self) -> dict[str, str]:
        """Each memory loaded from another on-chip memory, and that memory (its staging memory)."""
        return {name: m.load_from for name, m in self.memories.items() if m.load_from}

    @cached_property
    def tile_read_spaces(self) -> frozenset[str]:
        """On-chip memories loaded a vector at a time that are read N x N tiles at a time: by a
        device op's two-dimensional operand, or by the loads of a memory staged in them."""
        spaces = {m.load_from for m in self.memories.values() if m.load_from and m.load_unit == "tile"}
        for o in self.ops:
            spaces |= {s for t, s in o.op.operands if t.op == "TA" and t.args[0].op == "TA"}
        return frozenset(s for s in spaces if s in self.memories and self.memories[s].load_unit == "vector")

    def with_memory(self, name: str, **changes: int) -> Target:
        """This target with one memory's capacity, bandwidth or latency changed (`name` "dram"
        for DRAM): to explore memory sizes without writing a target file."""
        for key, value in changes.items():
            if key not in MEMORY_LEAST:
                raise TargetError(f"a memory has no {key!r} to change; it has {', '.join(MEMORY_LEAST)}")
            if not isinstance(value, int) or isinstance(value, bool) or value < MEMORY_LEAST[key]:
                raise TargetError(f"{self.name}: {name}.{key} must be an integer of at least {MEMORY_LEAST[key]}, "
                                  f"got {value!r}")
        if name == "dram":
            return replace(self, dram=replace(self.dram, **changes))
        if name not in self.memories:
            raise TargetError(f"{self.name} has no memory {name!r}; its memories: dram, {', '.join(self.memories)}")
        return replace(self, memories={**self.memories, name: replace(self.memories[name], **changes)})

    def device_ops(self) -> list[DeviceOp]:
        """What the hardware rules are generated from."""
        return [o.op for o in self.ops]

    def transfer_cycles(self, t: Term, unit_elems: int, bandwidth: int | None = None) -> tuple[int, int]:
        """(busy cycles, transfers) to move a value of type t in units of unit_elems, at the
        given bytes per cycle (DRAM's by default)."""
        units = max(1, math.ceil(numel(t) / unit_elems))
        per = math.ceil(nbytes(t) / units / (bandwidth or self.dram.bandwidth))
        return units * per, units

    def store_cycles(self, t: Term) -> tuple[int, int]:
        """(busy cycles, stores) to move a value of type t from chip to DRAM, a native vector per
        store: codegen gives each row computed on chip room for whole vectors and stores it in
        whole ones, so a row that is not whole vectors takes as many stores as its room."""
        try:
            shape = shape_of(t)
        except IRTypeError:  # a pair: moved as its elements
            shape = ()
        if not shape:
            return self.transfer_cycles(t, self.native_dim)
        n = self.native_dim
        stores = math.prod(shape[:-1]) * math.ceil(shape[-1] / n)
        one, _ = self.transfer_cycles(ta(ts(dtype_name(t)), n), n)
        return stores * one, stores

    def cost_model(self, unpinned: frozenset[str] = frozenset()) -> CycleCost:
        """The cycle cost model; `unpinned` names e-classes of constants it does not let stay on
        chip (a pin budget chose others)."""
        return CycleCost(self, unpinned)


Cost = tuple[float, ...]
ZERO: Cost = (0.0,) * len(COMPONENTS)
NEVER: Cost = (INF,) * len(COMPONENTS)


def _exposed(c: Cost, wait: float) -> Cost:
    """c plus cycles every execution unit waits: latency on the critical path adds to the
    busiest unit and to the chain. Instruction issue does not wait: instructions dispatch one
    per cycle into the units' queues whatever their operands wait for, so issue is a bound on throughput only."""
    return tuple(x + wait if i in _EXPOSED else x for i, x in enumerate(c))


def _unit_cost(unit: str, busy: float, issued: float) -> Cost:
    """A cost that keeps one unit busy and issues some instructions."""
    c = [0.0] * len(COMPONENTS)
    c[UNITS.index("issue")] = issued
    c[UNITS.index(unit)] += busy
    return tuple(c)


class CycleCost:
    """The target's cycle cost model, one e-node at a time. It is linear: an e-node costs its own
    `local` cost plus each F/E child's cost counted the node's `scales` times (a loop's trip
    count, with its loads' cold start once; 0 under Const, which is computed once at setup), the
    waits of the loads in a loop's body settled by how many buffers they get (`buffers`). The
    greedy extractor folds it over terms with `node`; the ILP extractor uses `local`, `scales`,
    `buffers` and `counted` to count shared subterms once."""

    #: re-indexing is addressing, and padding is done by the host when it lays out inputs
    FREE = ("Id", "Fst", "Snd", "Split", "Join", "Transpose", "Zip", "DistR", "Slice", "Slide", "Pad", "PadWith", "Var", "Fill",
            "Pair", "Comp", "Fork", "App")

    def __init__(self, target: Target, unpinned: frozenset[str] = frozenset()):
        self.t = target
        self.ops = target.op_by_name
        self.unpinned = unpinned

    def unit_elems(self, space: str) -> int:
        """Elements one load into this memory moves (a vector, or a native tile)."""
        n = self.t.native_dim
        return n * n if self.t.memories[space].load_unit == "tile" else n

    def local(self, op: str, args: tuple) -> Cost:
        """The cost of the e-node itself, without its children (NEVER: the target cannot run it)."""
        if op in self.FREE or op in ("Map", "Fold", "Const"):
            return ZERO
        if op == "Reduce":
            if nbytes(args[1]) > self.t.result_capacity:
                return NEVER  # the array reduced is computed on chip, so it must fit where results go
            return self.reduce_chain(args[1])
        if op == "ToChip":
            return self.load(*args)
        if op == "Restage":
            return self.load(*args, from_dram=False)
        if op in ("ToOutput", "ToDram"):
            if nbytes(args[0]) > self.t.result_capacity:
                return NEVER  # a stored value was computed on chip, so it must fit where results go
            return self.store(args[0])
        if op == "Dev":
            spec = self.ops.get(args[0])
            return NEVER if spec is None else _unit_cost(spec.unit, spec.occupancy, 1)
        if op == "DevOut":
            spec = self.ops.get(args[0])
            return NEVER if spec is None else self.chained_store(spec, args[2])
        return NEVER

    def store(self, t: Term) -> Cost:
        """Moving a value of type t from chip to DRAM. Its reader waits for the whole store (and
        so does the DMA unit that does it); the dispatcher, which runs ahead of other waits,
        issues the stores and, after the last run only, waits for them to drain (it dispatches a
        loop's next iteration at once). In a loop's later runs, a stored array of rows is
        written while the next run loads and computes (codegen queues each run's stores behind
        the next run's loads, `defer_stores`): the op units wait only for the row the next run's
        first result overwrites (the `cold` component: the rest of the drain is paid once)."""
        busy, units = self.t.store_cycles(t)
        latency = self.t.dram.latency
        drain = busy + latency
        c = list(_exposed(_unit_cost("dma", 0, max(busy, units) + latency), drain))
        c[_DRAIN] = c[_ISSUE] - units
        if t.op == "TA" and t.args[0].op == "TA":
            row, _ = self.t.store_cycles(t.args[0])
            c[_COLD] = max(0.0, drain - (row + latency))
        return tuple(c)

    def chained_store(self, spec: OpSpec, t: Term) -> Cost:
        """A device op whose result, of type t, is stored as soon as it is computed (`DevOut`).
        Its unit works, and the DMA unit moves the result, as for the op and the store apart; but
        in a loop each run's result drains while the next run's op computes (codegen gives the
        value each run stores a buffer of its own), so the op units wait for a whole drain once,
        after the last run, and in the runs before only as long as the store outlasts the op
        (`cold`). The dispatcher waits for the last result and its drain after the last run
        only, and so does the DMA unit, which starts the next run's store once this one's
        transfers are done (`tail`). Where a loop around that loop runs it again, its runs wait
        for each other (`reuse`: the store's drain, `reused`)."""
        busy, units = self.t.store_cycles(t)
        latency = self.t.dram.latency
        last = max(0, spec.latency - spec.occupancy) + busy + latency  # the last result read, stored
        c = [last if u in OP_UNITS else 0.0 for u in COMPONENTS]
        c[COMPONENTS.index(spec.unit)] += spec.occupancy
        c[_DMA] = busy + latency
        c[_TAIL] = latency
        c[_DRAIN] = max(0, spec.latency - 1) + max(busy, units) + latency - units
        c[_ISSUE] = 1 + units + c[_DRAIN]
        c[_COLD] = last - max(0.0, busy - spec.occupancy)
        c[_REUSE] = busy + latency
        return tuple(c)

    def reduce_chain(self, t: Term) -> Cost:
        """What a reduction over an array of type t waits for: every step reads the previous
        step's result, so its unit waits out the operator's latency beyond the occupancy of the
        step's own operations, and so does the reduction's reader for the last step. The first
        step waits as long for its two elements, computed just before it (when they were loaded
        long before, as a max pool's windows, that over-charges one step). The operator is one
        of the target's binary ops whose operands tile the element type; the slowest one is
        assumed."""
        elem, n = t.args
        best: tuple[float, str] | None = None
        for spec in self.t.ops:
            a = fin(spec.op.meaning)
            if a.op != "TP" or a.args[0] != a.args[1] or numel(elem) % numel(a.args[0]):
                continue
            per_step = numel(elem) // numel(a.args[0])
            wait = max(0.0, float(spec.latency - per_step * spec.occupancy))
            if best is None or wait > best[0]:
                best = (wait, spec.unit)
        if best is None:
            return ZERO
        return _unit_cost(best[1], n * best[0], 0)

    def scales(self, op: str, args: tuple, nkids: int) -> tuple[float, ...]:
        """How many times each F/E child's cost counts in the e-node's cost."""
        if op == "Map":
            return (float(args[1]),)
        if op == "Reduce":
            return (float(max(args[1].args[1] - 1, 0)),)
        if op == "Fold":
            return (float(args[1].args[1].args[1]),)
        if op == "Const":
            return (0.0,)
        return (1.0,) * nkids

    def buffers(self, op: str) -> int | None:
        """How many buffers each load in a loop body gets (None: op is not a loop). Codegen
        compiles a Fold two steps per trip, each with its own buffers (double buffering); a Map
        or a Reduce reuses one."""
        return 2 if op == "Fold" else 1 if op in ("Map", "Reduce") else None

    def node(self, op: str, args: tuple, kids: list[Cost]) -> Cost:
        """local + sum of scaled children; NEVER when the node or any child cannot run (a cost
        holds INF only where it is NEVER: this sums finite children only)."""
        return self.combiner(op, args, len(kids))(kids)

    def combiner(self, op: str, args: tuple, nkids: int) -> Callable[[list[Cost]], Cost]:
        """`node` of one e-node as a function of its children's costs, with what does not
        depend on them worked out once: greedy extraction visits an e-node about three times,
        and most are re-indexings that pass their one child's cost on, or add two."""
        local, buffers, scales = self.local(op, args), self.buffers(op), self.scales(op, args, nkids)
        if INF in local:
            return lambda kids: NEVER
        if local == ZERO and buffers is None and all(s == 1 for s in scales):
            if nkids == 1:
                return operator.itemgetter(0)  # a child that cannot run is NEVER already
            if nkids == 2:
                return lambda kids: NEVER if INF in kids[0] or INF in kids[1] else tuple(map(operator.add, *kids))

        def combine(kids: list[Cost]) -> Cost:
            if any(INF in k for k in kids):
                return NEVER
            total = local
            for k, s in zip(kids, scales):
                total = tuple(map(operator.add, total, self.counted(k, s, buffers)))
            return total

        return combine

    def settled(self, c: Cost, buffers: int) -> Cost:
        """c in the body of a loop whose loads get `buffers` buffers each. With one, a load's
        next run waits for this one's readers, and so does the DMA unit, which loads in order.
        With two, the next load into a buffer is two runs later, its readers long done: the DMA
        unit does not wait, and a load's round trip spans two runs, so each run adds half its
        recurrence to the chain. (A Fold's steps also wait for each other through the state,
        which a cost linear per e-node cannot follow; codegen issues each step's work that does
        not need the state first, `step_order`, so the units fill that wait where they have such
        work.)"""
        out = list(c)
        if buffers == 1:
            out[_DMA] += c[_DMA_WAIT]
        out[_CHAIN] += c[_RECUR] / buffers
        out[_DMA_WAIT] = out[_RECUR] = 0.0
        return tuple(out)

    def reused(self, c: Cost, m: float) -> Cost:
        """c in the body of a loop run m times, as to the buffers its chained stores read
        (`DevOut`). Codegen gives the value each run of the innermost loop around such a store
        stores a buffer of its own, so those runs do not wait for each other (`reuse`, passed on
        as `reuse_next`, all m runs'). A loop around that one runs it again into the same
        buffers: each later run's ops wait for the stores before to read them, and the op
        units' other work waits behind those ops, and the stores behind the DMA unit's loads
        (VTA's 20x5 convolution over 4x1x161x700 storing each output row's pixels as it adds
        their bias: 9.4 M cycles, 4.5 M predicted without the wait; Snowflake's 151x40 one
        24,220, 19,748 predicted). The model charges each of the m - 1 later runs the stores'
        whole drain, as for stores apart, on the op units and the chain. A body without chained
        stores, nearly every one, is c itself (extraction calls this for every loop e-node)."""
        if not (c[_REUSE] or c[_REUSE_NEXT]):
            return c
        out = list(c)
        wait = (m - 1) * c[_REUSE_NEXT] / m if m else 0.0
        for i in _WAITED:
            out[i] += wait
        out[_REUSE_NEXT], out[_REUSE] = m * c[_REUSE], 0.0
        return tuple(out)

    def counted(self, c: Cost, m: float, buffers: int | None = None) -> Cost:
        """A cost paid m times (a whole number), in a loop body whose loads get `buffers` buffers
        each (None: not the body of a loop, its loads' waits are left to the loop around it;
        `settled`), its loads' cold start only once: a load repeated in a loop is prefetched
        while the previous iteration works, so only its first run waits for its first units to
        arrive (`wait` with cold=True); later runs wait the steady state. Its stores' drain holds
        up issue once too, after the last run (`_PAID_ONCE`)."""
        if buffers is not None:
            c = self.reused(self.settled(c, buffers), m)
        if m == 1:
            return c
        once = min(m, 1.0)
        return tuple(m * x if p is None else once * x if p == i else m * x - (m - once) * c[p]
                     for i, (x, p) in enumerate(zip(c, _PAID_ONCE)))

    def load(self, space: str, t: Term, from_dram: bool = True) -> Cost:
        """Moving a value of type t from DRAM into `space`, through the memory it is staged in
        (not from_dram: from that staging memory, where the value already is; NEVER when `space`
        is loaded from DRAM).
        The DMA unit also waits, each run, for the buffer's previous readers (`wait`: what its
        later units' transfers do not cover; `dma_wait`, which the loop around it settles). The
        device ops that read it wait for its first units on the first run only (later runs are
        prefetched while the loop body works; the `cold` component), but every run when the
        first read needs more than the first unit (the units are freed in another order than
        they are loaded, so the next run's cannot be prefetched). Every run lengthens the `chain`
        by its `recurrence` (`recur`, which the loop around it settles: half of it with two
        buffers). A value the memory's units do not tile (rows of whole native vectors; for
        tiles, whole N x N blocks) cannot be moved: NEVER."""
        mem = self.t.memories.get(space)
        if mem is None or nbytes(t) > mem.capacity or not (from_dram or mem.load_from):
            return NEVER
        if not whole_units(shape_of(t), self.t.native_dim, mem.load_unit == "tile"):
            return NEVER
        need = self.first_read_units(space, t)
        first = self.wait(space, t, need, cold=True, from_dram=from_dram)
        steady = self.wait(space, t, from_dram=from_dram)
        extra = self.wait(space, t, need, from_dram=from_dram) - steady
        moves = self.transfers(space, t, from_dram)
        return (tuple(x + first if u in OP_UNITS else x for u, x in zip(UNITS, moves))
                + (0.0, steady, 0.0, first - extra, self.recurrence(space, t, need, from_dram), 0.0, 0.0, 0.0))

    def recurrence(self, space: str, t: Term, need: int, from_dram: bool = True) -> float:
        """The shortest period of a loop that loads a value of type t into the same buffer of
        `space` every iteration: the next load waits for this one's first `need` units to be
        read, then takes their transfers and the latency to arrive, then they are read again. A
        move from the staging memory by the unit that reads it (a systolic mesh preloaded by the
        mesh) is that unit's own work, counted there, so only its latency lengthens the chain."""
        mem = self.t.memories[space]
        if not from_dram and mem.loader in {o.unit for o in self.readers(space)}:
            return self.wait(space, t, need, cold=True, from_dram=False)
        own = 0.0
        if mem.load_from:  # a staged load's `wait` leaves out its loader's own move
            busy, units = self.t.transfer_cycles(t, self.unit_elems(space), mem.bandwidth)
            own = busy / units
        return self.wait(space, t, need, cold=True, from_dram=from_dram) + own + self.reader_occupancy(space)

    def transfers(self, space: str, t: Term, from_dram: bool = True) -> Cost:
        """The units kept busy moving a value of type t from DRAM (or, not from_dram, from the
        memory it is staged in) into `space`."""
        mem = self.t.memories[space]
        if not mem.load_from:
            busy, units = self.t.transfer_cycles(t, self.unit_elems(space))
            return _unit_cost("dma", busy, units)
        busy, units = self.t.transfer_cycles(t, self.unit_elems(space), mem.bandwidth)
        own = _unit_cost(mem.loader, busy, units)
        return tuple(a + b for a, b in zip(self.transfers(mem.load_from, t), own)) if from_dram else own

    def wait(self, space: str, t: Term, need: int = 1, cold: bool = False, from_dram: bool = True) -> float:
        """Latency of a load that its own transfers do not cover: the reader of its first `need`
        units waits for them and their latency (a staged unit arrives when its whole staging
        has; not from_dram, the value is staged already). In the steady state of a loop (not
        `cold`) the load was started early, so its later units' transfers are taken to cover as
        much of that wait."""
        mem = self.t.memories[space]
        if mem.load_from:
            busy, units = self.t.transfer_cycles(t, self.unit_elems(space), mem.bandwidth)
            unit = ta(ts(dtype_name(t)), self.unit_elems(space))
            staged, _ = self.t.transfer_cycles(unit, self.unit_elems(mem.load_from))
            first = self.latency(mem.load_from) + staged + mem.latency if from_dram else mem.latency
        else:
            busy, units = self.t.transfer_cycles(t, self.unit_elems(space))
            first = self.t.dram.latency
        need = min(need, units)
        if cold:  # a staged load's own transfer of its first unit is its loader's busy time
            return float(first + (need - bool(mem.load_from)) * busy / units)
        return max(0.0, float(first - (units - 2 * need + 1) * busy / units))

    def first_read_units(self, space: str, t: Term) -> int:
        """How many of a load's units its first read needs. A tile read from a row-major value
        needs the first native block of each of the tile's N rows, so all of the first N - 1
        rows (a cpu weight slab of W rows read as W x W tiles: nearly all of it); a vector read,
        or any read of a memory not read in tiles (`Target.tile_read_spaces`), needs one unit. A
        matrix whose rows are one native vector each is taken to be a stack of vector operands
        (a loop's vector reads moved out of it, such as an im2col row), not a tile's rows."""
        if space not in self.t.tile_read_spaces or t.op != "TA":
            return 1
        dims = [t]  # the array types from the outermost to the innermost (a vector of scalars)
        while dims[-1].args[0].op == "TA":
            dims.append(dims[-1].args[0])
        n, row = self.t.native_dim, dims[-1].args[1]
        if dims[-1].args[0].op != "TS" or len(dims) == 1 or (len(dims) == 2 and row == n):
            return 1
        rows = dims[-2].args[1]
        return math.ceil(((min(rows, n) - 1) * row + min(row, n)) / self.unit_elems(space))

    def readers(self, space: str) -> list[OpSpec]:
        """The device ops that read an operand from `space`."""
        return [o for o in self.t.ops if space in o.op.operand_spaces]

    def reader_occupancy(self, space: str) -> int:
        """The longest a device op that reads an operand from `space` keeps its unit busy."""
        return max((o.occupancy for o in self.readers(space)), default=0)

    def latency(self, space: str) -> int:
        """Cycles from a DRAM read to its data in `space`, through the memories it is staged in."""
        mem = self.t.memories[space]
        return mem.latency + self.latency(mem.load_from) if mem.load_from else self.t.dram.latency

    def fits(self, space: str, t: Term) -> bool:
        """Whether a value of type t fits in its share of the on-chip memory `space` (an unknown
        one: no limit)."""
        mem = self.t.memories.get(space)
        return mem is None or nbytes(t) <= mem.capacity * self.t.value_room

    def fits_pinned(self, space: str, t: Term) -> bool:
        """Whether a constant of type t may be pinned in the on-chip memory `space` at setup."""
        mem = self.t.memories.get(space)
        return mem is None or nbytes(t) <= mem.capacity * self.t.pinned_room

    def by_unit(self, c: Cost) -> dict[str, float]:
        """The cycles `scalar` takes the largest of: when each unit is predicted to be done (the
        DMA unit with its waits settled), and the chain of loads' recurrences and stores' drains
        (the recurrences of loads outside every loop settled with one buffer)."""
        return {"dma": c[_DMA] + c[_DMA_WAIT], **{u: c[COMPONENTS.index(u)] for u in UNITS[1:]},
                "chain": c[_CHAIN] + c[_RECUR]}

    def work(self, c: Cost) -> float:
        """The DMA unit's predicted cycles: of two programs as fast, extraction takes the one
        that moves less data (VTA's 3x3 convolution loading each band once rather than once per
        block of output channels, where the model ties them on its busiest unit)."""
        return c[_DMA]

    def scalar(self, c: Cost) -> float:
        """Predicted cycles: the busiest unit (the units run decoupled), or the chain when longer;
        the loads outside every loop run once (the DMA's waits and the loads' recurrences settled
        with one buffer, as `settled` does, inlined: extraction calls this for every e-node)."""
        return max(c[_DMA] + c[_DMA_WAIT], *c[_DMA + 1:_CHAIN], c[_CHAIN] + c[_RECUR])
