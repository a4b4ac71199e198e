"""Poisons that fit a buffer class: what a scheduler's write to that class looks like.

The default poisons (`warpolicy.audit.poison`) change every element of any buffer. A class's
own poison also looks like its real writer, so a reader that only cares *whose* state a slot
holds is caught too:

* ``recurrent_state``: `reassign_slots`, every slot holds another slot's state (a slot handed
  to a new request), then the default poison, so no element stays equal where neighbouring
  slots agree;
* ``kv_pages``: `reuse_pages`, every token row holds the row one page further on (a freed page
  refilled with another request's KV), then the default poison;
* ``host_staging``: `refill_slots`, every staging slot holds the next slot's contents (the host
  refilled it for a later step), then the default poison.

Indices stay what they were (these classes hold values, not indices): the metadata class keeps
the default, range-preserving poisons. `class_poisons` gives a buffer's set: its class's poison
first, then the defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from warpolicy.audit.poison import Poison, default_poisons


def _rolled(tensor: Any, rows: int) -> Any:
    """The rows moved by ``rows``, then the dtype's first default poison (which changes every
    element, so one equal to its neighbour changes too)."""
    first = default_poisons(tensor)[0]
    if tensor.dim() == 0 or tensor.shape[0] < 2:
        return first(tensor)
    return first(tensor.roll(rows, dims=0))


def reassign_slots(tensor: Any) -> Any:
    """Every recurrent state slot holds the next slot's state, then the default poison."""
    return _rolled(tensor, 1)


def reuse_pages(page: int = 1) -> Callable[[Any], Any]:
    """Every KV row holds the row ``page`` rows on (one page further), then the default
    poison."""

    def reuse(tensor: Any) -> Any:
        return _rolled(tensor, page)

    reuse.__name__ = f"reuse_pages_{page}"
    return reuse


def refill_slots(tensor: Any) -> Any:
    """Every staging slot holds the next slot's contents, then the default poison."""
    return _rolled(tensor, 1)


#: The poison of each class with one (``metadata`` keeps the defaults).
CLASS_POISONS: Mapping[str, Poison] = {
    "recurrent_state": Poison("reassign_slots", reassign_slots),
    "kv_pages": Poison("reuse_pages", reuse_pages()),
    "host_staging": Poison("refill_slots", refill_slots),
}


def class_poisons(buffer_class: str, tensor: Any) -> tuple[Poison, ...]:
    """The poison set of a buffer of ``buffer_class``: the class's own first, then the
    default set for its dtype."""
    own = CLASS_POISONS.get(buffer_class)
    defaults = default_poisons(tensor)
    return defaults if own is None else (own, *defaults)


__all__ = [
    "CLASS_POISONS",
    "class_poisons",
    "reassign_slots",
    "refill_slots",
    "reuse_pages",
]
