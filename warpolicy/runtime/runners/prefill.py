"""Prefill (extend) runner: one graph per token count, eager beyond the largest bucket.

Its host-side metadata snapshot point is the end of ``host_prep``: a backend that declares
``extend: pre_replay`` (it snapshots every shared input during host-side metadata init, like
TRTLLM MHA) has the fence record right there, on the forward stream, before the replay (or,
for an eager prefill, before the in-graph prep and forward run eagerly). Under the default
registry prefill publishes only with the opt-in flag; otherwise the policy is ``NONE`` and
the scheduler uses the coarse barrier.
"""

from __future__ import annotations

from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.runners.base import GraphRunner


class PrefillRunner(GraphRunner):
    """Buckets by token count: ``model.batch_size(batch)`` must return the batch's tokens
    (``len(batch)`` otherwise). Most prefills exceed the largest bucket and run eagerly."""

    mode = ForwardMode.EXTEND
