"""liftsat: deep-learning layers to accelerator instructions by equality saturation."""

from liftsat.api import Comparison, Result, optimize, optimize_targets
from liftsat.rulesets import rules_for

__all__ = ["Comparison", "Result", "optimize", "optimize_targets", "rules_for"]
