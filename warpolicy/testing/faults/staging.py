"""The fault matrix's staging scenario: a real `warpolicy.runtime.runners.staging.Stager` in a
speculative step, every call of its copies a fault target (``stager_copy``).

``spec_stager``: `SpecStep` target verify -> draft extend under the default registry's
trtllm_mha + EAGLE (verify ``in_graph`` only after ``draft_extend_staged``; the draft extend
undeclared, so coarse, for batches that are not staged). The `Stager` is registered
on the harness's plugin manager and performs ``draft_extend_staged`` itself: each of its
`HarnessCopy` reads logs a read of the shared state (before verify's release when staged, in the
draft extend's host prep when the draft extend copies late). The draft extend's own graph reads
only the staged copies (its model reads nothing shared).

Variants: ``staged`` (every read the draft extend makes is staged) and ``lying`` (the positive
control's shape: the stager copies one read fewer, which the draft extend's graph then reads
live; `warpolicy.testing.faults.controls`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.runners import DraftExtendRunner, Phase, SpecStep, VerifyRunner
from warpolicy.runtime.runners.staging import Stager
from warpolicy.testing.faults.harness import Harness
from warpolicy.testing.faults.model import READ_PLANS, BatchPolicyTable, HarnessModel

#: The staging copies: every call is a fault target (raising modes: a copy returns nothing).
STAGING_TARGETS = ("stager_copy",)
#: What the draft extend reads of shared state: staged by the honest stager.
STAGED_READS = ("table", "seq_lens")


class HarnessCopy:
    """A `StagedRead` of the harness: its copy logs a read of shared state, on the current
    stream, through the ``stager_copy`` fault target."""

    def __init__(self, harness: Harness, name: str) -> None:
        self.harness = harness
        self.name = name
        self.nbytes = 8

    @property
    def sources(self) -> Mapping[str, Any]:
        return {self.name: None}

    def copy(self, batch: Any) -> None:
        h = self.harness
        h.injector.call("stager_copy", lambda: h.read(f"draft_extend.stage.{self.name}"))


@functools.cache
def trtllm_eagle_compiled() -> Any:
    """The default registry's trtllm_mha + EAGLE: verify ``in_graph`` only after
    ``draft_extend_staged``, the draft extend undeclared (none)."""
    return PolicyEngine.load(environ={}).compile("trtllm_mha", "eagle", strict=True)


def spec_stager_scenario(
    h: Harness, variant: str, overlap: Any, buckets: Any, steps: Any, draft_tokens: int
) -> Stager:
    """Build and step the staged SpecStep (see the module doc); ``overlap`` is the matrix's
    overlap-loop driver. Returns the stager (its counts say what it did)."""
    lying = variant == "lying"
    draft_model = HarnessModel(
        h,
        READ_PLANS["prep"] if lying else frozenset(),  # the read the liar leaves out, live
        buckets,
        name="draft_extend",
    )
    verify_model = HarnessModel(h, READ_PLANS["prep"], buckets, name="target_verify")
    reads = [HarnessCopy(h, n) for n in (STAGED_READS[:-1] if lying else STAGED_READS)]
    stager = Stager(reads, name="stager")
    # the harness's plugin manager lives for the process: the stager only for this case
    h.pm.register(stager, name="stager")
    try:
        _step(h, stager, verify_model, draft_model, overlap, steps, draft_tokens)
    finally:
        h.pm.unregister(stager)
    return stager


def _step(
    h: Harness,
    stager: Stager,
    verify_model: Any,
    draft_model: Any,
    overlap: Any,
    steps: Any,
    draft_tokens: int,
) -> None:
    policy = BatchPolicyTable(h, compiled=trtllm_eagle_compiled())
    kw = {**h.kw, **h.runner_options}
    runners = h.guard(
        lambda: (
            VerifyRunner(verify_model, policy, h.platform, draft_tokens=draft_tokens, **kw),
            DraftExtendRunner(stager.consumer(draft_model), policy, h.platform, **kw),
        )
    )
    if runners is None:
        return
    step = h.guard(
        lambda: SpecStep([Phase(r) for r in runners], last_reader=ForwardMode.DRAFT_EXTEND, **h.kw)
    )
    if step is not None:
        overlap(h, step, steps)


__all__ = [
    "STAGED_READS",
    "STAGING_TARGETS",
    "HarnessCopy",
    "spec_stager_scenario",
    "trtllm_eagle_compiled",
]
