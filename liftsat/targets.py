"""The built-in targets by name."""

from __future__ import annotations

from hwmodels.brainwave import brainwave
from hwmodels.target import Target


class TargetError(ValueError):
    """Unknown target or bad target parameter."""


BUILTIN = {"brainwave": brainwave}


def get_target(name: str, native_dim: int | None = None) -> Target:
    """A built-in target, optionally at another native dimension."""
    if name not in BUILTIN:
        raise TargetError(f"unknown target {name!r}; built-in targets: {', '.join(BUILTIN)}")
    if native_dim is not None and native_dim <= 0:
        raise TargetError(f"native dimension must be positive, got {native_dim}")
    return BUILTIN[name]() if native_dim is None else BUILTIN[name](native_dim)
