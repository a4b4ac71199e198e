"""EAGLE-family steps on SGLang's trtllm_mha kernel (`warpolicy.conformance.speculative`) on the
CPU through Triton's interpreter: the draft extend's numerics (staged and unstaged) against a
torch reference, the staged plan equal to what the draft extend's own kernel call builds, and
the audit on the simulated platform (staged SAFE with verify's event, the lying stager UNSAFE in
every trial). Skipped without triton or the fetched files, and on a CUDA machine, where
`tests/gpu/test_conformance_spec_cuda.py` runs the same (see `test_interpret.py` for the
interpreter's needs)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from interpret_support import why_interpreter_skips  # noqa: E402

from warpolicy.audit.dynamic import audit_mode  # noqa: E402
from warpolicy.audit.report import SAFE, UNSAFE  # noqa: E402
from warpolicy.conformance import loader  # noqa: E402
from warpolicy.conformance.paged import (  # noqa: E402
    VERIFY,
    PagedConfig,
    PagedState,
    reference_step,
)
from warpolicy.conformance.speculative import (  # noqa: E402
    PLAN,
    SWA_OUT,
    SpeculativeStep,
    draft_decode_batch,
    step_subject,
)
from warpolicy.registry.vocabulary import IN_GRAPH, ForwardMode  # noqa: E402
from warpolicy.testing import sim_platform  # noqa: E402

WHY = why_interpreter_skips("tests/gpu/test_conformance_spec_cuda.py")
pytestmark = pytest.mark.skipif(bool(WHY), reason=WHY)
DRAFT_EXTEND = ForwardMode.DRAFT_EXTEND

SMALL = PagedConfig(
    requests=4,
    context=256,
    page_table_width=8,
    layers=2,
    decode_buckets=(1, 2),
    verify_batches=(1, 2),
    dtype=torch.float32,
)


@pytest.fixture(scope="module")
def kernels():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return loader.load_kernels()


@pytest.mark.parametrize("staged", [False, True], ids=["unstaged", "staged"])
def test_the_draft_extend_equals_the_torch_reference(kernels, staged):
    step = SpeculativeStep(sim_platform(), staged=staged, config=SMALL, kernels=kernels)
    adapter = step.extend
    batch = step.target.make_batch(VERIFY, 1)
    bucket = adapter.bucket_for(batch.size)
    want, _ = reference_step(step.draft, batch, VERIFY, step.draft.snapshot())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adapter.prepare_bucket(bucket)
        if staged:  # what the stager does during verify's per-batch action
            adapter.stage(batch, plan=True, swa_out=True)
        adapter.host_prep(batch, bucket)
        adapter.graph_prep(bucket)
        got = adapter.forward(bucket)[: batch.size]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert adapter.staged == ({PLAN, SWA_OUT} if staged else set())


def test_the_draft_decode_batch_is_the_first_draft_token():
    state = PagedState(SMALL)
    batch = state.make_batch(VERIFY, 1)
    first = draft_decode_batch(batch)
    q = batch.queries
    assert first.queries == 1 and first.size == batch.requests
    assert first.out_cache_loc.tolist() == batch.out_cache_loc[::q].tolist()
    assert first.seq_lens.tolist() == (batch.seq_lens + 1).tolist()


def audit(**kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return audit_mode(
            step_subject(sim_platform(), config=SMALL, **kw), DRAFT_EXTEND, 2, static=False
        )


def test_the_staged_step_is_safe_with_verifys_event(kernels):
    entry = audit(staged=True, kernels=kernels)
    assert entry.dynamic.verdict == SAFE and entry.policy is IN_GRAPH


def test_the_lying_stager_is_unsafe_in_every_trial(kernels):
    entry = audit(lying=True, kernels=kernels)
    assert entry.dynamic.verdict == UNSAFE
    assert entry.dynamic.corrupted == entry.dynamic.trials == 2
