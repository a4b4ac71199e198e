"""Errors of the graph walk: each prints as one line saying what failed and why.

`PlacementError` is what a runner catches: it leaves the bucket unplanted (derived placement)
or demotes it (marker self-check) and warns once with ``str(error)``.
"""

from __future__ import annotations

from warpolicy.errors import WarpolicyError


class GraphWalkError(WarpolicyError):
    """Base of every graph-walk failure; ``str()`` is one line."""


class BindingsMissingError(GraphWalkError):
    """cuda-bindings (``cuda.bindings.driver``) cannot be imported, or lacks a function."""


class CudaCallError(GraphWalkError):
    """A cuda-bindings call returned an error code (or an answer of the wrong shape)."""

    def __init__(self, call: str, code: str, detail: str = "") -> None:
        self.call = call
        self.code = code
        self.detail = detail
        super().__init__(str(self))

    def __str__(self) -> str:
        text = f"{self.call} failed: {self.code}"
        return f"{text} ({self.detail})" if self.detail else text


class PlacementError(GraphWalkError):
    """Derived placement or the marker self-check could not be done; ``reason`` is one line.

    ``no_readers`` is True when the walk worked but found no node touching a shared buffer
    (suspicious: the reads are probably hidden from it), so a caller can word its warning.
    """

    def __init__(self, reason: str, *, no_readers: bool = False) -> None:
        self.reason = " ".join(reason.split())  # always one line
        self.no_readers = no_readers
        super().__init__(self.reason)
