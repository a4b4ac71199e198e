"""Fault-matrix scenario for lifetimes (`warpolicy.runtime.lifetimes.DeferredFrees`).

The scheduler frees what each step read (a page, a request slot, a recurrent slot: one item per
step) with that step's read-done, and writes reused items right after `DeferredFrees.reclaim`
on its schedule stream; it applies no barrier at all, so only the deferred free can order a
reuse write after the reads of the step that freed the item. Every third step it waits for
everything on the host (the coarse point) and writes what `DeferredFrees.settle` hands back.
The oracle judges every reuse write against the reads of the step that freed the item
(``through``): any fault in a record, a wait or the barrier's place must leave 0 early writes.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.lifetimes import DeferredFrees
from warpolicy.runtime.runners import DecodeRunner
from warpolicy.testing.faults.harness import Harness
from warpolicy.testing.faults.model import HarnessModel, policy_table

#: the scenario's steps (batch sizes: buckets and one eager size)
SIZES: tuple[int, ...] = (2, 4, 3, 2, 4, 2, 4, 3)
SETTLE_EVERY = 3


def deferred_frees(
    h: Harness,
    variant: str,
    variants: Mapping[str, tuple[Any, str]],
    read_plans: Mapping[str, frozenset[str]],
    buckets: Mapping[ForwardMode, Sequence[int]],
) -> None:
    """The scenario body (see the module docstring); ``variants`` and ``read_plans`` are the
    matrix's (declared policy, where the model reads)."""
    policy, reads = variants[variant]
    model = HarnessModel(h, read_plans[reads], buckets, name="decode")
    runner = h.guard(
        lambda: DecodeRunner(
            model,
            policy_table(h, dict.fromkeys(buckets, policy)),
            h.platform,
            **{**h.kw, **h.runner_options},
        )
    )
    if runner is None:
        return
    with h.quiet():
        forward, schedule = h.platform.current_stream(), h.platform.new_stream()
    frees: DeferredFrees[int] = DeferredFrees(h.platform, forward_stream=forward)
    h.phase("capture")
    h.guard(runner.capture)

    def reuse(items: Sequence[int]) -> None:
        h.phase("write")
        with h.quiet():
            context = h.platform.stream(schedule)
        with context:
            for through in items:
                h.write("reuse", through)

    for index, size in enumerate(SIZES):
        h.phase("run")
        step = h.begin_step()
        h.guard(functools.partial(runner.run, [0] * size))
        read_done = h.guard(runner.fence.take)
        h.guard(functools.partial(frees.free, [step], read_done, step=step))
        if read_done is not None:
            read_done.discard()  # no barrier: only the deferred free orders the reuse
        h.phase("wait")
        reclaimed = h.guard(lambda: frees.reclaim(schedule))
        reuse(reclaimed or ())
        if (index + 1) % SETTLE_EVERY == 0:
            with h.quiet():
                h.platform.synchronize()  # the coarse point: every forward is done
            reuse(frees.settle())
    with h.quiet():
        h.platform.synchronize()
    reuse(frees.settle())


__all__ = ["SETTLE_EVERY", "SIZES", "deferred_frees"]
