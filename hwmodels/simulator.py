"""Cycle-counting simulator: executes a program's instructions.

Timing: instructions dispatch in order, one per cycle, into decoupled units (DMA, matrix unit,
vector unit). An instruction starts when its unit is free, its sources have been written, and
its destination is no longer being read or written (a scoreboard over native-size blocks); it
keeps its unit busy for `occupancy` cycles and its result is readable after `latency`.
Functional mode also computes every value with numpy and executes every loop iteration;
timing-only mode skips the data and gives the same cycles. Every access is bounds-checked
against the memory the program allocated.

Timing-only mode does not walk every iteration of a long loop. It walks the first iterations,
recording what each one read and wrote on the scoreboard, and after each one it tries to prove
that the loop has become periodic: that the next P iterations will do exactly what the last P
did, shifted by Δ cycles and by each operand's constant address stride. When the proof holds,
the whole periods it covers are applied arithmetically (every instruction of period t starts tΔ
later than its counterpart in the last walked period), every scoreboard entry they would have
written gets the value it would have had, and walking resumes for what is left. When the proof
does not hold, the loop is walked. The proof (see `_Machine._try_skip`) is exact: the fast path
gives the same cycles, unit activity, instruction counts and final scoreboard as walking, or it
is not taken. It is not taken, for instance, when two independent chains of a loop run at
different rates (one unit falls further behind the others every iteration), or when operands
that move by different strides share blocks.
"""

from __future__ import annotations

import math
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
    #: when each unit's last instruction has its result (of the inference, not the setup)
    unit_done: dict[str, int] = field(default_factory=dict)


_READY, _LASTREAD = 0, 1          # the two scoreboard arrays, as a `kind` in the records below
_NEG = -(1 << 62)                 # "no event yet" for a maximum over done times
_INF = 1 << 62                    # "no event yet" for a minimum over slacks
_MIN_WORK = 32                    # loops with fewer dynamic instructions are simply walked
_MAX_PERIOD_MULT = 4              # periods tried: 1..4 times the loop's address period


class _Rec:
    """What some stretch of execution did to the scoreboard, for the periodicity proof.

    Keys are (memory, kind, terms of the operand's address): every block in one key moves by the
    same stride when an enclosing loop counter steps. `reads` are the blocks whose entries were
    consulted (a source's ready times; a destination's ready and last-read times), `writes` the
    blocks and the values written (ready := done; last-read := max(., start + occupancy)),
    `undo` the value each written entry had just before the write, in execution order.
    """

    __slots__ = ("reads", "writes", "undo", "units", "minslack", "minstart", "unitdone")

    def __init__(self) -> None:
        self.reads: dict[tuple, list[np.ndarray]] = {}
        self.writes: dict[tuple, list[tuple[np.ndarray, np.ndarray]]] = {}
        self.undo: dict[tuple, list[tuple[np.ndarray, np.ndarray]]] = {}
        self.units: set[str] = set()
        self.minslack = _INF      # min over instructions of (latest non-dispatch constraint - dispatch)
        self.minstart = _INF      # min over instructions of their start time
        self.unitdone: dict[str, int] = {}   # per unit, max over its instructions of their done time

    @property
    def maxdone(self) -> int:
        """Max over instructions of their done time (_NEG: none yet)."""
        return max(self.unitdone.values(), default=_NEG)

    def read(self, space: str, kind: int, terms: tuple, blocks: np.ndarray) -> None:
        self.reads.setdefault((space, kind, terms), []).append(blocks)

    def write(self, space: str, kind: int, terms: tuple, blocks: np.ndarray, values: np.ndarray,
              old: np.ndarray) -> None:
        self.writes.setdefault((space, kind, terms), []).append((blocks, values))
        self.undo.setdefault((space, kind), []).append((blocks, old))

    def absorb(self, other: _Rec) -> None:
        """Append `other`, which happened after everything recorded here."""
        for k, v in other.reads.items():
            self.reads.setdefault(k, []).extend(v)
        for k, w in other.writes.items():
            self.writes.setdefault(k, []).extend(w)
        for k, u in other.undo.items():
            self.undo.setdefault(k, []).extend(u)
        self.units |= other.units
        self.minslack = min(self.minslack, other.minslack)
        self.minstart = min(self.minstart, other.minstart)
        for u, d in other.unitdone.items():
            self.unitdone[u] = max(self.unitdone.get(u, _NEG), d)


@dataclass
class _LoopInfo:
    """Static facts about a loop that the fast path needs (computed once per loop)."""

    eligible: bool
    periods: tuple[int, ...] = ()
    operands: tuple[tuple[Operand, tuple[tuple[int, int], ...]], ...] = ()  # (operand, inner loop ranges)


def _as_index(blk: slice | np.ndarray) -> np.ndarray:
    return np.arange(blk.start, blk.stop, dtype=np.int64) if isinstance(blk, slice) else blk


def _coeff(terms: tuple[tuple[int, int], ...], var: int) -> int:
    for v, c in terms:
        if v == var:
            return c
    return 0


def _distinct(blocks: np.ndarray, size: int) -> np.ndarray:
    """The distinct values of `blocks` (all in 0..size-1), sorted."""
    if blocks.size == 0:
        return blocks
    if blocks.size * 16 < size:
        b = np.sort(blocks)
        return b[np.concatenate(([True], b[1:] != b[:-1]))]
    mask = np.zeros(size, bool)
    mask[blocks] = True
    return np.flatnonzero(mask)


def _max_per_block(blocks: np.ndarray, values: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct blocks, sorted, and the largest value given to each."""
    if blocks.size == 0:
        return blocks, values
    if blocks.size * 16 < size:
        order = np.lexsort((values, blocks))
        b, v = blocks[order], values[order]
        last = np.concatenate((b[1:] != b[:-1], [True]))
        return b[last], v[last]
    best = np.full(size, _NEG, np.int64)
    np.maximum.at(best, blocks, values)
    idx = np.flatnonzero(best != _NEG)
    return idx, best[idx]


def _earlier(arr: np.ndarray, idx: np.ndarray, written: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """arr's entries at idx as they were before period 0: `written` holds the blocks period 0
    wrote, sorted, with the least value each had before (`_Machine._state_before`; None: it
    wrote none of arr)."""
    vals = arr[idx]
    if written is None or not written[0].size:
        return vals
    blocks, least = written
    pos = np.minimum(np.searchsorted(blocks, idx), blocks.size - 1)
    hit = blocks[pos] == idx
    vals[hit] = np.minimum(vals[hit], least[pos[hit]])
    return vals


def _progression(base: np.ndarray, beta: int, first: int, last: int) -> np.ndarray:
    """base + t*beta for t in first..last (one row per t, flattened)."""
    if beta == 0:
        return base
    t = np.arange(first, last + 1, dtype=np.int64)[:, None]
    return (base[None, :] + beta * t).ravel()


class _Machine:
    def __init__(self, program: Program, block: int, functional: bool):
        self.p = program
        self.g = block
        self.functional = functional
        self.mem = {s: np.zeros(n, np.float32) if functional else None for s, n in program.memory_sizes.items()}
        nblocks = {s: n // block + 2 for s, n in program.memory_sizes.items()}
        self.ready = {s: np.zeros(n, np.int64) for s, n in nblocks.items()}
        self.lastread = {s: np.zeros(n, np.int64) for s, n in nblocks.items()}
        self.rec: _Rec | None = None
        self.loop_info: dict[int, tuple[Loop, _LoopInfo]] = {}
        self.skipped_iterations = 0        # how many iterations the fast path did not walk
        self.reset_time()

    @property
    def end(self) -> int:
        """When the last result so far is ready: the latest of the units' (`done`)."""
        return max(self.done.values(), default=0)

    def reset_time(self) -> None:
        self.dispatch = 0
        self.unit_free: dict[str, int] = {}
        self.busy: dict[str, int] = {}
        self.done: dict[str, int] = {}   # per unit, when its last result is ready
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

    # ------------------------------------------------------------ walking

    def run(self, block: Block, counters: dict[int, int]) -> None:
        for item in block:
            if isinstance(item, Loop):
                if not self.functional and self._info(item, counters).eligible:
                    self._run_loop_fast(item, counters)
                    continue
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
        later = max(self.unit_free.get(ins.unit, 0),
                    int(self.ready[dsp][dblk].max()), int(self.lastread[dsp][dblk].max()))
        for sp, blk in sblks:
            later = max(later, int(self.ready[sp][blk].max()))
        start = max(self.dispatch, later)
        done = start + ins.latency
        self.unit_free[ins.unit] = start + ins.occupancy
        self.busy[ins.unit] = self.busy.get(ins.unit, 0) + ins.occupancy
        rec = self.rec
        if rec is None:
            for sp, blk in sblks:
                self.lastread[sp][blk] = np.maximum(self.lastread[sp][blk], start + ins.occupancy)
            self.ready[dsp][dblk] = done
        else:
            dterms = ins.dst.addr.terms
            db = _as_index(dblk)
            rec.read(dsp, _READY, dterms, db)
            rec.read(dsp, _LASTREAD, dterms, db)
            for s, (sp, blk) in zip(ins.srcs, sblks):
                sb = _as_index(blk)
                rec.read(sp, _READY, s.addr.terms, sb)
                arr = self.lastread[sp]
                rec.write(sp, _LASTREAD, s.addr.terms, sb, np.full(sb.size, start + ins.occupancy, np.int64), arr[sb])
                arr[sb] = np.maximum(arr[sb], start + ins.occupancy)
            rec.write(dsp, _READY, dterms, db, np.full(db.size, done, np.int64), self.ready[dsp][db])
            self.ready[dsp][db] = done
            rec.units.add(ins.unit)
            rec.minslack = min(rec.minslack, later - self.dispatch)
            rec.minstart = min(rec.minstart, start)
            rec.unitdone[ins.unit] = max(rec.unitdone.get(ins.unit, _NEG), done)
        self.dispatch += 1
        self.count += 1
        self.done[ins.unit] = max(self.done.get(ins.unit, 0), done)
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

    # ------------------------------------------------------------ the periodic fast path (timing only)

    def _info(self, loop: Loop, counters: dict[int, int]) -> _LoopInfo:
        cached = self.loop_info.get(id(loop))
        if cached is not None and cached[0] is loop:
            return cached[1]
        info = self._analyze(loop, counters)
        self.loop_info[id(loop)] = (loop, info)
        return info

    def _analyze(self, loop: Loop, counters: dict[int, int]) -> _LoopInfo:
        """Whether the fast path may be tried on `loop`, its candidate periods, and every operand
        its body can touch with the ranges of the inner loop counters around it."""
        operands: list[tuple[Operand, tuple[tuple[int, int], ...]]] = []
        inner_vars: list[int] = []
        ok = True
        dyn = 0

        def walk(block: Block, ranges: tuple[tuple[int, int], ...], mult: int) -> None:
            nonlocal ok, dyn
            for item in block:
                if isinstance(item, Loop):
                    inner_vars.append(item.var)
                    if item.count > 0:
                        walk(item.body, ranges + ((item.var, item.count),), mult * item.count)
                else:
                    dyn += mult
                    if ins_bad(item):
                        ok = False
                    for op in (item.dst, *item.srcs):
                        operands.append((op, ranges))

        def ins_bad(ins: Instr) -> bool:
            # the proof needs ready and last-read times that never decrease
            return not (isinstance(ins.latency, (int, np.integer)) and isinstance(ins.occupancy, (int, np.integer))
                        and ins.latency >= 0 and ins.occupancy >= 0)

        walk(loop.body, (), 1)
        if (not ok or dyn == 0 or loop.count * dyn < _MIN_WORK or loop.count < 4 or self.g <= 0
                or len(set(inner_vars)) != len(inner_vars) or loop.var in inner_vars
                or any(v in counters for v in inner_vars)):
            return _LoopInfo(False)
        base = 1
        for op, _ in operands:
            sigma = _coeff(op.addr.terms, loop.var)
            base = math.lcm(base, self.g // math.gcd(sigma, self.g))
        periods = tuple(base * j for j in range(1, _MAX_PERIOD_MULT + 1) if 2 * base * j <= loop.count)
        if not periods:
            return _LoopInfo(False)
        return _LoopInfo(True, periods, tuple(operands))

    def _run_loop_fast(self, loop: Loop, counters: dict[int, int]) -> None:
        """Walk iterations of `loop`, recording each, until its periodicity is proven; skip the
        whole periods proven; go on walking (and trying again) for the rest."""
        info = self._info(loop, counters)
        var, n = loop.var, loop.count
        first = info.periods[0]
        parent = self.rec
        history: list[tuple[tuple, _Rec]] = []      # (state before the iteration, its record)
        k = 0
        since = 0                                   # iteration where `history` starts
        next_try = first
        while k < n:
            trying = n - k >= first                 # a skip needs a whole period left
            if trying and k >= next_try:
                skipped = self._try_skip(loop, info, counters, k, history, parent)
                if skipped:                          # _try_skip passed `history` on to `parent`
                    k += skipped
                    history, since = [], k
                    next_try = k + first
                    continue
                next_try = k + max(1, (k - since - first) // 4)   # back off while it fails
            # record the iterations the next try looks at (all of them if an outer loop is recording)
            record = trying and (parent is not None or k >= next_try - info.periods[-1])
            if not record and history:
                self._pass_on(history, parent)
                history = []
            counters[var] = k
            if record:
                snap = (self.dispatch, dict(self.unit_free), dict(self.busy), self.count)
                self.rec = _Rec()
                self.run(loop.body, counters)
                history.append((snap, self.rec))
                if len(history) > info.periods[-1]:
                    self._pass_on(history[:1], parent)
                    del history[0]
            else:
                self.rec = parent
                self.run(loop.body, counters)
            k += 1
        self._pass_on(history, parent)
        self.rec = parent
        del counters[var]

    @staticmethod
    def _pass_on(history: list[tuple[tuple, _Rec]], parent: _Rec | None) -> None:
        if parent is not None:
            for _, r in history:
                parent.absorb(r)

    def _bounds_ok(self, info: _LoopInfo, counters: dict[int, int], var: int, lo: int, hi: int) -> bool:
        """Every access of iterations lo..hi of the loop over `var` stays inside its memory."""
        for op, ranges in info.operands:
            size = self.p.memory_sizes.get(op.space)
            if size is None:
                return False
            inner = dict(ranges)
            a_min = a_max = op.addr.base
            for v, c in op.addr.terms:
                if v == var:
                    r0, r1 = lo, hi
                elif v in inner:
                    r0, r1 = 0, inner[v] - 1
                elif v in counters:
                    r0 = r1 = counters[v]
                else:
                    return False
                a_min += min(c * r0, c * r1)
                a_max += max(c * r0, c * r1)
            if a_min < 0 or a_max + (op.rows - 1) * op.stride + op.cols > size:
                return False
        return True

    def _try_skip(self, loop: Loop, info: _LoopInfo, counters: dict[int, int], k1: int,
                  history: list[tuple[tuple, _Rec]], parent: _Rec | None) -> int:
        """Prove that iterations k1.. repeat the last P walked ones and skip whole periods.

        Notation: S0 and S1 are the machine states before iterations k0 = k1 - P and k1, d0 and
        d1 their dispatch times, period 0 the walked iterations k0..k1-1, theta0 the earliest
        start of an instruction in period 0, and periods 1..m the ones to skip. Every operand o
        moves by beta_o = sigma_o * P / g blocks per period. A value in S0 (a unit's free time,
        a scoreboard entry) is idle when it is <= d0 or < theta0; a value in S1 when it is <= d1
        or < theta0 + Delta. An idle value can never decide a start: it is at or below the
        dispatch time of every later instruction, or strictly below the start of each
        instruction that reads it, which its other constraints give.

        Claim: every instruction of period t >= 1 starts exactly Delta later than its
        counterpart in period t - 1 (and touches the blocks its operands' strides say) if
          (U) each unit used in period 0 has S1 = S0 + Delta, or is idle in both;
          (D) Delta >= rP (the instructions dispatched per period), and when Delta > rP every
              instruction of period 0 had a constraint other than dispatch strictly above its
              dispatch time (so the slower dispatch clock never decides a start again);
          (A) within one memory and scoreboard array, operands that move by different strides
              never share a block that one writes and the other reads or writes, in periods 0..m;
          (R) every entry x that periods 1..m read has S1[x] = S0[x - beta] + Delta, or is idle
              in both (S1[x] and S0[x - beta]).
        By induction over periods and, inside a period, over instructions: (A) makes the writers
        of a block in period t the shifted writers of the block beta earlier in period t - 1, so
        the state an instruction sees in period t is the one its counterpart saw, plus Delta,
        except for entries that come from S1 unchanged, which (R) and (U) cover; the start is the
        maximum of the constraints, and idle ones are not the maximum on either side. Ready and
        last-read times only grow (an instruction starts after its destination is ready, and
        latencies are not negative), so after the skip each entry is the maximum of its value in
        S1 and of everything periods 1..m wrote to it: period 0's writes, shifted by t*beta
        blocks and t*Delta cycles. Accesses of the skipped iterations are bounds-checked: only
        the periods before the first failing access are skipped, and walking raises the error.
        (R) is checked per period too: when it fails from some period on, the periods before it
        are skipped and trying starts again after them.
        """
        var, n, g = loop.var, loop.count, self.g
        for P in info.periods:
            if P > len(history):
                break
            m = (n - k1) // P
            if m < 1:
                continue
            (d0, uf0, busy0, c0), _ = history[-P]
            recs = [r for _, r in history[-P:]]
            d1 = self.dispatch
            rp = self.count - c0
            units: set[str] = set().union(*(r.units for r in recs))
            minslack = min(r.minslack for r in recs)
            theta0 = min(r.minstart for r in recs)
            lim0 = max(d0 + 1, theta0)              # S0 values below this are idle
            # (U) and (D): cheap, tried first
            deltas = {rp} | {self.unit_free.get(u, 0) - uf0.get(u, 0) for u in units}
            if len(history) >= 2 * P:               # how far period 0 moved from the one before
                earlier = [r for _, r in history[-2 * P:-P]]
                if theta0 < _INF and min(r.minstart for r in earlier) < _INF:
                    deltas.add(theta0 - min(r.minstart for r in earlier))
                    deltas.add(max(r.maxdone for r in recs) - max(r.maxdone for r in earlier))
            good = []
            for delta in sorted(deltas):
                if delta < rp or (delta > rp and minslack <= 0):
                    continue
                lim1 = max(d1 + 1, theta0 + delta)  # S1 values below this are idle
                if all(self.unit_free.get(u, 0) == uf0.get(u, 0) + delta
                       or (self.unit_free.get(u, 0) < lim1 and uf0.get(u, 0) < lim0) for u in units):
                    good.append(delta)
            if not good:
                continue
            period = _Rec()
            for r in recs:
                period.absorb(r)
            betas: dict[tuple, int] = {}
            for key in (*period.reads, *period.writes):
                betas.setdefault(key[2], _coeff(key[2], var) * P)
            if any(sigma % g for sigma in betas.values()):
                continue                          # cannot happen with P a multiple of the address period
            betas = {terms: sigma // g for terms, sigma in betas.items()}
            if not self._bounds_ok(info, counters, var, k1, k1 + m * P - 1):
                ok, bad = 0, m                      # skip no further than the accesses stay in bounds
                while bad - ok > 1:
                    mid = (ok + bad) // 2
                    ok, bad = (mid, bad) if self._bounds_ok(info, counters, var, k1, k1 + mid * P - 1) else (ok, mid)
                if ok < 1:
                    return 0
                m = ok
            size = {space: arr.size for space, arr in self.ready.items()}
            reads = {}                              # blocks read in period 0 (distinct if they move)
            for key, lst in period.reads.items():
                blocks = np.concatenate(lst)
                reads[key] = blocks if betas[key[2]] == 0 else _distinct(blocks, size[key[0]])
            writes = {key: _max_per_block(np.concatenate([b for b, _ in lst]),
                                          np.concatenate([v for _, v in lst]), size[key[0]])
                      for key, lst in period.writes.items()}
            future = {key: _progression(f0, betas[key[2]], 1, m) for key, f0 in reads.items()}
            before = self._state_before(period)
            for delta in good:
                lim1 = max(d1 + 1, theta0 + delta)
                mm = self._periodic_periods(reads, future, betas, before, delta, lim0, lim1, m)
                if mm < 1:
                    continue
                if mm < m:                          # (R) holds for the first mm periods only
                    future = {key: x if betas[key[2]] == 0 else x[: mm * reads[key].size]
                              for key, x in future.items()}
                    m = mm
                if not self._strides_separate(reads, writes, future, betas, m):
                    break
                self._apply(period, writes, future, betas, m, P, delta, rp, busy0, parent, history)
                return m * P
        return 0

    def _strides_separate(self, reads, writes, future, betas, m) -> bool:
        """(A): per memory and array, the blocks one stride class writes in periods 0..m meet no
        block another class reads or writes."""
        touched: dict[tuple, dict[int, list[np.ndarray]]] = {}
        written: dict[tuple, dict[int, list[np.ndarray]]] = {}
        for key, f0 in reads.items():
            touched.setdefault(key[:2], {}).setdefault(betas[key[2]], []).extend((f0, future[key]))
        for key, (blocks, _) in writes.items():
            every = _progression(blocks, betas[key[2]], 0, m)
            touched.setdefault(key[:2], {}).setdefault(betas[key[2]], []).append(every)
            written.setdefault(key[:2], {}).setdefault(betas[key[2]], []).append(every)
        for arr, by_beta in written.items():
            classes = touched[arr]
            if len(classes) < 2:
                continue
            hull = {b: (min(int(a.min()) for a in v if a.size), max(int(a.max()) for a in v if a.size))
                    for b, v in classes.items() if any(a.size for a in v)}
            masks: dict[int, np.ndarray] = {}
            for b1, ws in by_beta.items():
                for w in ws:
                    if not w.size:
                        continue
                    lo, hi = int(w.min()), int(w.max())
                    for b2, (lo2, hi2) in hull.items():
                        if b2 == b1 or hi < lo2 or hi2 < lo:
                            continue
                        if b2 not in masks:
                            mask = np.zeros(self.ready[arr[0]].size, bool)
                            for a in classes[b2]:
                                mask[a] = True
                            masks[b2] = mask
                        if masks[b2][w].any():
                            return False
        return True

    def _state_before(self, period: _Rec) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
        """Per (memory, array) that period 0 wrote: the blocks it wrote, sorted, and the least
        value each had before its writes, which is its value before period 0 (S0; entries only
        grow). Elsewhere S0 is the array as it is now (`_earlier`): copying whole arrays, the
        DRAM's among them, took most of the time of long simulations."""
        before = {}
        for (space, kind), lst in period.undo.items():  # the least old value: the largest negated
            blocks, least = _max_per_block(np.concatenate([b for b, _ in lst]),
                                           -np.concatenate([o for _, o in lst]), self.ready[space].size)
            before[(space, kind)] = (blocks, -least)
        return before

    def _periodic_periods(self, reads, future, betas, before, delta, lim0, lim1, m) -> int:
        """(R) for one Delta: how many of the m periods it holds for (values below lim0 in S0
        and below lim1 in S1 are idle)."""
        held = m
        for key, x in future.items():
            space, kind, terms = key
            arr = (self.ready if kind == _READY else self.lastread)[space]
            beta = betas[terms]
            now = arr[x]
            then = _earlier(arr, x - beta, before.get((space, kind)))
            ok = (now == then + delta) | ((now < lim1) & (then < lim0))
            if ok.all():
                continue
            if beta == 0:
                return 0
            good_periods = ok.reshape(m, reads[key].size).all(axis=1)
            held = min(held, int(np.argmin(good_periods)))   # periods before the first failure
            if held == 0:
                return 0
        return held

    def _apply(self, period: _Rec, writes, future, betas, m: int, P: int, delta: int, rp: int,
               busy0: dict[str, int], parent: _Rec | None, history) -> None:
        """Advance the machine by m periods of P iterations, each Delta cycles and rP
        instructions long, and give every scoreboard entry they write its final value."""
        skip = _Rec() if parent is not None else None
        for key, (blocks, values) in writes.items():
            space, kind, terms = key
            beta = betas[terms]
            if beta == 0:
                idx, vals = blocks, values + m * delta
            else:
                idx = _progression(blocks, beta, 1, m)
                vals = _progression(values, delta, 1, m)
            arr = (self.ready if kind == _READY else self.lastread)[space]
            if skip is not None:
                skip.write(space, kind, terms, idx, vals, arr[idx])
            np.maximum.at(arr, idx, vals)
        for u, b in list(self.busy.items()):
            self.busy[u] = b + m * (b - busy0.get(u, 0))
        for u in period.units:
            self.unit_free[u] += m * delta
        self.dispatch += m * rp
        self.count += m * rp
        for u, d in period.unitdone.items():
            self.done[u] = max(self.done.get(u, 0), d + m * delta)
        self.skipped_iterations += m * P
        if skip is not None:
            for key, x in future.items():
                skip.read(*key, x)
            skip.units = set(period.units)
            skip.unitdone = {u: d + m * delta for u, d in period.unitdone.items()}
            self._pass_on(history, parent)
            parent.absorb(skip)


def simulate(program: Program, block: int, env: Mapping[str, np.ndarray] | None = None,
             functional: bool = True) -> SimResult:
    """Run the setup, then one inference; functional mode needs `env` (values of every Var).
    Timing-only mode (functional=False) gives the same cycles, instruction count and unit
    activity, in a time that does not grow with the trip counts of loops that become periodic."""
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
    return SimResult(m.end, setup_cycles, out, m.count, dict(sorted(m.busy.items())), dict(sorted(m.done.items())))
