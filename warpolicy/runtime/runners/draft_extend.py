"""Draft-extend runner: the draft model's extend after target verify (EAGLE family).

It reruns the draft model over the accepted tokens, and in the EAGLE family it is the step's
last reader of scheduler-shared state (``req_to_token`` rows, sequence lengths, cache
locations). Its graph has **no in-graph marker**: its metadata prep is not separated from the
forward, so the only points a read-done event can mark are around the replay:

* a declared ``pre_replay`` (the draft backend snapshots every shared input during host-side
  metadata init) publishes before the replay;
* ``in_graph`` and ``post_replay`` both publish right after the replay is enqueued (no node
  exists, so in_graph is soundly demoted);
* ``none`` (the default registry's answer unless a backend declares ``draft_extend``)
  publishes nothing, and the scheduler takes the coarse barrier.

Publishing before the replay while the graph still reads the rows is the race an anchor
release shipped (an out-of-bounds gather); only a ``pre_replay`` declaration may do it.

With derived placement (``plant: derived`` for ``draft_extend``) the runner captures the same
body into a kept graph and adds the read-done node after the shared readers the walk finds
(`GraphRunner`), so a declared ``in_graph`` can publish from inside the graph after all.
"""

from __future__ import annotations

from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.runners.base import GraphRunner


class DraftExtendRunner(GraphRunner):
    """Buckets by token count (``model.bucket_sizes(DRAFT_EXTEND)``); no marker in the body:
    with marker placement its buckets are never planted, so a declared ``in_graph`` publishes
    right after the replay; with derived placement the node is added after the walk's readers."""

    mode = ForwardMode.DRAFT_EXTEND
    plants_marker = False
