"""EAGLE-family speculative steps on SGLang's trtllm_mha metadata kernel, on the GPU (issue 28
item 3): the proof behind the packaged declaration of trtllm_mha's ``draft_extend: in_graph``
(derived placement).

`warpolicy.conformance.speculative`: draft decode -> target verify -> draft extend
(DRAFT_EXTEND_V2, ``Q_MODE_STRIDED``), every forward's metadata built by
``update_trtllm_mha_graph_metadata`` (sglang 0.5.23). Proves, for EAGLE, EAGLE3 and
FROZEN_KV_MTP: the unstaged step (release at the draft extend, its node derived after SGLang's
kernel) is SAFE and publishes ``in_graph``; the staged step (multi-layer EAGLE: the same kernel
run for the draft extend during verify's per-batch action) is SAFE with verify's in-graph
event; the lying stager (SWA write slots left out) is UNSAFE in every trial. Also: the draft
extend's numerics (staged and unstaged) equal a torch reference. Run::

    PYTHONPATH=. python -m pytest -m cuda -q -s tests/gpu/test_conformance_spec_cuda.py

(or the same audit from the CLI: ``warpolicy audit --factory
warpolicy.conformance.speculative:steps``).
"""

from __future__ import annotations

import pytest
from gpu_support import NEEDS_BINDINGS, NEEDS_CUDA, NEEDS_SGLANG, NEEDS_TRITON

pytestmark = [*NEEDS_CUDA, NEEDS_SGLANG, NEEDS_TRITON, NEEDS_BINDINGS]

from warpolicy.audit.dynamic import audit_mode  # noqa: E402
from warpolicy.audit.report import SAFE, UNSAFE  # noqa: E402
from warpolicy.conformance.loader import load_kernels  # noqa: E402
from warpolicy.conformance.paged import VERIFY, reference_step  # noqa: E402
from warpolicy.conformance.speculative import SPECS, SpeculativeStep, step_subject  # noqa: E402
from warpolicy.registry.vocabulary import IN_GRAPH, ForwardMode  # noqa: E402
from warpolicy.runtime.manager import new_plugin_manager, open_platform  # noqa: E402

DRAFT_EXTEND = ForwardMode.DRAFT_EXTEND
TRIALS = 20


@pytest.fixture(scope="module")
def platform():
    return open_platform(new_plugin_manager(load_entry_points=False, environ={}), "cuda")


@pytest.fixture(scope="module")
def kernels():
    return load_kernels()


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("staged", [False, True], ids=["unstaged", "staged"])
def test_the_step_is_safe_and_publishes_in_graph(platform, kernels, spec, staged):
    entry = audit_mode(
        step_subject(platform, spec, staged=staged, kernels=kernels), DRAFT_EXTEND, TRIALS
    )
    d = entry.dynamic
    print(
        f"\n[conformance spec cuda] {entry.backend}: {entry.verdict.value} (dynamic "
        f"{d.verdict.value} {d.corrupted}/{d.trials}, static {entry.static.summary()}, "
        f"published {entry.policy.label if entry.policy is not None else 'nothing'})"
    )
    assert entry.policy is IN_GRAPH
    assert d.verdict == SAFE and d.corrupted == 0 and d.trials == TRIALS


def test_the_lying_stager_is_unsafe_in_every_trial(platform, kernels):
    entry = audit_mode(
        step_subject(platform, "eagle", lying=True, kernels=kernels), DRAFT_EXTEND, TRIALS
    )
    d = entry.dynamic
    print(
        f"\n[conformance spec cuda] {entry.backend}: {entry.verdict.value} "
        f"(dynamic {d.corrupted}/{d.trials}, static {entry.static.summary()})"
    )
    assert entry.verdict == UNSAFE and d.corrupted == d.trials == TRIALS


@pytest.mark.parametrize("staged", [False, True], ids=["unstaged", "staged"])
def test_the_draft_extend_equals_a_torch_reference(platform, kernels, staged):
    step = SpeculativeStep(platform, staged=staged, kernels=kernels)
    spec_step = step.step()
    spec_step.capture()
    draft = step.draft
    worst = 0.0
    for trial in range(6):
        batch = step.target.make_batch(VERIFY, trial)
        before = draft.snapshot()
        outs = spec_step.run(batch)
        taken = spec_step.fence.take()
        platform.synchronize()
        if taken is not None:
            taken.discard()
        # the draft decode wrote its token's KV first: the reference starts from after it
        expected, _ = reference_step(draft, batch, VERIFY, before)
        got = outs[2][: batch.size].float()
        worst = max(worst, float((got - expected.float()).abs().max()))
    print(f"\n[conformance spec cuda] draft extend staged={staged}: max |diff| {worst:.3g}")
    assert worst < 0.1
