"""The exceptions of the `highwater` package (issue 48).

Defined here, in Python, rather than in the extension: an exception a user
catches should name the package they imported (`highwater.GuardError`, not
`_core.GuardError`), and pickle, so that it crosses process boundaries
(multiprocessing, Dagster and Airflow workers) intact. The extension raises
these very classes.
"""

from __future__ import annotations


class HighwaterError(Exception):
    """The engine refused or failed; the message names what and why."""


class GuardError(HighwaterError):
    """The guard refused the run: too many items would be redone. Check the
    plan, then pass `force=True` if it really is a full rebuild."""


class DeclarationError(HighwaterError, ValueError):
    """A stage cannot be declared as written (a function the worker processes
    cannot import, a stage name declared in two places); the message names
    the fix. Also a `ValueError`, as such refusals were before."""


class RunFailed(HighwaterError):
    """`Pipeline.run` finished, but some items failed or a stage was
    blocked. `result` is the run's `Result`, the failures in
    `result.stages[name].failed`. Pass `raise_on_failure=False` to get the
    result back instead."""

    def __init__(self, message: str, result: object = None) -> None:
        super().__init__(message, result)
        self.message = message
        self.result = result

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.message, self.result))


__all__ = ["HighwaterError", "GuardError", "DeclarationError", "RunFailed"]
