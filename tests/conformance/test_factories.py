"""The SGLang-shaped state, batches and audit factories, without running a kernel (CPU, no
triton): what the adapters and the GPU test rely on."""

from __future__ import annotations

import attrs
import pytest
import torch

from warpolicy import environment
from warpolicy.cli.main import main
from warpolicy.conformance.adapters import MUTANTS, make_adapter
from warpolicy.conformance.factories import SPECS, default_engine
from warpolicy.conformance.loader import KernelsUnavailable
from warpolicy.conformance.paged import DECODE, VERIFY, PagedConfig, PagedState
from warpolicy.registry.decision import Context
from warpolicy.registry.vocabulary import IN_GRAPH, NONE, Placement
from warpolicy.testing import sim_platform

SMALL = PagedConfig(requests=4, context=256, decode_buckets=(1, 2, 4), verify_batches=(1, 2))


@pytest.fixture(scope="module")
def state():
    return PagedState(SMALL)


class TestState:
    def test_sglang_shapes_and_dtypes(self, state):
        cfg = state.cfg
        assert state.req_to_token.dtype == torch.int32
        assert tuple(state.req_to_token.shape) == (cfg.requests + 1, 2048 * 64)
        assert state.full_to_swa.dtype == torch.int64
        assert state.full_to_swa.numel() == state.slots + 64 + 1
        assert int(state.full_to_swa[-1]) == -1  # SGLang's sentinel
        assert set(state.shared_buffers) == {"req_to_token", "full_to_swa"}
        assert [cfg.is_swa_layer(i) for i in range(4)] == [True, False, True, False]

    def test_rows_hold_whole_pages_and_page_zero_is_the_sink(self, state):
        cfg = state.cfg
        rows = state.req_to_token[1:, : cfg.context].long()
        assert torch.equal(rows % 64, torch.arange(cfg.context).remainder(64).expand_as(rows))
        assert int(rows.min()) >= 64 and not bool(state.req_to_token[0].any())
        assert int(state.req_to_token.max()) % 64 == 63  # the largest slot ends a page
        assert rows.unique().numel() == rows.numel()  # no slot shared between requests

    def test_the_swa_mapping_maps_whole_pages(self, state):
        full = state.req_to_token[1:, : state.cfg.context].reshape(-1).long()
        swa = state.full_to_swa[full]
        assert torch.equal(swa % 64, full % 64) and int(swa.min()) >= 64
        assert swa.unique().numel() == swa.numel()

    @pytest.mark.parametrize("mode", [DECODE, VERIFY], ids=["decode", "verify"])
    def test_batches_cover_every_bucket_and_point_at_the_new_tokens(self, state, mode):
        cfg, q = state.cfg, state.cfg.queries(mode)
        buckets = cfg.buckets(mode)
        hit = set()
        for trial in range(2 * len(buckets)):
            batch, again = state.make_batch(mode, trial), state.make_batch(mode, trial)
            for field in ("req_pool_indices", "seq_lens", "out_cache_loc", "input_ids"):
                assert torch.equal(getattr(batch, field), getattr(again, field))  # deterministic
            hit.add(min(b for b in buckets if b >= batch.size))
            assert batch.size == batch.requests * q and batch.queries == q
            assert batch.req_pool_indices.unique().numel() == batch.requests
            for i in range(batch.requests):
                row, length = int(batch.req_pool_indices[i]), int(batch.seq_lens[i])
                cols = [length + d for d in range(q)] if mode == VERIFY else [length - 1]
                assert max(cols) < cfg.context
                want = state.req_to_token[row, cols].long().tolist()
                assert batch.out_cache_loc[i * q : (i + 1) * q].tolist() == want
        assert hit == set(buckets)

    def test_config_is_checked(self):
        with pytest.raises(ValueError, match="multiple of 64"):
            PagedConfig(context=100)
        with pytest.raises(ValueError, match="more requests"):
            PagedConfig(requests=2)
        assert PagedConfig().buckets(VERIFY) == (4, 8, 16)


class TestAdapters:
    def test_unknown_mutants_are_refused(self, state):
        with pytest.raises(ValueError, match="known: second_metadata, swa_gather"):
            make_adapter("triton", state, None, DECODE, mutant="late_page_table")
        with pytest.raises(ValueError, match="unknown backend"):
            make_adapter("fa3", state, None, DECODE)
        no_swa = PagedState(attrs.evolve(SMALL, swa_window=0))
        assert "full_to_swa" not in no_swa.shared_buffers
        with pytest.raises(ValueError, match="sliding-window"):
            make_adapter("trtllm_mha", no_swa, None, DECODE, mutant="swa_gather")

    def test_buckets_and_batch_sizes(self, state):
        verify = make_adapter("trtllm_mha", state, None, VERIFY)
        assert verify.bucket_sizes(VERIFY) == (4, 8) and verify.bucket_sizes(DECODE) == ()
        assert verify.batch_size(state.make_batch(VERIFY, 1)) == 8
        assert set(MUTANTS) == {"triton", "trtllm_mha"}


class TestFactories:
    @pytest.mark.parametrize("backend", ["triton", "trtllm_mha"])
    def test_the_default_registry_declares_in_graph_with_the_marker(self, backend):
        engine = default_engine()
        for mode, spec in SPECS.items():
            assert engine.decide(Context(backend, mode, spec)) is IN_GRAPH
            assert engine.placement(backend, mode) is Placement.MARKER
        # target verify publishes only under an algorithm that declares it
        assert engine.decide(Context(backend, VERIFY, "none")) is NONE

    def test_without_cuda_or_the_interpreter_one_line(self, monkeypatch, capsys):
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        from warpolicy.conformance import factories

        def never(*_args):  # a kernel loaded compiled here would stay compiled in the process
            raise AssertionError("kernels loaded before the platform was checked")

        monkeypatch.setattr(factories, "load_kernels", never)
        for factory in (factories.declared, factories.derived, factories.mutants):
            with pytest.raises(KernelsUnavailable, match="TRITON_INTERPRET=1"):
                factory(sim_platform())
        code = main(
            ["audit", "--factory", "warpolicy.conformance.factories:declared", "--device", "fake"]
        )
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and "need a CUDA device" in err

    def test_absent_files_name_the_script(self, monkeypatch, tmp_path, capsys):
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        monkeypatch.setenv(environment.SGLANG_DIR.name, str(tmp_path))
        code = main(
            ["audit", "--factory", "warpolicy.conformance.factories:mutants", "--device", "fake"]
        )
        err = capsys.readouterr().err.strip()
        assert code == 2 and "scripts/fetch-sglang-kernels" in err and len(err.splitlines()) == 1
