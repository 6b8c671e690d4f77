"""highwater for Python (issue 22): stages as Python functions over the same
engine as the `highwater` CLI, with a code recipe that sees the functions a
stage calls."""

from highwater._core import GuardError, HighwaterError
from highwater.pipeline import Pipeline, Plan, Result

__all__ = ["Pipeline", "Plan", "Result", "HighwaterError", "GuardError"]
