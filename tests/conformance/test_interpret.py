"""SGLang's real kernels on the CPU through Triton's interpreter (``TRITON_INTERPRET=1``):
the adapters' calls (argument order, dtypes, grids, constexprs) against a torch reference, and
the audit on the simulated platform over the real metadata kernel.

Skipped when triton or the fetched files are missing (CI has neither: the project does not
depend on triton), and on a CUDA machine, where `tests/gpu/test_conformance_cuda.py` runs the
same on the GPU. Triton 3.6's interpreter turns one-element loads into Python ints through
numpy, which numpy 2 refuses, and it has no bfloat16 arithmetic: these tests need numpy < 2
and run the model in float32.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from interpret_support import why_interpreter_skips  # noqa: E402

from warpolicy.audit.dynamic import audit_mode  # noqa: E402
from warpolicy.audit.poison import plus_one  # noqa: E402
from warpolicy.audit.report import Verdict  # noqa: E402
from warpolicy.conformance import loader  # noqa: E402
from warpolicy.conformance.adapters import make_adapter  # noqa: E402
from warpolicy.conformance.factories import subject  # noqa: E402
from warpolicy.conformance.paged import (  # noqa: E402
    DECODE,
    VERIFY,
    PagedConfig,
    PagedState,
    reference_step,
)
from warpolicy.testing import sim_platform  # noqa: E402

WHY = why_interpreter_skips("tests/gpu/test_conformance_cuda.py")
pytestmark = pytest.mark.skipif(bool(WHY), reason=WHY)

SMALL = PagedConfig(
    requests=4,
    context=256,
    layers=2,
    decode_buckets=(1, 2),
    verify_batches=(1, 2),
    dtype=torch.float32,
)


@pytest.fixture(scope="module")
def kernels():
    """The kernels, interpreted (``TRITON_INTERPRET=1`` is set by this directory's conftest
    before triton is imported)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return loader.load_kernels()


def run_eagerly(adapter, batch):
    bucket = min(b for b in adapter.bucket_sizes(adapter.mode) if b >= batch.size)
    adapter.prepare_bucket(bucket)
    adapter.host_prep(batch, bucket)
    adapter.graph_prep(bucket)
    return adapter.forward(bucket)[: batch.size], adapter.static[bucket]


@pytest.mark.parametrize("backend", ["trtllm_mha", "triton"])
@pytest.mark.parametrize("mode", [DECODE, VERIFY], ids=["decode", "verify"])
def test_numerics_equal_the_torch_reference(kernels, backend, mode):
    state = PagedState(SMALL)
    adapter = make_adapter(backend, state, kernels, mode)
    for trial in range(
        2 if backend == "trtllm_mha" else 1
    ):  # the interpreted decode kernel is slow
        batch = state.make_batch(mode, trial)
        want, pools = reference_step(state, batch, mode, state.snapshot())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got, _ = run_eagerly(adapter, batch)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for name, pool in pools.items():  # slots past the sink page: padding writes slot 0
            torch.testing.assert_close(state.kv_pools[name][64:], pool[64:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", [DECODE, VERIFY], ids=["decode", "verify"])
def test_trtllm_metadata_is_exactly_what_sglang_computes(kernels, mode):
    state = PagedState(SMALL)
    adapter = make_adapter("trtllm_mha", state, kernels, mode)
    batch = state.make_batch(mode, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, s = run_eagerly(adapter, batch)
    n, offset = batch.requests, batch.queries if mode == VERIFY else 0
    lens = batch.seq_lens + offset
    assert s.cache_seqlens[:n].tolist() == lens.tolist()
    assert s.cu_seqlens_k[1 : n + 1].tolist() == torch.cumsum(lens, 0).tolist()
    for i in range(n):
        row, pages = int(batch.req_pool_indices[i]), -(-int(lens[i]) // 64)
        starts = state.req_to_token[row, : pages * 64 : 64].long()
        assert s.page_table[i, :pages].tolist() == (starts // 64).tolist()
        assert s.swa_page_table[i, :pages].tolist() == (state.full_to_swa[starts] // 64).tolist()
    want_loc = state.full_to_swa[batch.out_cache_loc]
    assert s.swa_out_cache_loc[: batch.size].tolist() == want_loc.tolist()


def audit(**kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        entry_subject = subject(
            "trtllm_mha", DECODE, sim_platform(), config=SMALL, self_check="off", **kw
        )
        return audit_mode(entry_subject, DECODE, trials=2)


def test_audit_on_the_simulated_platform(kernels):
    assert audit(kernels=kernels).verdict is Verdict.SAFE
    for mutant in ("second_metadata", "swa_gather", "late_page_table"):
        entry = audit(kernels=kernels, mutant=mutant)
        assert entry.verdict is Verdict.UNSAFE, (mutant, entry.dynamic)
        assert entry.dynamic.corrupted == 2


def test_the_old_poison_misses_sglangs_late_page_table_rebuild(kernels):
    old = {"req_to_token": plus_one, "full_to_swa": plus_one}
    missed = audit(kernels=kernels, mutant="late_page_table", poison=old)
    assert missed.verdict is Verdict.SAFE and missed.dynamic.corrupted == 0  # 0.2: 0/30
    caught = audit(kernels=kernels, mutant="late_page_table")
    assert dict(caught.dynamic.caught)["half_turn"] == 2
