"""Restored graphs: save where the read-done nodes sit, find them again, rebind, check again.

A graph that is cloned, restored from a saved description or recaptured is a new capture for
the release decision (docs/ARCHITECTURE.md, "Restored graphs"): its planted read-done nodes
record events the scheduler never sees (a persistence library's fresh private events), so the
release point is lost until warpolicy finds each node again by position, makes it record the
fence's new event, and re-runs the self-check. The verdicts, like `warpolicy.runtime.placement`:

* ``CONFIRMED``: every saved node was found, rebound, and the release node precedes every
  shared reader the walk sees in the restored graph;
* ``REFUTED``: verified that the restored graph has no usable node (nothing was planted when it
  was saved; a late shared reader; the platform cleanly cannot walk or restore its graphs):
  the unplanted answer;
* ``DOUBT``: anything else (the node moved or vanished, the graph is not the saved one, an
  ambiguous match, a failed rebind, walk or check): the bucket publishes nothing.

Never raises an ``Exception``; the engine API (`warpolicy.runtime.owned_capture`,
`ReadDoneCapture.save` / ``restore``) and the runners decide the bucket from the verdict.
"""

from __future__ import annotations

from collections.abc import Mapping

from warpolicy.runtime.graphwalk import PlacementError
from warpolicy.runtime.graphwalk.anchor import SavedAnchors
from warpolicy.runtime.graphwalk.plant import SharedBuffers
from warpolicy.runtime.graphwalk.restore import Rebound
from warpolicy.runtime.placement import (
    PlacementOutcome,
    Verdict,
    check_bucket_marker,
    walk_unavailable,
)
from warpolicy.runtime.platforms import EventHandle, GraphHandle, Platform

#: The label of the node whose event a bucket publishes (the one a runner plants); other
#: labels (one per buffer class) are rebound to the events the caller gives.
RELEASE_LABEL = "read_done"


def save_bucket(
    platform: Platform, graph: GraphHandle, planted: Mapping[str, EventHandle]
) -> tuple[SavedAnchors | None, str | None]:
    """The anchors of the kept ``graph``'s planted nodes (``planted``: label -> the event its
    node records; empty when nothing was planted), or None and one line why they cannot be
    saved (a restore of that graph is then coarse)."""
    if platform.restorer is None:
        return None, f"platform {platform.name!r} cannot restore its captured graphs"
    try:
        return platform.save_planted(graph, planted), None
    except PlacementError as exc:
        return None, f"saving the planted nodes failed ({exc.reason})"
    except Exception as exc:  # noqa: BLE001 - the facade wraps; a bug is still "not saved"
        return None, f"saving the planted nodes failed: {type(exc).__name__}: {exc}"


def rebind_bucket(
    platform: Platform,
    graph: GraphHandle,
    saved: SavedAnchors,
    events: Mapping[str, EventHandle],
    shared_buffers: SharedBuffers,
    *,
    check: bool = True,
) -> tuple[PlacementOutcome, Rebound | None]:
    """Find, rebind and self-check the planted nodes of the restored ``graph`` (see the module
    docstring); ``events`` must hold `RELEASE_LABEL` when ``saved`` does. ``check=False``: no
    self-check (the release will not hand out the node's event, as at capture)."""
    if not saved.anchors:
        why = "no read-done node was planted in the saved graph"
        return PlacementOutcome(Verdict.REFUTED, why), None
    unavailable, failed = walk_unavailable(platform)
    if failed is not None:
        return PlacementOutcome(Verdict.DOUBT, failed), None
    if unavailable is not None or platform.restorer is None:
        why = unavailable or f"platform {platform.name!r} cannot restore its captured graphs"
        return PlacementOutcome(Verdict.REFUTED, f"the node cannot be found again ({why})"), None
    try:
        rebound = platform.rebind_planted(graph, saved, events)
    except PlacementError as exc:
        return PlacementOutcome(Verdict.DOUBT, f"restored graph: {exc.reason}"), None
    except Exception as exc:  # noqa: BLE001 - the facade wraps; a bug is still a doubt
        return PlacementOutcome(
            Verdict.DOUBT, f"rebinding failed: {type(exc).__name__}: {exc}"
        ), None
    if RELEASE_LABEL not in saved.labels:  # per-class nodes only: nothing this bucket publishes
        why = f"no {RELEASE_LABEL!r} node was saved (rebound {', '.join(saved.labels)})"
        return PlacementOutcome(Verdict.REFUTED, why), rebound
    if not check:
        return PlacementOutcome(
            Verdict.CONFIRMED, rebound.describe(), True, rebound.walk_ms
        ), rebound
    checked = check_bucket_marker(platform, graph, shared_buffers, events[RELEASE_LABEL])
    detail = f"{rebound.describe()}; {checked.detail}"
    walk_ms = rebound.walk_ms + rebound.find_ms + checked.walk_ms
    return PlacementOutcome(checked.verdict, detail, True, walk_ms), rebound


__all__ = ["RELEASE_LABEL", "rebind_bucket", "save_bucket"]
