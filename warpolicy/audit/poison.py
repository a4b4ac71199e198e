"""Poison values and output comparison for the dynamic race audit.

A poison must change what a late reader *computes*, not only what it loads. 0.2's single poison
``(x + 1) mod (max + 1)`` changed every element and still missed real readers on the H200: on
the only length of a one-request batch it gives 0 (an empty request, whose page-table rows a
rebuild then leaves as they were), and it leaves ``x // page_size`` unchanged on every
page-aligned entry of a request-to-token table or SWA mapping, so a late page-table rebuild
passed the dynamic test 0/30. So each trial now runs one poisoned step per poison of a **set**
(`default_poisons`), every one compared with the same reference step.

Integer tables mark "no entry" with a negative **sentinel** (SGLang's SWA mapping ends in
``-1``; page tables pad with ``-1``). A negative entry of a tensor that also holds non-negative
ones is a sentinel (`sentinel_mask`): every integer poison keeps it where it was and never
writes one anywhere else, so a reader that masks sentinels still masks the same entries and a
reader that indexes through a live entry still indexes inside the buffer. (0.3.0 took ``lo``
over the sentinels too, so ``low`` and ``high`` wrote ``-1`` into live entries and a late
reader of SGLang 0.5.23's SWA mapping indexed out of bounds: a device-side assert instead of
UNSAFE.) For the **live** entries, with ``lo = min(0, min x)``, ``hi = max x`` and
``m = hi - lo + 1`` values (every poison stays in ``[lo, hi]``, so a poisoned index table still
indexes what it indexed, and changes every live element):

* ``half_turn``: ``lo + ((x - lo) + ceil(m / 2)) mod m`` moves every element by at least
  ``floor(m / 2)``, so ``x // g`` changes for every granularity ``g <= m / 2`` (a page size
  against a KV pool's slot numbers, a window against a length), and the only length ``L`` of a
  one-request batch becomes ``floor(L / 2)``, still a length (not 0, for ``L >= 2``);
* ``low``: every element becomes ``lo + 1`` (the smallest non-degenerate value: a length of 1,
  slot 1, never the empty length 0 or a ``-1`` sentinel), those already there ``hi``: a reader
  that clamps from above (``min(x, window)``) sees a value below any clamp;
* ``high``: every element becomes ``hi``, those already there ``lo``: a reader that clamps
  from below (``max(x - window, 0)``) sees the largest value the buffer holds.

A late read is caught when any poison changes the step's output; the three cover exact reads,
integer division by any granularity up to half the value range, and one-sided clamps at either
end whose bound lies inside the values the buffer holds. A range-preserving poison cannot move
a value across a bound no element reaches, and no finite set catches every function, so
``AuditSubject.poison`` keeps per-buffer overrides (one callable or a sequence of them).

Booleans get their negation; floating point and complex ``-2 x`` (exact in binary floating
point; overflow gives an infinity of the other sign; zeros and NaNs become one), which flips
every sign, so a clamp at zero sees it. ``plus_one`` is 0.2's poison, kept
for comparison and for the positive controls that show what it misses.

A live range too wide for the arithmetic (most of int64) flips each live value's lowest bit,
stepping back inside ``[lo, hi]`` at either end. A buffer whose live entries all hold one value
``c`` has no other value in its range: it becomes ``c - 1`` when ``c > 0`` (still an index
wherever ``c`` was one), else ``c + 1``.

`unchanged_elements` counts the live elements a (possibly user-supplied) poison leaves equal
(sentinels kept in place are not live); the audit refuses a SAFE verdict when that count is not
zero.

Outputs are compared element by element (NaN equals NaN); `first_mismatch` names the first
differing element. Flattening and comparing are the runtime's (`warpolicy.runtime.canary.compare`),
shared with the WAR canary.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from warpolicy.audit.report import Mismatch
from warpolicy.runtime.canary.compare import first_difference, flatten_outputs

PoisonFn = Callable[[Any], Any]
#: What ``AuditSubject.poison`` maps a buffer to: one poison, or a set of them
#: (``warpolicy.audit.subject.PoisonOverride``).
PoisonSpec = PoisonFn | Sequence[PoisonFn]


@attrs.frozen
class Poison:
    """A named poison: ``apply(tensor)`` returns a tensor like it (the buffer is not changed)."""

    name: str
    apply: PoisonFn = attrs.field(eq=False)

    def __call__(self, tensor: Any) -> Any:
        return self.apply(tensor)


def sentinel_mask(tensor: Any) -> Any:
    """The sentinel entries of an integer tensor: its negative entries when it also holds a
    non-negative one (an index table's "no entry", such as ``-1``); None when there are none
    (every entry negative counts as values, not sentinels; booleans and floats have none)."""
    if _not_int(tensor) or tensor.numel() == 0:
        return None
    negative = tensor < 0
    if not bool(negative.any()) or bool(negative.all()):
        return None
    return negative


def _int_range(live: Any) -> tuple[int, int, int] | None:
    """``(lo, hi, m)`` of the live entries (``lo = min(0, min)``), or None when ``m`` would not
    fit the arithmetic (a range spanning most of int64)."""
    lo = min(0, int(live.min().item()))
    hi = int(live.max().item())
    m = hi - lo + 1
    return (lo, hi, m) if m < 2**62 else None


def _single_value(wide: Any, c: int, dtype: Any) -> Any:
    """Every live element equals ``c``: ``c - 1`` when ``c > 0`` (an index below a valid one
    is valid too), else ``c + 1`` (``c - 1`` at the dtype's maximum)."""
    import torch  # noqa: PLC0415 - deferred: the audit package imports without torch

    moved = c - 1 if c > 0 or c >= torch.iinfo(dtype).max else c + 1
    return torch.full_like(wide, moved)


def _flip_low_bit(wide: Any, lo: int, hi: int) -> Any:
    """Each value with its lowest bit flipped, stepping back inside ``[lo, hi]`` at the ends."""
    import torch  # noqa: PLC0415 - deferred: the audit package imports without torch

    out = torch.bitwise_xor(wide, 1)
    out = torch.where(out > hi, wide - 1, out)
    return torch.where(out < lo, wide + 1, out)


def _integer(tensor: Any, kind: str) -> Any:
    import torch  # noqa: PLC0415 - deferred: the audit package imports without torch

    if tensor.numel() == 0:
        return tensor.clone()
    sentinels = sentinel_mask(tensor)
    live = tensor if sentinels is None else tensor[~sentinels]
    wide = tensor.to(torch.int64)
    lo = min(0, int(live.min().item()))
    hi = int(live.max().item())
    bounds = _int_range(live)
    if bounds is None:
        out = _flip_low_bit(wide, lo, hi)  # the range is most of int64
    elif bounds[2] == 1:
        out = _single_value(wide, hi, tensor.dtype)
    else:
        out = _moved(wide, kind, *bounds)
    if sentinels is not None:
        out = torch.where(sentinels, wide, out)  # sentinels stay where they were
    return out.to(tensor.dtype)


def _moved(wide: Any, kind: str, lo: int, hi: int, m: int) -> Any:
    import torch  # noqa: PLC0415 - deferred: the audit package imports without torch

    if kind == "half_turn":
        return torch.remainder(wide - lo + (m + 1) // 2, m) + lo
    if kind == "low":
        target = lo + 1
        elsewhere = hi if m > 2 else lo
        return torch.where(
            wide != target, torch.full_like(wide, target), torch.full_like(wide, elsewhere)
        )
    return torch.where(wide != hi, torch.full_like(wide, hi), torch.full_like(wide, lo))  # high


def _floating(tensor: Any) -> Any:
    import torch  # noqa: PLC0415 - deferred: the audit package imports without torch

    wide = tensor.to(_wide_dtype(tensor.dtype)) if tensor.element_size() < 4 else tensor
    nothing = (wide == 0) | torch.isnan(wide)
    return torch.where(nothing, torch.ones_like(wide), wide * -2).to(tensor.dtype)


def half_turn(tensor: Any) -> Any:
    """Integers: every element moved half the value range (see the module doc)."""
    return _non_integer(tensor) if _not_int(tensor) else _integer(tensor, "half_turn")


def low(tensor: Any) -> Any:
    """Integers: every element to ``lo + 1`` (those already there to ``hi``)."""
    return _non_integer(tensor) if _not_int(tensor) else _integer(tensor, "low")


def high(tensor: Any) -> Any:
    """Integers: every element to ``hi`` (those already there to ``lo``)."""
    return _non_integer(tensor) if _not_int(tensor) else _integer(tensor, "high")


def plus_one(tensor: Any) -> Any:
    """0.2's poison: integers ``(x + 1) mod (max + 1)`` (a 0/1 flip when nothing is positive,
    the complement when ``max + 1`` overflows); other dtypes as `default_poisons`. Misses
    readers that divide or clamp (the module doc); kept for comparison and the controls."""
    import torch  # noqa: PLC0415 - deferred: the audit package imports without torch

    if _not_int(tensor):
        return _non_integer(tensor)
    if tensor.numel() == 0:
        return tensor.clone()
    top = int(tensor.max().item())
    if top <= 0:
        return (tensor == 0).to(tensor.dtype)
    if top < torch.iinfo(tensor.dtype).max:
        return torch.remainder(tensor.to(torch.int64) + 1, top + 1).to(tensor.dtype)
    return torch.bitwise_not(tensor)  # max + 1 is not representable


def _not_int(tensor: Any) -> bool:
    import torch  # noqa: PLC0415 - deferred: the audit package imports without torch

    return tensor.dtype == torch.bool or tensor.is_floating_point() or tensor.is_complex()


def _non_integer(tensor: Any) -> Any:
    import torch  # noqa: PLC0415 - deferred: the audit package imports without torch

    return ~tensor if tensor.dtype == torch.bool else _floating(tensor)


#: The integer poison set (`half_turn`, `low`, `high`); see the module doc for what each covers.
INTEGER_POISONS: tuple[Poison, ...] = (
    Poison("half_turn", half_turn),
    Poison("low", low),
    Poison("high", high),
)
#: Booleans and floating point: one poison (negation, ``-2 x``).
OTHER_POISONS: tuple[Poison, ...] = (Poison("negate", _non_integer),)


def default_poisons(tensor: Any) -> tuple[Poison, ...]:
    """The default poison set for ``tensor``'s dtype (three for integers, one otherwise)."""
    return OTHER_POISONS if _not_int(tensor) else INTEGER_POISONS


def default_poison(tensor: Any) -> Any:
    """The first poison of the default set applied to ``tensor`` (``half_turn`` for integers)."""
    return default_poisons(tensor)[0](tensor)


def poison_set(spec: PoisonSpec | None, tensor: Any) -> tuple[Poison, ...]:
    """The poisons for one buffer: ``spec`` (a callable or a sequence of callables, from
    ``AuditSubject.poison``) or, when None, `default_poisons`."""
    if spec is None:
        return default_poisons(tensor)
    given = [spec] if callable(spec) else list(spec)
    if not given:
        return default_poisons(tensor)
    return tuple(
        p if isinstance(p, Poison) else Poison(getattr(p, "__name__", "custom"), p) for p in given
    )


def _wide_dtype(dtype: Any) -> Any:
    """float32 for the narrow floating types (their arithmetic is not always implemented)."""
    import torch  # noqa: PLC0415 - deferred: the audit package imports without torch

    return torch.complex64 if dtype.is_complex else torch.float32


def unchanged_elements(poison: Any, state: Any) -> int:
    """How many live elements of ``state`` the ``poison`` leaves equal (NaN equals NaN; a
    sentinel of ``state``, `sentinel_mask`, is not live); every element when the two cannot be
    compared (another shape)."""
    import torch  # noqa: PLC0415 - deferred: the audit package imports without torch

    if tuple(poison.shape) != tuple(state.shape):
        return int(state.numel())
    same = poison == state
    if state.is_floating_point() or state.is_complex():
        same |= torch.isnan(poison) & torch.isnan(state)
    sentinels = sentinel_mask(state)
    if sentinels is not None:
        same &= ~sentinels
    return int(same.sum().item())


def snapshot_outputs(output: Any, extra: Mapping[str, Any] | None = None) -> list[tuple[str, Any]]:
    """Detached clones of every output tensor, then of every ``extra`` tensor under its own
    name (state the step writes, such as KV pools). Call after the device is idle."""
    tensors = flatten_outputs(output) + sorted((extra or {}).items())
    return [(label, t.detach().clone()) for label, t in tensors]


def first_mismatch(
    reference: Sequence[tuple[str, Any]],
    observed: Sequence[tuple[str, Any]],
    trial: int,
    poison: str = "",
) -> Mismatch | None:
    """The first element where ``observed`` differs from ``reference`` (NaN equals NaN), by the
    comparison the WAR canary uses (`warpolicy.runtime.canary.first_difference`, bitwise);
    ``poison`` names the poison of the step that produced ``observed``."""
    diff = first_difference(reference, observed)
    if diff is None:
        return None
    return Mismatch(trial, diff.output, diff.index, diff.expected, diff.got, diff.count, poison)
