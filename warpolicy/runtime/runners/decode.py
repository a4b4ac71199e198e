"""Decode runner: one graph per batch size (one token per request)."""

from __future__ import annotations

from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.runners.base import GraphRunner


class DecodeRunner(GraphRunner):
    """Buckets by batch size. A batch measures ``model.batch_size(batch)`` or ``len(batch)``.

    Under the default registry decode is ``IN_GRAPH`` when the node was planted: the
    scheduler is released by the node right after the in-graph metadata prep.
    """

    mode = ForwardMode.DECODE
