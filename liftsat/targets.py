"""The targets: built-in descriptions (hwmodels/targets/*.toml) by name, or a user's .toml file."""

from __future__ import annotations

from pathlib import Path

import hwmodels
from hwmodels.description import load_target
from hwmodels.target import Target, TargetError

#: built-in target name -> its description file
BUILTIN: dict[str, Path] = {p.stem: p for p in sorted(Path(hwmodels.__file__).with_name("targets").glob("*.toml"))}


def get_target(name_or_path: str, native_dim: int | None = None) -> Target:
    """A built-in target by name, or the target a path ending in .toml describes; optionally at
    another native dimension."""
    if name_or_path.endswith(".toml"):
        return load_target(Path(name_or_path), native_dim)
    if name_or_path not in BUILTIN:
        raise TargetError(f"unknown target {name_or_path!r}; built-in targets: {', '.join(BUILTIN)} "
                          f"(or the path of a .toml target description)")
    return load_target(BUILTIN[name_or_path], native_dim)


def get_targets(spec: str, native_dim: int | None = None) -> list[Target]:
    """The targets a `--target` value names: `all` (every built-in target), one name or path, or
    a comma-separated list of them."""
    names = list(BUILTIN) if spec == "all" else [n.strip() for n in spec.split(",")]
    if "" in names:
        raise TargetError(f"empty target name in {spec!r}; give names separated by commas, e.g. systolic,vta")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise TargetError(f"target {repeated[0]!r} is listed twice in {spec!r}")
    return [get_target(n, native_dim) for n in names]


def summary(t: Target) -> dict:
    """A target's key numbers (what `liftsat targets` shows)."""
    return {
        "name": t.name,
        "native_dim": t.native_dim,
        "clock_mhz": t.clock_mhz,
        "peak_macs_per_cycle": t.peak_macs_per_cycle,
        "dram_bytes_per_cycle": t.dram.bandwidth,
        "memory_bytes": {m.name: m.capacity for m in t.memories.values()},
        "ops": [o.mnemonic for o in t.ops],
    }
