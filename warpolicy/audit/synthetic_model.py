"""The synthetic decode-like model behind ``audit --synthetic`` and ``bench overlap``.

One `ModelAdapter` over two scheduler-shared tables, ``req_to_token`` (request row x position
-> KV slot) and ``full_to_swa`` (full KV slot -> sliding-window slot). A batch is an ``[n, 2]``
int64 tensor of (request row, position) on the model's device; ``host_prep`` copies it into the
bucket's static inputs (padding rows are (0, 0), a valid entry, so padded tokens read shared
state too). The metadata prep translates each token to its full slot (through
``req_to_token``) and to its SWA slot (through ``full_to_swa``); the forward gathers KV rows at
those slots, runs ``layers`` tanh-matmul layers, adds the SWA rows in the last one, and writes
each token's hidden state into ``kv_pool`` at its slot (the KV write: state the step writes
that its returned output does not show, which the audit compares through
``AuditSubject.extra_outputs``).

`Layout` says *where* those shared reads happen; every layout computes the same function
undisturbed (a test checks it), so the audit's synthetic backends differ only in their races.
The overlap benchmarks use the default layout with a wide, bf16 configuration
(``layer_rows``, ``window_rows``, ``dtype``) and drive the scheduler's table writes themselves;
with ``shared_index`` the batch is scheduler-shared too (the scheduler writes it into
``batch_index``, the in-graph prep reads it), and ``after_layer`` lets a tensor-parallel
variant end each layer in an all-reduce.

The model is also a `warpolicy.runtime.runners.CanaryAdapter` (`SyntheticModel.canary_spec`): the
WAR canary saves its shared tables as inputs and the KV pool as state the step writes (like the
audit's ``extra_outputs``), whole, or (``canary_state="rows"``) only the slots the step writes.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence

import attrs
import torch

from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.canary import CanarySpec, Rows, Tolerance

DECODE, EXTEND, VERIFY = ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY


@attrs.frozen
class SyntheticConfig:
    """Sizes of the synthetic model (the audit's defaults are small: it runs many trials)."""

    reqs: int = 8  # rows of req_to_token
    ctx: int = 16  # positions per row
    swa_slots: int = 64
    hidden: int = 64
    layers: int = 4
    seed: int = 0
    draft_tokens: int = 2
    buckets: Mapping[ForwardMode, tuple[int, ...]] = attrs.field(
        factory=lambda: {DECODE: (4, 8), EXTEND: (16, 32), VERIFY: (8, 16)}
    )
    layer_rows: int = 0  # rows of each layer's activation (0: the bucket; wider = slower layers)
    window_rows: int = 0  # rows of extra in-graph work before the prep's reads (0: none)
    dtype: torch.dtype | None = None  # activations and weights (None: float32)
    # the batch itself is scheduler-shared: the scheduler writes each step's (request row,
    # position) pairs into ``batch_index`` and the in-graph prep reads them (host_prep copies
    # nothing), so the index and the table rows it selects are both rewritten per step
    shared_index: bool = False


@attrs.frozen
class Layout:
    """Where the model reads shared state (the only thing the audit's variants change)."""

    snapshot: bool = False  # the full prep runs in host_prep (out of graph, before release)
    prep_in_forward: bool = False  # the full prep runs after the plant
    split_prep: bool = False  # second micro-batch's prep runs after the plant (composite)
    late_swa: bool = False  # a late layer translates through the live full_to_swa
    late_kv_write: bool = False  # the KV write re-reads its slots from the live req_to_token
    reread_after_replay: bool = False  # post_step rereads req_to_token eagerly
    first_layer_rebuild: bool = False  # the first layer rebuilds the metadata from live tables


class _BucketBuffers:
    """A bucket's static inputs, metadata and output (graphs keep these addresses)."""

    def __init__(
        self, n: int, cfg: SyntheticConfig, device: torch.device, dtype: torch.dtype
    ) -> None:
        z = lambda: torch.zeros(n, dtype=torch.long, device=device)  # noqa: E731
        self.rows, self.pos, self.flat, self.loc, self.swa_loc = z(), z(), z(), z(), z()
        self.act = torch.zeros(max(cfg.layer_rows, n), cfg.hidden, device=device, dtype=dtype)
        self.out = torch.zeros(n, cfg.hidden, device=device, dtype=dtype)


class SyntheticModel:
    """The synthetic `ModelAdapter` (see the module docstring). ``prepare_bucket`` is
    idempotent, so several runners (one per policy or mode) can share one model."""

    def __init__(self, layout: Layout, cfg: SyntheticConfig, device: torch.device) -> None:
        if cfg.shared_index and layout != Layout():
            raise ValueError("shared_index is read by the default layout's in-graph prep only")
        self.layout = layout
        self.cfg = cfg
        self.device = torch.device(device)
        self.dtype = cfg.dtype or torch.float32
        g = torch.Generator().manual_seed(cfg.seed)
        slots = cfg.reqs * cfg.ctx
        self.slots = slots
        self.req_to_token = torch.randperm(slots, generator=g).view(cfg.reqs, cfg.ctx).to(device)
        self.full_to_swa = torch.randint(0, cfg.swa_slots, (slots,), generator=g).to(device)
        self.shared_buffers = {"req_to_token": self.req_to_token, "full_to_swa": self.full_to_swa}
        largest = max((max(b) for b in cfg.buckets.values() if b), default=1)
        self.batch_index = torch.zeros(largest, 2, dtype=torch.long, device=device)
        if cfg.shared_index:
            self.shared_buffers["batch_index"] = self.batch_index
        #: called with each layer's output, in place (e.g. a tensor-parallel all-reduce)
        self.after_layer: Callable[[torch.Tensor], object] | None = None
        self.k_full = torch.randn(slots, cfg.hidden, generator=g).to(device, self.dtype)
        self.k_swa = torch.randn(cfg.swa_slots, cfg.hidden, generator=g).to(device, self.dtype)
        self.kv_pool = torch.zeros(slots, cfg.hidden, device=device, dtype=self.dtype)
        scale = cfg.hidden**-0.5
        self.weights = [
            (torch.randn(cfg.hidden, cfg.hidden, generator=g) * scale).to(device, self.dtype)
            for _ in range(cfg.layers)
        ]
        self.window = (torch.randn(max(cfg.window_rows, 1), cfg.hidden, generator=g) * scale).to(
            device, self.dtype
        )
        self.static: dict[int, _BucketBuffers] = {}
        self.last_bucket: int | None = None
        #: the WAR canary: the KV pool ``"whole"`` or only the ``"rows"`` a step writes, and the
        #: comparison's tolerance (None: bitwise; a replay of the same graph is deterministic)
        self.canary_state = "whole"
        self.canary_tolerance: Tolerance | None = None

    # -- ModelAdapter ------------------------------------------------------------------------

    def bucket_sizes(self, mode: ForwardMode) -> Sequence[int]:
        return self.cfg.buckets.get(ForwardMode.parse(mode), ())

    def batch_size(self, batch: torch.Tensor) -> int:
        return int(batch.shape[0])

    def prepare_bucket(self, bucket: int) -> None:
        if bucket not in self.static:
            self.static[bucket] = _BucketBuffers(bucket, self.cfg, self.device, self.dtype)

    def host_prep(self, batch: torch.Tensor, bucket: int) -> None:
        s = self.static[bucket]
        n = int(batch.shape[0])
        self.last_bucket = bucket
        if self.cfg.shared_index:  # the scheduler wrote the batch; the graph reads it
            return
        s.rows[:n].copy_(batch[:, 0])
        s.pos[:n].copy_(batch[:, 1])
        s.rows[n:].zero_()
        s.pos[n:].zero_()
        if self.layout.snapshot:  # host-side metadata init: snapshot before the release
            self._prep(s, 0, bucket)

    def graph_prep(self, bucket: int) -> None:
        s = self.static[bucket]
        lay = self.layout
        if self.cfg.window_rows:  # work before the read: widens the race window
            torch.tanh(self.window @ self.weights[0])
        if self.cfg.shared_index:  # the in-graph read of the scheduler's batch index
            s.rows.copy_(self.batch_index[:bucket, 0])
            s.pos.copy_(self.batch_index[:bucket, 1])
        if lay.snapshot or lay.prep_in_forward:
            return
        end = (bucket + 1) // 2 if lay.split_prep else bucket  # split: the dense child's half
        self._prep(s, 0, end)

    def forward(self, bucket: int) -> torch.Tensor:
        s = self.static[bucket]
        lay = self.layout
        if lay.prep_in_forward:
            self._prep(s, 0, bucket)
        elif lay.split_prep:  # the tbo child builds its micro-batch's metadata here
            self._prep(s, (bucket + 1) // 2, bucket)
        s.act[:bucket].copy_(self.k_full.index_select(0, s.loc))
        h = s.act
        for i, w in enumerate(self.weights):
            h = torch.tanh(h @ w)
            if i == 0 and lay.first_layer_rebuild:  # DP padding: metadata rebuilt in layer 0
                self._prep(s, 0, bucket)
            if i == len(self.weights) - 1:
                swa = (
                    self.full_to_swa.index_select(0, s.loc)
                    if lay.late_swa  # live map
                    else s.swa_loc
                )
                h = h[:bucket] + self.k_swa.index_select(0, swa)
            if self.after_layer is not None:
                self.after_layer(h)
        h = h[:bucket]
        s.out.copy_(h)
        # the KV write; tokens sharing a slot carry equal values, so the order does not matter
        loc = self.req_to_token.view(-1).index_select(0, s.flat) if lay.late_kv_write else s.loc
        self.kv_pool.index_copy_(0, loc, h)
        return s.out

    def canary_spec(self, mode: ForwardMode, bucket: int, batch: object) -> CanarySpec:
        """What the WAR canary saves, puts back and compares for a step (called after
        ``host_prep``, before the release): the shared buffers as inputs (the default), the KV
        pool as state, whole or the rows this step writes (computed here, on the forward
        stream, from the tables as the step will read them)."""
        kv: object = self.kv_pool
        if self.canary_state == "rows":
            s = self.static[bucket]
            rows, pos = s.rows, s.pos
            if self.cfg.shared_index:
                rows, pos = self.batch_index[:bucket, 0], self.batch_index[:bucket, 1]
            slots = self.req_to_token.view(-1).index_select(0, rows * self.cfg.ctx + pos)
            kv = Rows(self.kv_pool, slots)
        return CanarySpec(state={"kv_pool": kv}, tolerance=self.canary_tolerance)

    def metadata(self, bucket: int) -> torch.Tensor:
        """The bucket's last prep output (what a prep-only forward returns)."""
        return self.static[bucket].swa_loc

    # -- shared reads ------------------------------------------------------------------------

    def _prep(self, s: _BucketBuffers, start: int, end: int) -> None:
        """Metadata prep of tokens ``[start, end)``: the reads of shared state."""
        if end <= start:
            return
        flat = s.flat[start:end]
        torch.add(s.rows[start:end] * self.cfg.ctx, s.pos[start:end], out=flat)
        torch.index_select(self.req_to_token.view(-1), 0, flat, out=s.loc[start:end])
        if not self.layout.late_swa:
            torch.index_select(self.full_to_swa, 0, s.loc[start:end], out=s.swa_loc[start:end])

    def reread(self, mode: ForwardMode, batch: object, out: torch.Tensor) -> torch.Tensor:
        """The eager post-replay work of ``reread_after_replay``: it reads the live table."""
        s = self.static[self.last_bucket] if self.last_bucket is not None else None
        if s is None or out.shape[0] != s.out.shape[0]:
            return out
        slots = self.req_to_token.view(-1).index_select(0, s.flat)
        return out + 1e-3 * slots.to(out.dtype).unsqueeze(1)

    # -- batches -----------------------------------------------------------------------------

    def make_batch(self, mode: ForwardMode, trial: int) -> torch.Tensor:
        """A deterministic batch for ``trial``. Trial ``t`` fits bucket ``t mod len(buckets)``
        (and no smaller one), so any ``len(buckets)`` consecutive trials replay every bucket."""
        mode = ForwardMode.parse(mode)
        sizes = sorted(self.bucket_sizes(mode)) or [1]
        unit = self.cfg.draft_tokens if mode == VERIFY else 1  # verify: whole requests
        k = trial % len(sizes)
        low, high = (sizes[k - 1] if k else 0) // unit, sizes[k] // unit
        g = torch.Generator().manual_seed(zlib.crc32(f"{mode.label}:{trial}".encode()))
        n = int(torch.randint(low + 1, max(high, low + 1) + 1, (1,), generator=g)) * unit
        rows = torch.randint(0, self.cfg.reqs, (n,), generator=g)
        pos = torch.randint(0, self.cfg.ctx, (n,), generator=g)
        return torch.stack([rows, pos], dim=1).to(self.device)
