"""liftsat: deep-learning layers to accelerator instructions by equality saturation."""

from liftsat.api import Comparison, Result, optimize, optimize_targets
from liftsat.rulesets import rules_for
from liftsat.targets import get_target

__all__ = ["Comparison", "Result", "get_target", "optimize", "optimize_targets", "rules_for"]
