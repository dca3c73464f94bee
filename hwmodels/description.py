"""Target descriptions as TOML files, read into a `Target` with every field checked.

A description gives integer parameters (one of them the native dimension, which the caller may
override), DRAM and the on-chip memories, and device ops whose meanings are IR terms written as
text and whose timings are formulas of the parameters. Meanings and formulas are read with `ast`,
never evaluated as Python: IR constructor calls, integer and string literals, parameter names,
+ - * // / and ceil, min, max. A bad file raises one `TargetFileError` naming file and field.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from egraph_rules.hardware_rules import DeviceOp
from egraph_rules.interpreter import BINARY, UNARY
from egraph_rules.ir import DTYPE_BYTES, SCHEMA, T, Term, fout
from hwmodels.target import LOAD_UNITS, LOADERS, MEMORY_LEAST, OP_UNITS, Memory, OpSpec, Target, TargetError

Value = Term | int | float | str

ARITHMETIC: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
    ast.Div: operator.truediv,
}
FUNCTIONS: dict[str, Callable[..., Any]] = {"ceil": math.ceil, "min": min, "max": max}
#: the name a latency formula uses for the op's occupancy
OCCUPANCY = "occupancy"


class TargetFileError(TargetError):
    """A target description that cannot be used; the message names the file, field and problem."""

    def __init__(self, file: Path, field: str, problem: str):
        super().__init__(f"{file}: {field}: {problem}" if field else f"{file}: {problem}")
        self.file, self.field, self.problem = file, field, problem


def _is_number(v: object) -> bool:
    """An int or float (bool excluded)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _evaluate(node: ast.expr, names: Mapping[str, int], terms: bool) -> Value:
    """The value of an allowed expression; ValueError naming the first construct that is not."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, str):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise ValueError(f"unknown name {node.id!r}; known: {', '.join(names) or 'none'}")
        return names[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
        args: list[Value] = [_evaluate(node.left, names, terms), _evaluate(node.right, names, terms)]
        fn = ARITHMETIC[type(node.op)]
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        name = node.func.id
        args = [_evaluate(a, names, terms) for a in node.args]
        if terms and name in SCHEMA:
            return T(name, *args)
        if name not in FUNCTIONS:
            raise ValueError(f"unknown IR constructor {name!r}" if terms
                             else f"{ast.unparse(node)} is not allowed: {name} is not ceil, min or max")
        fn = FUNCTIONS[name]
    else:
        allowed = "IR constructor calls, " if terms else ""
        raise ValueError(f"{ast.unparse(node)} is not allowed (only {allowed}integers, strings, parameter names, "
                         f"+ - * // / and ceil, min, max)")
    if not all(_is_number(a) for a in args):
        raise ValueError(f"{ast.unparse(node)} computes with something that is not a number")
    try:
        return fn(*args)
    except (TypeError, ZeroDivisionError, OverflowError) as exc:
        raise ValueError(f"cannot compute {ast.unparse(node)}: {exc}") from None


class _Fields:
    """One table of a description: typed reads whose errors name the file and the field."""

    def __init__(self, file: Path, data: dict[str, Any], path: str = ""):
        self.file, self.data, self.path = file, data, path
        self.seen: set[str] = set()

    def name(self, key: str) -> str:
        """The dotted TOML name of a key of this table."""
        k = key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)
        return f"{self.path}.{k}" if self.path else k

    def fail(self, key: str, problem: str) -> NoReturn:
        raise TargetFileError(self.file, self.name(key), problem)

    def get(self, key: str, kind: type | tuple[type, ...], what: str) -> Any:
        """The value of a required field of the given TOML type."""
        if key not in self.data:
            self.fail(key, "missing field")
        self.seen.add(key)
        v = self.data[key]
        if not isinstance(v, kind) or (isinstance(v, bool) and kind is not bool):
            self.fail(key, f"expected {what}, got {v!r}")
        return v

    def text(self, key: str, choices: tuple[str, ...] = ()) -> str:
        """A string field, one of `choices` when given."""
        v = self.get(key, str, "a string")
        if choices and v not in choices:
            self.fail(key, f"unknown {key.replace('_', ' ')} {v!r}; known: {', '.join(choices)}")
        return v

    def optional_text(self, key: str, default: str, choices: tuple[str, ...] = ()) -> str:
        """A string field that may be left out."""
        return self.text(key, choices) if key in self.data else default

    def strings(self, key: str) -> tuple[str, ...]:
        """A list of strings."""
        v = self.get(key, list, "a list of strings")
        if not all(isinstance(s, str) for s in v):
            self.fail(key, f"expected a list of strings, got {v!r}")
        return tuple(v)

    def table(self, key: str) -> _Fields:
        return _Fields(self.file, self.get(key, dict, "a table"), self.name(key))

    def tables(self, key: str) -> dict[str, _Fields]:
        """A table of named tables, such as the memories or the ops."""
        outer = self.table(key)
        return {k: outer.table(k) for k in outer.data}

    def expression(self, key: str, names: Mapping[str, int], terms: bool) -> Value:
        """An integer field, or a string holding a formula (or, with `terms`, an IR term)."""
        v = self.get(key, (str, int), "a string" if terms else "an integer or a formula string")
        if isinstance(v, int):
            return v
        try:
            return _evaluate(ast.parse(v.strip(), mode="eval").body, names, terms)
        except SyntaxError as exc:
            self.fail(key, f"cannot parse {v!r}: {exc.msg}")
        except RecursionError:
            self.fail(key, "expression nested too deeply")
        except ValueError as exc:  # IRTypeError is a ValueError
            self.fail(key, str(exc))

    def number(self, key: str, names: Mapping[str, int], least: int = 1) -> int:
        """A whole number of at least `least`, written as an integer or a formula."""
        v = self.expression(key, names, terms=False)
        if not _is_number(v) or v != int(v):
            self.fail(key, f"must be a whole number, got {v!r}")
        if v < least:
            self.fail(key, f"must be at least {least}, got {int(v)}")
        return int(v)

    def meaning(self, key: str, names: Mapping[str, int], dtypes: tuple[str, ...]) -> Term:
        """An IR function the simulator can execute, well typed, over the target's element types."""
        m = self.expression(key, names, terms=True)
        if not isinstance(m, Term) or m.sort != "F":
            self.fail(key, f"must be an IR function, got {m!r}")
        if m.op not in UNARY and m.op not in BINARY:
            known = ", ".join(op for op in SCHEMA if op in UNARY or op in BINARY)
            self.fail(key, f"{m.op} is not an operation a device op can mean; known: {known}")
        try:
            fout(m)
        except ValueError as exc:
            self.fail(key, f"does not type-check: {exc}")
        for t in m.walk():
            if t.op == "TS" and t.args[0] not in dtypes:
                self.fail(key, f"element type {t.args[0]!r} is not one of the target's dtypes ({', '.join(dtypes)})")
        return m

    def done(self) -> None:
        """Every field was read: anything else is a misspelling."""
        for key in self.data:
            if key not in self.seen:
                self.fail(key, "unknown field")


def _memory(f: _Fields, name: str, names: Mapping[str, int], on_chip: bool) -> Memory:
    """DRAM or an on-chip memory; on-chip ones say how they are loaded."""
    cap, bw, lat = (f.number(key, names, least) for key, least in MEMORY_LEAST.items())
    load = (f.text("load_mnemonic"), f.text("load_unit", LOAD_UNITS), f.optional_text("load_from", ""),
            f.optional_text("loader", "dma", LOADERS)) if on_chip else ()
    mem = Memory(name, cap, bw, lat, *load)
    f.done()
    return mem


def _op(f: _Fields, name: str, names: Mapping[str, int], memories: Mapping[str, Memory],
        dtypes: tuple[str, ...]) -> OpSpec:
    """A device op: what it computes, where its operands and result live, its timing."""
    mnemonic, unit = f.text("mnemonic"), f.text("unit", OP_UNITS)
    operands, result = f.strings("operands"), f.text("result")
    for key, spaces in (("operands", operands), ("result", (result,))):
        for s in spaces:
            if s not in memories:
                f.fail(key, f"memory {s!r} is not declared; memories: {', '.join(memories)}")
    meaning = f.meaning("meaning", names, dtypes)
    arity = 2 if meaning.op in BINARY else 1
    if len(operands) != arity:
        f.fail("operands", f"{meaning.op} needs {arity} operand memories, {len(operands)} given")
    occupancy = f.number("occupancy", names)
    latency = f.number("latency", {**names, OCCUPANCY: occupancy})
    f.done()
    return OpSpec(DeviceOp(name, meaning, operands, result), mnemonic, unit, occupancy, latency)


def load_target(path: Path, native_dim: int | None = None) -> Target:
    """The target a TOML description gives, at its own native dimension or at `native_dim`."""
    try:
        with path.open("rb") as fh:
            top = _Fields(path, tomllib.load(fh))
    except OSError as exc:
        raise TargetFileError(path, "", f"cannot read the target description: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TargetFileError(path, "", f"not valid TOML: {exc}") from None
    name = top.text("name")
    params = top.table("parameters")
    names: dict[str, int] = {}
    for key in params.data:
        if not key.isidentifier() or key in SCHEMA or key in FUNCTIONS or key == OCCUPANCY:
            params.fail(key, "cannot be a parameter name (not an identifier, or taken)")
        names[key] = params.number(key, {})
    native = top.text("native_dim", tuple(names))
    if native_dim is not None:
        if native_dim <= 0:
            raise TargetError(f"native dimension must be positive, got {native_dim}")
        if native_dim != names[native]:
            name, names[native] = f"{name}{native_dim}", native_dim
    dtypes = top.strings("dtypes")
    for d in dtypes:
        if d not in DTYPE_BYTES:
            top.fail("dtypes", f"unknown element type {d!r}; known: {', '.join(DTYPE_BYTES)}")
    clock = top.get("clock_mhz", (int, float), "a number")
    if not 0 < clock < math.inf:
        top.fail("clock_mhz", f"must be a positive number, got {clock}")
    dram = _memory(top.table("dram"), "dram", names, on_chip=False)
    memories = {k: _memory(f, k, names, on_chip=True) for k, f in top.tables("memories").items()}
    if "dram" in memories:
        top.fail("memories", "an on-chip memory cannot be called 'dram'")
    for k, mem in memories.items():
        if mem.loader != "dma" and not mem.load_from:
            top.fail(f"memories.{json.dumps(k)}.loader", "only loads from another on-chip memory (load_from) "
                     "can be done by a unit other than the DMA")
        source = memories.get(mem.load_from)
        if mem.load_from and (source is None or source.load_from or source is mem):
            top.fail(f"memories.{json.dumps(k)}.load_from",
                     f"{mem.load_from!r} is not another on-chip memory loaded from DRAM; memories: {', '.join(memories)}")
    ops = tuple(_op(f, k, names, memories, dtypes) for k, f in top.tables("ops").items())
    target = Target(name=name, clock_mhz=float(clock), native_dim=names[native], dtypes=dtypes, dram=dram,
                    memories=memories, ops=ops, peak_macs_per_cycle=top.number("peak_macs_per_cycle", names),
                    store_mnemonic=top.text("store_mnemonic"),
                    persistent_weights=top.get("persistent_weights", bool, "true or false"),
                    assumptions=top.strings("assumptions"))
    top.done()
    return target
