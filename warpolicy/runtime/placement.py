"""Planting and checking the read-done node in a kept graph: the verdicts a capture needs.

Two entry points an engine that owns its capture calls after capturing a bucket into a kept
graph (``platform.new_graph(keep_graph=True)``), exactly as the runners do:

* `check_bucket_marker`: the marker self-check of a graph whose body recorded ``event``;
* `plant_bucket_derived`: derived placement, adding the node after the shared readers the walk
  finds in a graph captured without a marker.

Each returns a `Placement` outcome with one of three verdicts, never raising an ``Exception``:

* ``CONFIRMED``: the node is there and precedes every shared reader the walk can see;
* ``REFUTED``: verified that no usable node exists (a late reader, no shared reader found, the
  platform cleanly cannot walk its graphs): the bucket gets the unplanted policy;
* ``DOUBT``: something raised or returned nonsense (including the walk-availability probe): the
  bucket publishes nothing.

Then `instantiate_kept` builds the executable graph (a failure is a doubt, on both paths).
"""

from __future__ import annotations

import enum

import attrs

from warpolicy.runtime.graphwalk import PlacementError
from warpolicy.runtime.graphwalk.launch_sites import Sites
from warpolicy.runtime.graphwalk.plant import SharedBuffers
from warpolicy.runtime.platforms import EventHandle, GraphHandle, Platform


class Verdict(enum.Enum):
    CONFIRMED = "confirmed"
    REFUTED = "refuted"
    DOUBT = "doubt"


@attrs.frozen
class PlacementOutcome:
    """What a plant or check established: the verdict, one line saying why, the walk's cost."""

    verdict: Verdict
    detail: str
    walked: bool = False
    walk_ms: float = 0.0

    @property
    def confirmed(self) -> bool:
        return self.verdict is Verdict.CONFIRMED


def _doubt(detail: str) -> PlacementOutcome:
    return PlacementOutcome(Verdict.DOUBT, detail)


def walk_unavailable(platform: Platform) -> tuple[str | None, str | None]:
    """(why the platform cleanly cannot walk its graphs, why the probe itself failed); both None
    when it can walk. A probe that raises is a doubt, never "cannot walk"."""
    try:
        return platform.graph_walk_unavailable(), None
    except PlacementError as exc:
        return None, f"the graph-walk probe failed: {exc.reason}"


def check_bucket_marker(
    platform: Platform,
    graph: GraphHandle,
    shared_buffers: SharedBuffers,
    event: EventHandle,
    sites: Sites | None = None,
) -> PlacementOutcome:
    """The marker self-check of the kept ``graph`` whose capture recorded ``event``; ``sites``
    (the capture's launch sites) name each late reader's Python line."""
    try:
        check = platform.check_marker(graph, shared_buffers, event)
    except PlacementError as exc:
        return _doubt(f"marker self-check could not run ({exc.reason})")
    except Exception as exc:  # noqa: BLE001 - the facade wraps; a walker bug is still a doubt
        return _doubt(f"marker self-check failed: {type(exc).__name__}: {exc}")
    detail = check.describe(sites=sites)
    if check.ok:
        return PlacementOutcome(Verdict.CONFIRMED, detail, True, check.total_ms)
    return PlacementOutcome(Verdict.REFUTED, detail, True, check.total_ms)


def plant_bucket_derived(
    platform: Platform,
    graph: GraphHandle,
    shared_buffers: SharedBuffers,
    event: EventHandle,
    sites: Sites | None = None,
) -> PlacementOutcome:
    """Derived placement in the kept, not yet instantiated ``graph``: the node recording
    ``event`` after the shared readers the walk finds (named by Python line where ``sites``
    know it)."""
    try:
        plant = platform.plant_derived(graph, shared_buffers, event)
    except PlacementError as exc:
        if exc.no_readers:  # the walk worked and saw no shared reader: verified, suspicious
            return PlacementOutcome(
                Verdict.REFUTED, f"suspicious: no shared reader found in the graph ({exc.reason})"
            )
        return _doubt(f"derived placement failed ({exc.reason})")
    except Exception as exc:  # noqa: BLE001 - the facade wraps; a walker bug is still a doubt
        return _doubt(f"derived placement failed: {type(exc).__name__}: {exc}")
    return PlacementOutcome(Verdict.CONFIRMED, plant.describe(sites), True, plant.total_ms)


def instantiate_kept(platform: Platform, graph: GraphHandle) -> str | None:
    """Instantiate a kept graph before its first replay; None, or one line saying why it failed
    (a doubt: the node cannot be trusted, on the marker and the derived path alike)."""
    try:
        platform.instantiate(graph)
    except Exception as exc:  # noqa: BLE001 - the bucket is coarse
        return f"instantiating the graph failed ({exc!r})"
    return None


__all__ = [
    "PlacementOutcome",
    "Verdict",
    "check_bucket_marker",
    "instantiate_kept",
    "plant_bucket_derived",
    "walk_unavailable",
]
