"""`TinyPagedModel`: the example engine's paged-attention-like `ModelAdapter`, built from torch ops.

A request-to-token table, a page-table gather in the in-graph prep, a KV write at
``out_cache_loc`` and attention over the gathered KV. Its only scheduler-shared buffer is
``req_to_token``, read in ``graph_prep`` (so ``IN_GRAPH`` is sound and ``PRE_REPLAY`` is not).
With ``late_shared_read=True`` every layer re-reads the live table after the planted node (the
TRTLLM SWA bug shape), so ``IN_GRAPH`` becomes unsound too: a seeded bad declaration.
``examples/tiny_engine.py`` serves it on the three runners (``scripts/gpu-check`` runs it).

The model runs on CUDA or on CPU (under the simulated platform); ``prepare_bucket`` is
idempotent, so several runners (one per mode) can share one model state. This module imports
torch (``import warpolicy.testing`` does not import it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import torch

from warpolicy.registry.vocabulary import ForwardMode


@attrs.frozen
class TinyConfig:
    """Sizes of the tiny model. Row 0 of the table and slot 0 of the KV pool are padding."""

    vocab: int = 64
    hidden: int = 32
    layers: int = 2
    max_reqs: int = 8
    max_ctx: int = 32
    kv_slots: int = 512
    seed: int = 0
    decode_buckets: tuple[int, ...] = (1, 2, 4, 8)
    prefill_buckets: tuple[int, ...] = (16, 32, 64)
    draft_tokens: int = 2
    verify_buckets: tuple[int, ...] = (2, 4, 8, 16)  # bs * draft_tokens


@attrs.define
class TokenBatch:
    """One step's tokens (CPU int64 tensors of equal length): what ``host_prep`` copies."""

    ids: torch.Tensor
    positions: torch.Tensor
    rows: torch.Tensor  # request-to-token table row of each token's request
    out_cache_loc: torch.Tensor  # KV slot each token writes

    def __len__(self) -> int:
        return int(self.ids.numel())

    @classmethod
    def of(
        cls, ids: Sequence[int], positions: Sequence[int], rows: Sequence[int], locs: Sequence[int]
    ) -> TokenBatch:
        t = lambda xs: torch.tensor(list(xs), dtype=torch.long)  # noqa: E731
        return cls(t(ids), t(positions), t(rows), t(locs))


class TinyWeights:
    """Deterministic weights (seeded), shared by every adapter of one engine."""

    def __init__(self, cfg: TinyConfig, device: torch.device) -> None:
        g = torch.Generator().manual_seed(cfg.seed)
        h, s = cfg.hidden, 1.0 / math.sqrt(cfg.hidden)
        r = lambda *shape, scale=s: (torch.randn(*shape, generator=g) * scale).to(device)  # noqa: E731
        self.emb = r(cfg.vocab, h, scale=1.0)
        self.pos_emb = r(cfg.max_ctx, h, scale=0.1)
        self.wq = [r(h, h) for _ in range(cfg.layers)]
        self.wk = [r(h, h) for _ in range(cfg.layers)]
        self.wv = [r(h, h) for _ in range(cfg.layers)]
        self.wo = [r(h, h) for _ in range(cfg.layers)]
        self.out = r(h, cfg.vocab)


class TinyState:
    """Scheduler-shared state: the request-to-token table and the paged KV pool."""

    def __init__(self, cfg: TinyConfig, device: torch.device) -> None:
        self.req_to_token = torch.zeros(
            cfg.max_reqs + 1, cfg.max_ctx, dtype=torch.long, device=device
        )
        shape = (cfg.layers, cfg.kv_slots + 1, cfg.hidden)
        self.k_cache = torch.zeros(shape, device=device)
        self.v_cache = torch.zeros(shape, device=device)

    def reset(self) -> None:
        """Zero everything in place (graphs keep the addresses)."""
        self.req_to_token.zero_()
        self.k_cache.zero_()
        self.v_cache.zero_()


class _TinyBucket:
    """A bucket's static inputs, prep output and logits."""

    def __init__(self, n: int, cfg: TinyConfig, device: torch.device) -> None:
        z = lambda *s: torch.zeros(*s, dtype=torch.long, device=device)  # noqa: E731
        self.ids, self.positions, self.rows, self.locs = z(n), z(n), z(n), z(n)
        self.kv_idx = z(n, cfg.max_ctx)
        self.logits = torch.zeros(n, cfg.vocab, device=device)


class TinyPagedModel:
    """`ModelAdapter` of the tiny paged-attention model for one forward mode."""

    def __init__(
        self,
        cfg: TinyConfig,
        weights: TinyWeights,
        state: TinyState,
        mode: ForwardMode,
        *,
        late_shared_read: bool = False,
    ) -> None:
        self.cfg = cfg
        self.w = weights
        self.state = state
        self.mode = ForwardMode.parse(mode)
        self.late_shared_read = late_shared_read
        self.device = state.req_to_token.device
        self.shared_buffers = {"req_to_token": state.req_to_token}
        self.static: dict[int, _TinyBucket] = {}
        self._ctx = torch.arange(cfg.max_ctx, device=self.device)

    def bucket_sizes(self, mode: ForwardMode) -> Sequence[int]:
        by_mode = {
            ForwardMode.DECODE: self.cfg.decode_buckets,
            ForwardMode.EXTEND: self.cfg.prefill_buckets,
            ForwardMode.TARGET_VERIFY: self.cfg.verify_buckets,
        }
        return by_mode.get(ForwardMode.parse(mode), ())

    def batch_size(self, batch: TokenBatch) -> int:
        return len(batch)

    def prepare_bucket(self, bucket: int) -> None:
        if bucket not in self.static:
            self.static[bucket] = _TinyBucket(bucket, self.cfg, self.device)

    def host_prep(self, batch: TokenBatch, bucket: int) -> None:
        """Copy the batch into the static inputs; padding tokens use row 0, slot 0, pos 0."""
        st, n = self.static[bucket], len(batch)
        for dst, src in (
            (st.ids, batch.ids),
            (st.positions, batch.positions),
            (st.rows, batch.rows),
            (st.locs, batch.out_cache_loc),
        ):
            dst[:n].copy_(src, non_blocking=False)
            dst[n:].zero_()

    def graph_prep(self, bucket: int) -> None:
        """The page-table gather: the forward's only read of the shared table."""
        st = self.static[bucket]
        torch.index_select(self.state.req_to_token, 0, st.rows, out=st.kv_idx)

    def forward(self, bucket: int) -> torch.Tensor:
        st, w, s = self.static[bucket], self.w, self.state
        x = w.emb[st.ids] + w.pos_emb[st.positions]
        visible = self._ctx[None, :] <= st.positions[:, None]  # causal over the request's row
        for layer in range(self.cfg.layers):
            q, k, v = x @ w.wq[layer], x @ w.wk[layer], x @ w.wv[layer]
            s.k_cache[layer].index_copy_(0, st.locs, k)  # KV write at out_cache_loc
            s.v_cache[layer].index_copy_(0, st.locs, v)
            # the seeded bug: a live re-read of the shared table after the planted node
            kv_idx = s.req_to_token[st.rows] if self.late_shared_read else st.kv_idx
            keys, vals = s.k_cache[layer][kv_idx], s.v_cache[layer][kv_idx]  # [n, ctx, h]
            scores = (keys @ q[:, :, None]).squeeze(-1) / math.sqrt(self.cfg.hidden)
            attn = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
            x = x + torch.tanh((attn[:, :, None] * vals).sum(1) @ w.wo[layer])
        torch.matmul(x, w.out, out=st.logits)
        return st.logits
