"""SGLang-shaped scheduler state for the conformance adapters, and a torch reference step.

`PagedState` holds what SGLang's scheduler shares with the forward, shaped as SGLang allocates
it (``memory_pool.ReqToTokenPool``, ``allocator/swa.py``):

* ``req_to_token``: int32 ``[requests + 1, page_table_width * page_size]`` (row 0 is the padding
  row a padded CUDA-graph batch points at); each request row holds whole pages of KV slots,
  ``slot = page * 64 + offset``, pages shuffled over the pool, page 0 never allocated (the sink
  padded tokens write to);
* ``full_to_swa``: int64 ``[slots + page_size + 1]``, the full-to-sliding-window slot mapping
  with its trailing ``-1`` sentinel; page-aligned (a full page maps to a whole SWA page);

and what the step writes: one K and one V pool per layer (``k0``, ``v0``, ...), sliding-window
layers (the even ones, window 128) in the SWA pool, full layers in the full pool. The model is a
small decoder: an embedding, then per layer q/k/v projections, the KV write at the token's slot,
attention over the request's tokens (a sliding-window layer over the last 128) and an output
projection with a residual; what differs between the backends is only how the metadata is built
and which attention kernel runs (`warpolicy.conformance.adapters`).

`PagedBatch` is what SGLang's scheduler hands the graph runner: request rows, sequence lengths
(decode: including the new token; target verify: the prefix, the draft tokens following at
``seq_len + d``), the new tokens' slots (``out_cache_loc``) and their input ids.

`reference_step` computes a step eagerly in plain torch straight from the tables (no page table,
no kernel of SGLang's): what the numerics tests compare the adapters with.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from warpolicy.registry.vocabulary import ForwardMode

DECODE, VERIFY = ForwardMode.DECODE, ForwardMode.TARGET_VERIFY


def _positive(_instance: object, attribute: attrs.Attribute, value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be positive, got {value}")


@attrs.frozen
class PagedConfig:
    """Shapes of the state and model. The defaults are SGLang's realistic ones where they matter
    to the metadata kernels (page size 64, page-table width 2048, SWA window 128 alternating with
    full layers, verify offset = draft tokens) and small elsewhere."""

    page_size: int = attrs.field(default=64, validator=_positive)
    page_table_width: int = attrs.field(default=2048, validator=_positive)  # max_num_pages
    swa_window: int = 128  # 0: no sliding-window layers
    layers: int = attrs.field(default=4, validator=_positive)
    requests: int = attrs.field(default=8, validator=_positive)
    context: int = attrs.field(default=512, validator=_positive)  # tokens per request row
    q_heads: int = 8
    kv_heads: int = 2
    head_dim: int = 64
    vocab: int = 256
    draft_tokens: int = attrs.field(default=4, validator=_positive)
    decode_buckets: tuple[int, ...] = (1, 2, 4, 8)  # batch sizes
    verify_batches: tuple[int, ...] = (1, 2, 4)  # batch sizes; buckets are bs * draft_tokens
    max_kv_splits: int = 8  # the Triton decode kernel's static split count
    dtype: Any = torch.bfloat16
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        if self.context % self.page_size:
            raise ValueError(f"context {self.context} is not a multiple of {self.page_size}")
        if self.context > self.page_table_width * self.page_size:
            raise ValueError("context is wider than the page table")
        if self.q_heads % self.kv_heads:
            raise ValueError("q_heads must be a multiple of kv_heads")
        if max(self.verify_batches) > self.requests or max(self.decode_buckets) > self.requests:
            raise ValueError("a bucket holds more requests than the table has rows")

    @property
    def hidden(self) -> int:
        return self.q_heads * self.head_dim

    @property
    def max_context_len(self) -> int:
        return self.page_table_width * self.page_size

    def is_swa_layer(self, layer: int) -> bool:
        return self.swa_window > 0 and layer % 2 == 0

    def queries(self, mode: ForwardMode) -> int:
        return self.draft_tokens if ForwardMode.parse(mode) == VERIFY else 1

    def buckets(self, mode: ForwardMode) -> tuple[int, ...]:
        """Capture buckets in runner units: batch sizes (decode), tokens (verify)."""
        mode = ForwardMode.parse(mode)
        if mode == VERIFY:
            return tuple(b * self.draft_tokens for b in self.verify_batches)
        return self.decode_buckets if mode == DECODE else ()


@attrs.frozen(eq=False)  # tensors: identity, not an ambiguous elementwise ==
class PagedBatch:
    """One scheduled batch (device tensors, int64)."""

    req_pool_indices: torch.Tensor  # [n] request rows of req_to_token
    seq_lens: torch.Tensor  # [n] decode: with the new token; verify: the prefix
    out_cache_loc: torch.Tensor  # [n * queries] the new tokens' KV slots
    input_ids: torch.Tensor  # [n * queries]
    queries: int  # 1 (decode) or the draft tokens (verify)
    trial: int = 0

    @property
    def size(self) -> int:
        """The batch in runner units (tokens)."""
        return int(self.out_cache_loc.numel())

    @property
    def requests(self) -> int:
        return int(self.req_pool_indices.numel())


class PagedState:
    """The shared tables, the KV pools and the model's weights (see the module doc)."""

    def __init__(self, config: PagedConfig | None = None, device: Any = "cpu") -> None:
        cfg = self.cfg = config or PagedConfig()
        self.device = torch.device(device)
        g = torch.Generator().manual_seed(cfg.seed)
        page = cfg.page_size
        per_row = cfg.context // page
        used = cfg.requests * per_row
        pool_pages = 1 + used + cfg.requests  # page 0: the sink; a few pages never allocated
        self.slots = pool_pages * page
        full_pages = torch.randperm(pool_pages - 1, generator=g)[:used] + 1
        table = torch.zeros(cfg.requests + 1, cfg.max_context_len, dtype=torch.int32)
        rows = full_pages.view(cfg.requests, per_row, 1) * page + torch.arange(page)
        table[1:, : cfg.context] = rows.view(cfg.requests, cfg.context).to(torch.int32)
        self.req_to_token = table.to(self.device)
        self.shared_buffers: dict[str, torch.Tensor] = {"req_to_token": self.req_to_token}
        self.full_to_swa: torch.Tensor | None = None
        if cfg.swa_window:
            swa_pages = torch.randperm(pool_pages - 1, generator=g)[:used] + 1
            mapping = torch.zeros(self.slots + page + 1, dtype=torch.int64)
            mapping[-1] = -1  # SGLang's sentinel: a last_loc of -1 reads -1
            full = (full_pages[:, None] * page + torch.arange(page)).reshape(-1)
            mapping[full] = (swa_pages[:, None] * page + torch.arange(page)).reshape(-1)
            self.full_to_swa = mapping.to(self.device)
            self.shared_buffers["full_to_swa"] = self.full_to_swa
        kvh, hd, hidden = cfg.kv_heads, cfg.head_dim, cfg.hidden
        self.kv_pools: dict[str, torch.Tensor] = {}
        for layer in range(cfg.layers):
            for kind in ("k", "v"):
                pool = torch.randn(self.slots, kvh, hd, generator=g)
                self.kv_pools[f"{kind}{layer}"] = pool.to(self.device, cfg.dtype)

        def weight(rows: int, cols: int, scale: float) -> torch.Tensor:
            return (torch.randn(rows, cols, generator=g) * scale).to(self.device, cfg.dtype)

        self.embed = weight(cfg.vocab, hidden, 1.0)
        self.wq = [weight(hidden, cfg.q_heads * hd, hidden**-0.5) for _ in range(cfg.layers)]
        self.wk = [weight(hidden, kvh * hd, hidden**-0.5) for _ in range(cfg.layers)]
        self.wv = [weight(hidden, kvh * hd, hidden**-0.5) for _ in range(cfg.layers)]
        self.wo = [weight(hidden, hidden, 0.5 * hidden**-0.5) for _ in range(cfg.layers)]

    def pools(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv_pools[f"k{layer}"], self.kv_pools[f"v{layer}"]

    def snapshot(self) -> dict[str, torch.Tensor]:
        """Clones of the KV pools (what a reference step starts from)."""
        return {name: t.clone() for name, t in self.kv_pools.items()}

    # -- batches -----------------------------------------------------------------------------

    def make_batch(self, mode: ForwardMode, trial: int) -> PagedBatch:
        """A deterministic batch for ``trial``: trial ``t`` fits capture bucket
        ``t mod len(buckets)`` and no smaller one, so consecutive trials replay every bucket.
        Lengths are drawn over the whole context (inside and past the window, page-aligned
        or not); the rows' slots were allocated up front, as SGLang allocates before a step."""
        cfg = self.cfg
        mode = ForwardMode.parse(mode)
        q = cfg.queries(mode)
        sizes = sorted(cfg.verify_batches if mode == VERIFY else cfg.decode_buckets)
        g = torch.Generator().manual_seed(zlib.crc32(f"sglang:{mode.label}:{trial}".encode()))
        k = trial % len(sizes)
        low = sizes[k - 1] if k else 0
        n = int(torch.randint(low + 1, sizes[k] + 1, (1,), generator=g))
        rows = torch.randperm(cfg.requests, generator=g)[:n] + 1
        top = cfg.context - (q if mode == VERIFY else 0)
        lens = torch.randint(1, top + 1, (n,), generator=g)
        # verify: the draft tokens follow the prefix; decode: the new token ends its sequence
        cols = lens[:, None] + torch.arange(q) if mode == VERIFY else (lens - 1)[:, None]
        table = self.req_to_token.cpu()
        loc = table[rows[:, None], cols].reshape(-1).to(torch.int64)
        ids = torch.randint(0, cfg.vocab, (n * q,), generator=g)
        dev = self.device
        return PagedBatch(rows.to(dev), lens.to(dev), loc.to(dev), ids.to(dev), q, trial)


def token_spans(cfg: PagedConfig, batch: PagedBatch, verify: bool) -> list[tuple[int, int, int]]:
    """Per query token: (request row, first position it attends to, one past the last)."""
    out = []
    for i in range(batch.requests):
        row = int(batch.req_pool_indices[i])
        length = int(batch.seq_lens[i])
        for d in range(batch.queries):
            end = length + d + 1 if verify else length
            out.append((row, 0, end))
    return out


def reference_step(
    state: PagedState, batch: PagedBatch, mode: ForwardMode, pools: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The step computed eagerly in plain torch from the tables: ``(hidden [tokens, hidden],
    the KV pools after the step)``. ``pools`` (e.g. `PagedState.snapshot`) is not changed."""
    cfg = state.cfg
    verify = ForwardMode.parse(mode) == VERIFY
    after = {name: t.clone() for name, t in pools.items()}
    h = state.embed.index_select(0, batch.input_ids)
    tokens = batch.size
    groups = cfg.q_heads // cfg.kv_heads
    spans = token_spans(cfg, batch, verify)
    table = state.req_to_token
    for layer in range(cfg.layers):
        q = (h @ state.wq[layer]).view(tokens, cfg.kv_heads, groups, cfg.head_dim).float()
        k = (h @ state.wk[layer]).view(tokens, cfg.kv_heads, cfg.head_dim)
        v = (h @ state.wv[layer]).view(tokens, cfg.kv_heads, cfg.head_dim)
        swa = cfg.is_swa_layer(layer)
        loc = batch.out_cache_loc
        if swa:
            assert state.full_to_swa is not None
            loc = state.full_to_swa.index_select(0, loc)
        kpool, vpool = after[f"k{layer}"], after[f"v{layer}"]
        kpool[loc] = k
        vpool[loc] = v
        outs = []
        for t, (row, start, end) in enumerate(spans):
            if swa:
                start = max(start, end - cfg.swa_window)
            slots = table[row, start:end].to(torch.int64)
            if swa:
                assert state.full_to_swa is not None
                slots = state.full_to_swa.index_select(0, slots)
            keys, values = kpool[slots].float(), vpool[slots].float()
            scores = torch.einsum("kgd,skd->kgs", q[t], keys) * cfg.head_dim**-0.5
            outs.append(torch.einsum("kgs,skd->kgd", scores.softmax(-1), values).reshape(-1))
        attn = torch.stack(outs).to(cfg.dtype)
        h = h + attn @ state.wo[layer]
    return h, after


__all__ = [
    "PagedBatch",
    "PagedConfig",
    "PagedState",
    "reference_step",
    "token_spans",
]
