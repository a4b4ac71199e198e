"""Poison values and output comparison for the dynamic race audit.

The poison of a shared buffer must differ from its contents in *every* element it can, or a
late read of an unchanged element goes unseen (a ``bf16`` value ``x`` with ``x + 1 == x`` is
not poison). `default_poison` picks, per dtype:

* booleans: the negation;
* integers: ``(x + 1) mod (max + 1)`` while that stays representable, so a poisoned index
  table still points inside the pool it indexes (wrong data, never an illegal address); a
  0/1 flip when nothing is positive; the bitwise complement when ``max + 1`` overflows;
* floating point and complex: ``-2 x`` (exact in binary floating point, overflow gives an
  infinity of the other sign), with zeros and NaNs becoming one.

Each rule differs from every input element (including infinities, NaNs and signed zeros);
`unchanged_elements` counts what a (possibly user-supplied) poison leaves equal, and the audit
refuses a SAFE verdict when that count is not zero.

Outputs are compared element by element (NaN equals NaN); `first_mismatch` names the first
differing element.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from warpolicy.audit.report import Mismatch


def default_poison(tensor: Any) -> Any:
    """A tensor like ``tensor`` that differs from it in every element (see the module doc)."""
    import torch

    if tensor.dtype == torch.bool:
        return ~tensor
    if tensor.is_floating_point() or tensor.is_complex():
        wide = tensor.to(_wide_dtype(tensor.dtype)) if tensor.element_size() < 4 else tensor
        nothing = (wide == 0) | torch.isnan(wide)
        return torch.where(nothing, torch.ones_like(wide), wide * -2).to(tensor.dtype)
    if tensor.numel() == 0:
        return tensor.clone()
    top = int(tensor.max().item())
    if top <= 0:
        return (tensor == 0).to(tensor.dtype)
    if top < torch.iinfo(tensor.dtype).max:
        return torch.remainder(tensor.to(torch.int64) + 1, top + 1).to(tensor.dtype)
    return torch.bitwise_not(tensor)  # max + 1 is not representable


def _wide_dtype(dtype: Any) -> Any:
    """float32 for the narrow floating types (their arithmetic is not always implemented)."""
    import torch

    return torch.complex64 if dtype.is_complex else torch.float32


def unchanged_elements(poison: Any, state: Any) -> int:
    """How many elements of ``state`` the ``poison`` leaves equal (NaN equals NaN); every
    element when the two cannot be compared (another shape)."""
    import torch

    if tuple(poison.shape) != tuple(state.shape):
        return int(state.numel())
    same = poison == state
    if state.is_floating_point() or state.is_complex():
        same |= torch.isnan(poison) & torch.isnan(state)
    return int(same.sum().item())


def flatten_outputs(output: Any, label: str = "out") -> list[tuple[str, Any]]:
    """``(label, tensor)`` for every tensor in a tensor / sequence / mapping output."""
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


def snapshot_outputs(
    output: Any, extra: Optional[Mapping[str, Any]] = None
) -> list[tuple[str, Any]]:
    """Detached clones of every output tensor, then of every ``extra`` tensor under its own
    name (state the step writes, such as KV pools). Call after the device is idle."""
    tensors = flatten_outputs(output) + sorted((extra or {}).items())
    return [(label, t.detach().clone()) for label, t in tensors]


def first_mismatch(
    reference: Sequence[tuple[str, Any]], observed: Sequence[tuple[str, Any]], trial: int
) -> Optional[Mismatch]:
    """The first element where ``observed`` differs from ``reference`` (NaN equals NaN)."""
    import torch

    want_labels = ", ".join(label for label, _ in reference)
    got_labels = ", ".join(label for label, _ in observed)
    if want_labels != got_labels:  # the step returned a differently shaped output
        return Mismatch(trial, "out", (), want_labels, got_labels, 1)
    for (label, want), (_, got) in zip(reference, observed):
        if want.shape != got.shape or want.dtype != got.dtype:
            return Mismatch(
                trial,
                label,
                (),
                f"{want.dtype}{list(want.shape)}",
                f"{got.dtype}{list(got.shape)}",
                1,
            )
        differ = want != got
        if want.is_floating_point() or want.is_complex():
            differ &= ~(torch.isnan(want) & torch.isnan(got))
        count = int(differ.sum().item())
        if count:
            index = tuple(int(i) for i in differ.nonzero()[0].tolist()) if differ.dim() else ()
            return Mismatch(trial, label, index, want[index].item(), got[index].item(), count)
    return None
