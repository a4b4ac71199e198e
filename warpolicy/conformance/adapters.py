"""ModelAdapters that run SGLang's real kernels the way SGLang's own backends call them.

Both adapters serve the `warpolicy.conformance.paged` model (decode, or target verify with the
draft tokens as queries) over an SGLang-shaped `PagedState`; the runner calls ``host_prep``
(out of the graph, before replay), then replays ``graph_prep -> marker -> forward``.

**triton** (sglang 0.5.10.post1, ``layers/attention/triton_backend.py``). Everything that
reads the scheduler's tables runs *before replay*, as ``init_forward_metadata_replay_cuda_graph``
does: ``kv_indptr[1:bs+1] = cumsum(seq_lens)``, then ``create_flashinfer_kv_indices_triton[(bs,)]
(req_to_token, req_pool_indices, seq_lens, kv_indptr, None, kv_indices,
req_to_token.stride(0))`` into backend-owned buffers; for the sliding-window layers
``update_sliding_window_buffer_cuda_graph``'s shape (window lengths ``min(seq_lens, 128)``,
start ``seq_lens - window``, the same kernel with ``kv_start_idx``, then the full-to-SWA
translation), and the SWA write slots translated once (the fix of sglang #32460; 0.5.10 itself
translates per layer, which is the ``swa_gather`` mutant). The graph reads only those buffers:
``decode_attention_fwd(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse,
num_kv_splits, max_kv_splits, sm_scale, k_scale, v_scale)`` per layer (the grouped kernel: 8 q
heads over 2 KV heads), with ``num_kv_splits`` static (``SGLANG_TRITON_DECODE_ATTN_STATIC_KV_
SPLITS``). Target verify has no decode kernel in 0.5.10 (it runs ``extend_attention_fwd``);
here each draft token is one decode row over ``seq_len + d + 1`` tokens (request rows repeated
per draft token), which is the same kv-indices kernel and the same decode kernel.

**trtllm_mha** (sglang 0.5.23, ``layers/attention/trtllm_mha_backend.py``). The **in-graph**
metadata prep is ``_apply_cuda_graph_metadata``'s one call::

    update_trtllm_mha_graph_metadata(req_pool_indices=, seq_lens=, req_to_token=,
        cache_seqlens=, cu_seqlens_k=, page_table=, bs=, seqlen_offset=0 | draft tokens,
        max_seq_pages=2048, page_size=64, swa_mapping=full_to_swa, swa_page_table=,
        out_cache_loc=, swa_out_cache_loc=, cu_seqlens_q=None, qlens=None, q_stride=0,
        q_mode=Q_MODE_NONE, skip_page_table=False)

over the graph's static inputs (int64 ``req_pool_indices`` / ``seq_lens`` / ``out_cache_loc``
copied before replay) into per-bucket int32 ``cache_seqlens`` / ``cu_seqlens_k`` /
``[bs, 2048]`` page tables and the int64 SWA write slots. TRT-LLM's attention kernel is
flashinfer's and not loaded here: the forward attends in torch through the page table the
kernel built (full layers through ``page_table``, sliding-window layers through
``swa_page_table`` over the last 128 tokens) and writes K/V at ``out_cache_loc`` (full) or
the kernel's ``swa_out_cache_loc`` (SWA), as ``_get_layer_cache_loc`` does.

**Mutants** (``mutant=``): late readers of the shared tables after the marker, each a real
shape: ``second_metadata`` (the metadata kernel launched again at the start of the forward:
``update_trtllm_mha_graph_metadata`` / ``create_flashinfer_kv_indices_triton``),
``swa_gather`` (each sliding-window layer translates through the *live* ``full_to_swa``:
0.5.10's ``SWAKVPool.set_kv_buffer``, sglang #32460), ``late_page_table`` (trtllm_mha:
``build_trtllm_mha_page_table`` rebuilds the page tables from the live ``req_to_token`` after
the first layer, a DP-padding rebuild). Negative slots a late reader may compute from a poisoned
``-1`` sentinel go to the sink slot 0, so a poisoned step never indexes out of range.

Shared buffers: ``req_to_token`` and ``full_to_swa`` (what SGLang's scheduler writes on its own
stream). The graph's static inputs are written on the forward stream before replay, as SGLang's
``replay_prepare`` does, so they are not shared. Everything the step writes (the KV pools) is in
`extra_outputs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from warpolicy.conformance.loader import SGLangKernels
from warpolicy.conformance.paged import VERIFY, PagedBatch, PagedConfig, PagedState
from warpolicy.registry.vocabulary import ForwardMode

#: Backends and their mutants.
MUTANTS = {
    "triton": ("second_metadata", "swa_gather"),
    "trtllm_mha": ("second_metadata", "swa_gather", "late_page_table"),
}


class _Inputs:
    """A bucket's static inputs (SGLang's graph-runner buffers, sliced to the bucket) and
    output."""

    def __init__(self, bs: int, tokens: int, cfg: PagedConfig, device: torch.device) -> None:
        z = lambda n: torch.zeros(n, dtype=torch.int64, device=device)  # noqa: E731
        self.bs, self.tokens = bs, tokens
        self.req_pool_indices = z(bs)
        self.seq_lens = torch.ones(bs, dtype=torch.int64, device=device)  # fill value 1
        self.out_cache_loc = z(tokens)
        self.input_ids = z(tokens)
        self.out = torch.zeros(tokens, cfg.hidden, device=device, dtype=cfg.dtype)
        # each token's request (verify: bs * q tokens, q per request); a constant
        self.row_of = torch.arange(bs, device=device).repeat_interleave(tokens // bs)


class SGLangAdapter:
    """What both backends share: buckets, static inputs, the layer loop, batches."""

    backend = ""

    def __init__(
        self,
        state: PagedState,
        kernels: SGLangKernels,
        mode: ForwardMode,
        *,
        mutant: str | None = None,
    ) -> None:
        if mutant is not None and mutant not in MUTANTS[self.backend]:
            raise ValueError(
                f"{self.backend}: unknown mutant {mutant!r}; known: "
                f"{', '.join(MUTANTS[self.backend])}"
            )
        if state.cfg.swa_window == 0 and mutant == "swa_gather":
            raise ValueError("the swa_gather mutant needs sliding-window layers")
        self.state = state
        self.cfg = state.cfg
        self.kernels = kernels
        self.mode = ForwardMode.parse(mode)
        self.verify = self.mode == VERIFY
        self.queries = self.cfg.queries(self.mode)
        self.mutant = mutant
        self.device = state.device
        self.shared_buffers = state.shared_buffers
        self.static: dict[int, Any] = {}

    # -- ModelAdapter ------------------------------------------------------------------------

    def bucket_sizes(self, mode: ForwardMode) -> Sequence[int]:
        return self.cfg.buckets(mode) if ForwardMode.parse(mode) == self.mode else ()

    def batch_size(self, batch: PagedBatch) -> int:
        return batch.size

    def prepare_bucket(self, bucket: int) -> None:
        if bucket not in self.static:
            if bucket % self.queries:
                raise ValueError(f"bucket {bucket} is not a multiple of {self.queries}")
            self.static[bucket] = self._buffers(bucket // self.queries, bucket)

    def host_prep(self, batch: PagedBatch, bucket: int) -> None:
        """Copy the batch into the bucket's static inputs and pad (SGLang's replay_prepare:
        padded rows point at row 0 with length 1, padded tokens at the sink slot 0)."""
        s = self.static[bucket]
        n, t = batch.requests, batch.size
        s.req_pool_indices[:n].copy_(batch.req_pool_indices)
        s.req_pool_indices[n:].zero_()
        s.seq_lens[:n].copy_(batch.seq_lens)
        s.seq_lens[n:].fill_(1)
        s.out_cache_loc[:t].copy_(batch.out_cache_loc)
        s.out_cache_loc[t:].zero_()
        s.input_ids[:t].copy_(batch.input_ids)
        s.input_ids[t:].zero_()
        self._host_metadata(s)

    def graph_prep(self, bucket: int) -> None:
        self._graph_metadata(self.static[bucket])

    def forward(self, bucket: int) -> torch.Tensor:
        s = self.static[bucket]
        cfg, state = self.cfg, self.state
        if self.mutant == "second_metadata":
            self._second_metadata(s)
        h = state.embed.index_select(0, s.input_ids)
        for layer in range(cfg.layers):
            q = h @ state.wq[layer]
            k = (h @ state.wk[layer]).view(s.tokens, cfg.kv_heads, cfg.head_dim)
            v = (h @ state.wv[layer]).view(s.tokens, cfg.kv_heads, cfg.head_dim)
            swa = cfg.is_swa_layer(layer)
            loc = self._write_loc(s, swa)
            kpool, vpool = state.pools(layer)
            kpool[loc] = k  # set_kv_buffer
            vpool[loc] = v
            attn = self._attention(s, layer, swa, q.view(s.tokens, cfg.q_heads, cfg.head_dim))
            h = h + attn @ state.wo[layer]
            if layer == 0 and self.mutant == "late_page_table":
                self._late_page_table(s)
        s.out.copy_(h)
        return s.out

    def make_batch(self, mode: ForwardMode, trial: int) -> PagedBatch:
        return self.state.make_batch(mode, trial)

    # -- backend parts -----------------------------------------------------------------------

    def _buffers(self, bs: int, tokens: int) -> Any:
        raise NotImplementedError

    def _host_metadata(self, s: Any) -> None:
        """Out-of-graph metadata (before replay); nothing by default."""

    def _graph_metadata(self, s: Any) -> None:
        """In-graph metadata prep (before the marker); nothing by default."""

    def _second_metadata(self, s: Any) -> None:
        raise NotImplementedError

    def _late_page_table(self, s: Any) -> None:
        raise NotImplementedError

    def _write_loc(self, s: Any, swa: bool) -> torch.Tensor:
        raise NotImplementedError

    def _attention(self, s: Any, layer: int, swa: bool, q: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _live_swa_loc(self, s: Any) -> torch.Tensor:
        """The ``swa_gather`` mutant: the write slots translated through the live mapping."""
        assert self.state.full_to_swa is not None
        return self.state.full_to_swa.index_select(0, s.out_cache_loc).clamp(min=0)

    def __repr__(self) -> str:
        extra = f" mutant={self.mutant}" if self.mutant else ""
        return f"<{type(self).__name__} {self.mode.label}{extra}>"


# ---------------------------------------------------------------------------------------------
# triton (0.5.10.post1)
# ---------------------------------------------------------------------------------------------


class _TritonBuffers(_Inputs):
    def __init__(
        self, bs: int, tokens: int, cfg: PagedConfig, device: torch.device, verify: bool
    ) -> None:
        super().__init__(bs, tokens, cfg, device)
        z64 = lambda n: torch.zeros(n, dtype=torch.int64, device=device)  # noqa: E731
        heads, splits, hd = cfg.q_heads, cfg.max_kv_splits, cfg.head_dim
        self.rows_req = z64(tokens)  # request row per decode row (verify: per draft token)
        self.rows_len = z64(tokens)  # tokens each decode row attends to
        # before the first host_prep (the runner's warm-up) every row reads one token at the
        # sink slot 0, a valid padding state
        self.kv_indptr = torch.arange(tokens + 1, dtype=torch.int32, device=device)
        self.kv_indices = z64(tokens * cfg.context)
        self.num_kv_splits = torch.full((tokens,), splits, dtype=torch.int32, device=device)
        self.attn_logits = torch.zeros(tokens, heads, splits, hd, device=device)
        self.attn_lse = torch.zeros(tokens, heads, splits, device=device)
        self.o = torch.zeros(tokens, heads, hd, device=device, dtype=cfg.dtype)
        window = max(cfg.swa_window, 1)
        self.window_indptr = torch.arange(tokens + 1, dtype=torch.int32, device=device)
        self.window_lens = z64(tokens)
        self.window_start = z64(tokens)
        self.window_kv_indices = z64(tokens * window)
        self.window_full = z64(tokens * window)  # swa_gather: untranslated window slots
        self.swa_loc = z64(tokens)
        # verify: draft token d of a request sees seq_len + d + 1 tokens (a constant, so the
        # step itself needs no host sync)
        q = tokens // bs
        self.verify_extra = (
            (torch.arange(q, device=device) + 1).repeat(bs) if verify else z64(tokens)
        )


class TritonAdapter(SGLangAdapter):
    """SGLang 0.5.10's Triton backend (see the module doc): metadata before replay,
    ``decode_attention_fwd`` in the graph."""

    backend = "triton"

    def _buffers(self, bs: int, tokens: int) -> _TritonBuffers:
        return _TritonBuffers(bs, tokens, self.cfg, self.device, self.verify)

    def _host_metadata(self, s: _TritonBuffers) -> None:
        cfg, state = self.cfg, self.state
        table = state.req_to_token
        kernel = self.kernels.create_flashinfer_kv_indices_triton
        # one decode row per token (verify: per draft token, over seq_len + d + 1 tokens)
        torch.index_select(s.req_pool_indices, 0, s.row_of, out=s.rows_req)
        torch.add(s.seq_lens.index_select(0, s.row_of), s.verify_extra, out=s.rows_len)
        rows = s.tokens
        s.kv_indptr[1:].copy_(torch.cumsum(s.rows_len, dim=0))
        kernel[(rows,)](
            table, s.rows_req, s.rows_len, s.kv_indptr, None, s.kv_indices, table.stride(0)
        )
        if not cfg.swa_window:
            return
        assert state.full_to_swa is not None
        torch.clamp(s.rows_len, max=cfg.swa_window, out=s.window_lens)
        s.window_indptr[1:].copy_(torch.cumsum(s.window_lens, dim=0))
        torch.sub(s.rows_len, s.window_lens, out=s.window_start)
        target = s.window_full if self.mutant == "swa_gather" else s.window_kv_indices
        kernel[(rows,)](
            table, s.rows_req, s.window_lens, s.window_indptr, s.window_start, target,
            table.stride(0),
        )  # fmt: skip
        if self.mutant != "swa_gather":
            # translate_loc_from_full_to_swa, over the whole buffer (no host sync for the used
            # length; entries past it stay valid slots and are never read)
            s.window_kv_indices.copy_(state.full_to_swa.index_select(0, s.window_kv_indices))
        s.swa_loc.copy_(state.full_to_swa.index_select(0, s.out_cache_loc))

    def _second_metadata(self, s: _TritonBuffers) -> None:
        table = self.state.req_to_token
        self.kernels.create_flashinfer_kv_indices_triton[(s.tokens,)](
            table, s.rows_req, s.rows_len, s.kv_indptr, None, s.kv_indices, table.stride(0)
        )

    def _write_loc(self, s: _TritonBuffers, swa: bool) -> torch.Tensor:
        if not swa:
            return s.out_cache_loc
        if self.mutant == "swa_gather":
            return self._live_swa_loc(s)
        return s.swa_loc

    def _attention(self, s: _TritonBuffers, layer: int, swa: bool, q: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        if swa:
            if self.mutant == "swa_gather":  # translate the window through the live mapping
                assert self.state.full_to_swa is not None
                torch.index_select(
                    self.state.full_to_swa, 0, s.window_full, out=s.window_kv_indices
                )
                s.window_kv_indices.clamp_(min=0)
            indptr, indices = s.window_indptr, s.window_kv_indices
        else:
            indptr, indices = s.kv_indptr, s.kv_indices
        kpool, vpool = self.state.pools(layer)
        self.kernels.decode_attention_fwd(
            q, kpool, vpool, s.o, indptr, indices, s.attn_logits, s.attn_lse,
            s.num_kv_splits, cfg.max_kv_splits, cfg.head_dim**-0.5, 1.0, 1.0,
        )  # fmt: skip
        return s.o.view(s.tokens, cfg.hidden)


# ---------------------------------------------------------------------------------------------
# trtllm_mha (0.5.23)
# ---------------------------------------------------------------------------------------------


class _TrtllmBuffers(_Inputs):
    def __init__(self, bs: int, tokens: int, cfg: PagedConfig, device: torch.device) -> None:
        super().__init__(bs, tokens, cfg, device)
        width = cfg.page_table_width
        self.cache_seqlens = torch.zeros(bs, dtype=torch.int32, device=device)
        self.cu_seqlens_k = torch.zeros(bs + 1, dtype=torch.int32, device=device)
        self.page_table = torch.zeros(bs, width, dtype=torch.int32, device=device)
        swa = cfg.swa_window > 0
        self.swa_page_table = (
            torch.zeros(bs, width, dtype=torch.int32, device=device) if swa else None
        )
        self.swa_out_cache_loc = (
            torch.zeros(tokens, dtype=torch.int64, device=device) if swa else None
        )
        q = tokens // bs
        # attention helper (a constant): how many tokens past ``cache_seqlens - q`` each query
        # sees (decode: 0; verify draft token d: d + 1)
        self.extra = (torch.arange(q, device=device) + 1 - q).repeat(bs)
        pos = torch.arange(cfg.context, device=device)
        self.pos = pos
        self.page_of, self.offset_of = pos // cfg.page_size, pos % cfg.page_size


class TrtllmMhaAdapter(SGLangAdapter):
    """SGLang 0.5.23's trtllm_mha backend (see the module doc): the fused metadata kernel in
    the graph, attention through the page tables it builds."""

    backend = "trtllm_mha"

    def _buffers(self, bs: int, tokens: int) -> _TrtllmBuffers:
        return _TrtllmBuffers(bs, tokens, self.cfg, self.device)

    def _graph_metadata(self, s: _TrtllmBuffers) -> None:
        cfg = self.cfg
        self.kernels.update_trtllm_mha_graph_metadata(
            req_pool_indices=s.req_pool_indices,
            seq_lens=s.seq_lens,
            req_to_token=self.state.req_to_token,
            cache_seqlens=s.cache_seqlens,
            cu_seqlens_k=s.cu_seqlens_k,
            page_table=s.page_table,
            bs=s.bs,
            seqlen_offset=self.queries if self.verify else 0,
            max_seq_pages=cfg.page_table_width,
            page_size=cfg.page_size,
            swa_mapping=self.state.full_to_swa,
            swa_page_table=s.swa_page_table,
            out_cache_loc=s.out_cache_loc,
            swa_out_cache_loc=s.swa_out_cache_loc,
            cu_seqlens_q=None,
            qlens=None,
            q_stride=0,
            q_mode=self.kernels.q_mode_none,
            skip_page_table=False,
        )

    _second_metadata = _graph_metadata

    def _late_page_table(self, s: _TrtllmBuffers) -> None:
        self.kernels.build_trtllm_mha_page_table(
            req_to_token=self.state.req_to_token,
            req_pool_indices=s.req_pool_indices,
            cache_seqlens=s.cache_seqlens,
            page_table=s.page_table,
            page_size=self.cfg.page_size,
            swa_page_table=s.swa_page_table,
            full_to_swa=self.state.full_to_swa,
        )

    def _write_loc(self, s: _TrtllmBuffers, swa: bool) -> torch.Tensor:
        if not swa:
            return s.out_cache_loc
        if self.mutant == "swa_gather":
            return self._live_swa_loc(s)
        assert s.swa_out_cache_loc is not None
        return s.swa_out_cache_loc.clamp(min=0)

    def _attention(self, s: _TrtllmBuffers, layer: int, swa: bool, q: torch.Tensor) -> torch.Tensor:
        """Paged attention in torch through the kernel's page table (flashinfer's TRT-LLM
        kernel is not loaded): the request's tokens ``[0, len)``, a sliding-window layer's
        ``[len - 128, len)``, with ``len = cache_seqlens - q + d + 1`` per query."""
        cfg = self.cfg
        table = s.swa_page_table if swa else s.page_table
        assert table is not None
        pages = table[:, : cfg.context // cfg.page_size].to(torch.int64).index_select(0, s.row_of)
        slots = (pages[:, s.page_of] * cfg.page_size + s.offset_of).clamp(0, self.state.slots - 1)
        lengths = s.cache_seqlens.to(torch.int64).index_select(0, s.row_of) + s.extra
        valid = s.pos[None, :] < lengths[:, None]
        if swa:
            valid = valid & (s.pos[None, :] >= lengths[:, None] - cfg.swa_window)
        kpool, vpool = self.state.pools(layer)
        keys, values = kpool[slots].float(), vpool[slots].float()  # [tokens, context, kvh, hd]
        groups = cfg.q_heads // cfg.kv_heads
        qg = q.view(s.tokens, cfg.kv_heads, groups, cfg.head_dim).float()
        scores = torch.einsum("tkgd,tskd->tkgs", qg, keys) * cfg.head_dim**-0.5
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
        out = torch.einsum("tkgs,tskd->tkgd", scores.softmax(-1), values)
        return out.reshape(s.tokens, cfg.hidden).to(cfg.dtype)


ADAPTERS: dict[str, type[SGLangAdapter]] = {
    "triton": TritonAdapter,
    "trtllm_mha": TrtllmMhaAdapter,
}


def make_adapter(
    backend: str,
    state: PagedState,
    kernels: SGLangKernels,
    mode: ForwardMode,
    *,
    mutant: str | None = None,
) -> SGLangAdapter:
    """The adapter of ``backend`` (``triton`` or ``trtllm_mha``) for ``mode``."""
    try:
        cls = ADAPTERS[backend]
    except KeyError:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(ADAPTERS)}") from None
    return cls(state, kernels, mode, mutant=mutant)


__all__ = [
    "ADAPTERS",
    "MUTANTS",
    "SGLangAdapter",
    "TritonAdapter",
    "TrtllmMhaAdapter",
    "make_adapter",
]
