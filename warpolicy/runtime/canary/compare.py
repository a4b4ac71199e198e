"""Comparing what a step produced: the part the WAR canary and the dynamic audit share.

A step's output (a tensor, or tensors nested in sequences and mappings) is flattened into
``(label, tensor)`` pairs (`flatten_outputs`: ``out``, ``out[0]``, ``out['logits']``); two such
lists are compared element by element (`first_difference`), bitwise by default (NaN equals NaN)
or, for a forward that is not deterministic, within a declared `Tolerance` (integers are always
compared exactly). The answer names the first differing element (`Difference`).

Torch is imported inside the functions: importing the runtime does not import it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from warpolicy.errors import InputError


def _tolerance_value(instance: Any, attribute: Any, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"canary tolerance {attribute.name} must be a number, not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise InputError(
            f"canary tolerance {attribute.name} must be finite and >= 0, not {value!r}"
        )


@attrs.frozen
class Tolerance:
    """How far a floating-point element may move and still count as equal:
    ``|got - expected| <= atol + rtol * |expected|`` (``torch.isclose``; NaN equals NaN).
    Integer and boolean elements are always compared exactly."""

    atol: float = attrs.field(default=0.0, validator=_tolerance_value)
    rtol: float = attrs.field(default=0.0, validator=_tolerance_value)

    def describe(self) -> str:
        return f"atol {self.atol:g}, rtol {self.rtol:g}"


@attrs.frozen
class Difference:
    """The first element where a step's result differed from its reference."""

    #: which result: ``"out"``, ``"out[1]"``, ``"out['logits']"``, ``"state['kv_pool']"``
    output: str
    #: index of the first differing element in that result (``()`` for a shape or label change)
    index: tuple[int, ...]
    #: the reference value (a Python scalar, or a description for a shape change)
    expected: Any
    #: the value observed
    got: Any
    #: how many elements of that result differ
    count: int

    def describe(self) -> str:
        where = f"{self.output}[{', '.join(str(i) for i in self.index)}]"
        plural = "s differ" if self.count != 1 else " differs"
        got, expected = _scalar(self.got), _scalar(self.expected)
        return f"{where} = {got}, expected {expected} ({self.count} element{plural})"


def _scalar(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def flatten_outputs(output: Any, label: str = "out") -> list[tuple[str, Any]]:
    """``(label, tensor)`` for every tensor in a tensor / sequence / mapping output (anything
    else, e.g. a plain Python value, contributes nothing)."""
    if hasattr(output, "shape") and hasattr(output, "dtype"):
        return [(label, output)]
    if isinstance(output, Mapping):
        return [
            x
            for k in sorted(output, key=str)
            for x in flatten_outputs(output[k], f"{label}[{k!r}]")
        ]
    if isinstance(output, (list, tuple)):
        return [x for i, v in enumerate(output) for x in flatten_outputs(v, f"{label}[{i}]")]
    return []


def first_difference(
    reference: Sequence[tuple[str, Any]],
    observed: Sequence[tuple[str, Any]],
    tolerance: Tolerance | None = None,
) -> Difference | None:
    """The first element where ``observed`` differs from ``reference``, or None.

    Both are ``(label, tensor)`` lists (`flatten_outputs`). Different labels, shapes or dtypes
    are a difference of their own. Without ``tolerance`` every element must be equal (NaN equals
    NaN); with one, floating-point elements may differ within it. Reads the values on the host:
    call it once the device work that produced them is done.
    """
    import torch  # noqa: PLC0415 - deferred: the runtime imports without torch

    want_labels = ", ".join(label for label, _ in reference)
    got_labels = ", ".join(label for label, _ in observed)
    if want_labels != got_labels:  # the step returned a differently shaped output
        return Difference("out", (), want_labels, got_labels, 1)
    for (label, want), (_, got) in zip(reference, observed):
        if tuple(want.shape) != tuple(got.shape) or want.dtype != got.dtype:
            return Difference(
                label, (), f"{want.dtype}{list(want.shape)}", f"{got.dtype}{list(got.shape)}", 1
            )
        differ = _differ(torch, want, got, tolerance)
        count = int(differ.sum().item())
        if count:
            index = tuple(int(i) for i in differ.nonzero()[0].tolist()) if differ.dim() else ()
            return Difference(label, index, want[index].item(), got[index].item(), count)
    return None


def _differ(torch: Any, want: Any, got: Any, tolerance: Tolerance | None) -> Any:
    """A boolean tensor: True where ``got`` differs from ``want``."""
    floating = want.is_floating_point() or want.is_complex()
    if not floating:
        return want != got
    if tolerance is None or (tolerance.atol == 0 and tolerance.rtol == 0):
        return (want != got) & ~(torch.isnan(want) & torch.isnan(got))
    wide = torch.promote_types(want.dtype, torch.float32)
    return ~torch.isclose(
        got.to(wide), want.to(wide), rtol=tolerance.rtol, atol=tolerance.atol, equal_nan=True
    )


__all__ = ["Difference", "Tolerance", "first_difference", "flatten_outputs"]
