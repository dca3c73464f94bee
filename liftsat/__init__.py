"""liftsat: deep-learning layers to accelerator instructions by equality saturation."""

from liftsat.api import Result, optimize, rules_for

__all__ = ["Result", "optimize", "rules_for"]
