"""The Llama-shaped decode (`warpolicy.bench.llama`) on CPU.

Without triton or the fetched kernel files only the refusals run. With them (a developer's
machine: ``pip install triton==3.6.0 'numpy<2'`` and ``scripts/fetch-sglang-kernels``), a tiny
float32 configuration runs SGLang's kernels through Triton's interpreter: the logits equal a
plain-torch reference, the scheduler's writes are what a step reads, and ``bench overlap
--factory`` runs end to end on the simulated platform.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

# Triton reads TRITON_INTERPRET when it is first imported (as tests/conformance/conftest.py says)
if (
    importlib.util.find_spec("triton") is not None
    and "triton" not in sys.modules
    and not torch.cuda.is_available()
):
    os.environ.setdefault("TRITON_INTERPRET", "1")

from warpolicy.bench.llama import LlamaConfig, decode, decode_deep, reference_logits, subject
from warpolicy.conformance.wheels import absent_reason
from warpolicy.errors import CudaUnavailableError
from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.testing import sim_platform

TINY = LlamaConfig(
    layers=2,
    q_heads=4,
    kv_heads=2,
    head_dim=32,
    intermediate=64,
    vocab=48,
    batch=2,
    context=64,
    requests=4,
    max_kv_splits=2,
    schedules=3,
    dtype=torch.float32,
)


def interpreted() -> None:
    """Skip unless SGLang's kernels can run here through Triton's interpreter."""
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the GPU tests run the kernels")
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (pip install triton==3.6.0 'numpy<2')")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton was imported before TRITON_INTERPRET could be set")
    reason = absent_reason()
    if reason is not None:
        pytest.skip(reason)


class TestRefusals:
    @pytest.mark.parametrize("factory", [decode, decode_deep])
    def test_the_full_size_presets_need_cuda(self, factory):
        with pytest.raises(CudaUnavailableError, match="full-size model for a CUDA device"):
            factory(sim_platform())

    def test_without_the_interpreter_a_cpu_platform_is_refused(self, monkeypatch):
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        with pytest.raises(CudaUnavailableError, match="TRITON_INTERPRET=1"):
            subject(sim_platform(), TINY)

    def test_a_config_is_checked(self):
        with pytest.raises(ValueError, match="multiple of kv_heads"):
            LlamaConfig(q_heads=6, kv_heads=4)
        with pytest.raises(ValueError, match="more requests"):
            LlamaConfig(batch=8, requests=4)
        with pytest.raises(ValueError, match="layers must be positive"):
            LlamaConfig(layers=0)


# Triton 3.6's interpreter converts one-element numpy arrays to ints (deprecated in numpy 1.25),
# and numpy warns where the decode kernel's empty KV splits compute -inf - -inf (masked after)
@pytest.mark.filterwarnings(
    "ignore::DeprecationWarning",
    "ignore:invalid value encountered:RuntimeWarning",
    "ignore:divide by zero encountered:RuntimeWarning",
    "ignore:overflow encountered:RuntimeWarning",
)
class TestInterpreted:
    def test_logits_equal_a_torch_reference_and_the_step_reads_the_scheduler_s_rows(self):
        interpreted()
        s = subject(sim_platform(), TINY)
        model = s.model
        for step in range(3):
            batch = s.make_batch(ForwardMode.DECODE, step)
            rows = batch[:, 0]
            # the scheduler's write: the new token's position points at the step's own slot
            lens = batch[:, 1]
            new = model.req_to_token[rows, lens - 1]
            assert new.tolist() == [TINY.new_base + i for i in range(TINY.batch)]
            expected = reference_logits(model, batch)
            model.prepare_bucket(TINY.batch)
            model.host_prep(batch, TINY.batch)
            model.graph_prep(TINY.batch)
            logits = model.forward(TINY.batch)
            torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
            bucket = model.static[TINY.batch]
            assert bucket.kv_indptr.tolist() == [0, *torch.cumsum(lens, 0).tolist()]

    def test_bench_overlap_factory_runs_end_to_end_on_the_simulated_platform(self, monkeypatch):
        interpreted()
        from warpolicy.bench import llama
        from warpolicy.bench.overlap_factory import run_factory_overlap

        monkeypatch.setattr(llama, "decode", lambda platform: subject(platform, TINY))
        result = run_factory_overlap(
            "warpolicy.bench.llama:decode", device="sim", steps=3, repeats=1
        )
        (one,) = result["subjects"]
        rows = {r["name"]: r for r in one["rows"]}
        assert one["writes_shared"] and one["mode"] == "decode"
        assert all(r["corrupted"] == 0 for r in rows.values())
        assert rows["in_graph"]["resolved"] == "in_graph"
