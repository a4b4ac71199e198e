"""`ZooModel`: the small decode-like model every zoo fixture varies.

A `ModelAdapter` and `CanaryAdapter` over scheduler-shared tables, written the way the fixtures'
engines keep them: ``req_to_token`` (request pool row x position -> KV slot) plus whatever a
fixture adds (`ZooModel.share`). A batch is an ``[n, 2]`` int64 tensor of (request row,
position); ``host_prep`` copies it into the bucket's static inputs (padding rows are (0, 0), a
valid entry, so padded tokens read shared state too). The undisturbed step of every fixture is
the same shape of computation: the metadata prep turns each token into its KV slot
(`ZooModel.prep`), the forward gathers KV rows there, runs ``layers`` tanh-matmul layers
(`ZooModel.layer`, where a fixture adds its late read) and writes each token's hidden state
into ``kv_pool`` at its slot, a padding token's in a row of its own (state the step writes;
the audit compares it through ``extra_outputs``, the canary through its spec).

A fixture's buggy and fixed variants compute the same function undisturbed (the zoo's tests
check it); they differ only in *when* the shared state is read, or in what is declared.

**Host-visible buffers** (`ZooModel.host`): a table the scheduler fills from the host, as
vLLM's pinned UVA slots and TensorRT-LLM's pinned staging buffers are. On CUDA it is a pinned
host tensor the graph copies to the device; the audit and the canary's scheduler write it from
the host once the barrier cleared (`warpolicy.audit.dynamic`), as those engines do. On the
simulated platform it is one more CPU tensor.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.canary import CanarySpec

DECODE, EXTEND = ForwardMode.DECODE, ForwardMode.EXTEND

#: Buckets of every mode a fixture runs (small: the zoo runs many trials; <= 8 tokens).
BUCKETS = (4, 8)


class Static:
    """A bucket's static inputs, metadata and output (graphs keep these addresses)."""

    def __init__(self, n: int, hidden: int, device: torch.device, sink: int) -> None:
        z = lambda: torch.zeros(n, dtype=torch.long, device=device)  # noqa: E731
        self.n = n
        self.rows, self.pos, self.flat, self.loc, self.aux = z(), z(), z(), z(), z()
        #: whether each token is the batch's (not padding), set by the host prep
        self.valid = torch.zeros(n, dtype=torch.bool, device=device)
        #: each padding token's own KV row (from ``sink`` on): no two tokens write one row
        self.sink = torch.arange(sink, sink + n, dtype=torch.long, device=device)
        self.act = torch.zeros(n, hidden, device=device)
        self.out = torch.zeros(n, hidden, device=device)


class ZooModel:
    """The model a fixture subclasses (see the module docstring). ``buggy`` selects the
    variant; subclasses read it in `prep`, `layer` and `finish`."""

    #: the modes the fixture runs, each with `BUCKETS`
    modes: tuple[ForwardMode, ...] = (DECODE,)

    def __init__(
        self,
        device: Any,
        buggy: bool,
        *,
        reqs: int = 8,
        ctx: int = 16,
        hidden: int = 32,
        layers: int = 3,
        seed: int = 0,
    ) -> None:
        self.device = torch.device(device)
        self.buggy = buggy
        self.reqs, self.ctx, self.hidden, self.layers = reqs, ctx, hidden, layers
        self.generator = torch.Generator().manual_seed(seed)
        g = self.generator
        self.slots = reqs * ctx
        self.req_to_token = torch.randperm(self.slots, generator=g).view(reqs, ctx).to(device)
        self.shared_buffers: dict[str, torch.Tensor] = {"req_to_token": self.req_to_token}
        self.k_full = torch.randn(self.slots, hidden, generator=g).to(device)
        # one KV row per slot, then one per padding position (`Static.sink`)
        self.kv_pool = torch.zeros(self.slots + max(BUCKETS), hidden, device=device)
        self.written: dict[str, torch.Tensor] = {"kv_pool": self.kv_pool}
        self.weights = [
            (torch.randn(hidden, hidden, generator=g) * hidden**-0.5).to(device)
            for _ in range(layers)
        ]
        self.static: dict[int, Static] = {}
        self.last_bucket: int | None = None

    # -- building the fixture's tables ---------------------------------------------------------

    def share(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Register ``tensor`` (already on the device) as scheduler-shared state."""
        self.shared_buffers[name] = tensor
        return tensor

    def host(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Register ``tensor`` as a host-visible shared table: pinned host memory on CUDA."""
        host = tensor.cpu()
        if self.device.type == "cuda":
            host = host.pin_memory()
        self.shared_buffers[name] = host
        return host

    def write(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Register ``tensor`` as state the step writes besides its output (KV pools)."""
        self.written[name] = tensor
        return tensor

    # -- ModelAdapter --------------------------------------------------------------------------

    def bucket_sizes(self, mode: ForwardMode) -> Sequence[int]:
        return BUCKETS if ForwardMode.parse(mode) in self.modes else ()

    def batch_size(self, batch: torch.Tensor) -> int:
        return int(batch.shape[0])

    def prepare_bucket(self, bucket: int) -> None:
        if bucket not in self.static:
            self.static[bucket] = Static(bucket, self.hidden, self.device, self.slots)

    def host_prep(self, batch: torch.Tensor, bucket: int) -> None:
        s = self.static[bucket]
        n = int(batch.shape[0])
        self.last_bucket = bucket
        s.rows[:n].copy_(batch[:, 0])
        s.pos[:n].copy_(batch[:, 1])
        s.rows[n:].zero_()
        s.pos[n:].zero_()
        s.valid[:n] = True
        s.valid[n:] = False

    def graph_prep(self, bucket: int) -> None:
        if not self.prep_in_forward():
            self.prep(self.static[bucket])

    def forward(self, bucket: int) -> torch.Tensor:
        s = self.static[bucket]
        if self.prep_in_forward():
            self.prep(s)
        s.act.copy_(self.k_full.index_select(0, s.loc))
        h = s.act
        for i, w in enumerate(self.weights):
            h = self.layer(s, i, torch.tanh(h @ w))
        s.out.copy_(h)
        self.kv_pool.index_copy_(0, self.kv_slots(s), s.out)
        return s.out

    # -- what a fixture varies -----------------------------------------------------------------

    def prep_in_forward(self) -> bool:
        """Whether the metadata prep runs after the plant (in the forward)."""
        return False

    def prep(self, s: Static) -> None:
        """The metadata prep: each token's KV slot from the live ``req_to_token``."""
        torch.add(s.rows * self.ctx, s.pos, out=s.flat)
        torch.index_select(self.req_to_token.view(-1), 0, s.flat, out=s.loc)

    def layer(self, s: Static, index: int, h: torch.Tensor) -> torch.Tensor:
        """Layer ``index``'s output (a fixture adds what its layers read)."""
        return h

    def kv_slots(self, s: Static) -> torch.Tensor:
        """Where the KV write lands: each token's slot, each padding token's own sink row.
        Padding tokens share the entry (0, 0), so writing theirs at its slot would make two
        tokens write one row: on a GPU, which write wins is unspecified, and a fixture whose
        padding tokens compute different values (a late read per position) would differ from
        its own reference with no race at all (an H100 flagged two fixed variants so)."""
        return torch.where(s.valid, s.loc, s.sink)

    def post_step(self, mode: ForwardMode, batch: Any, out: torch.Tensor) -> torch.Tensor:
        """Eager work after the replay (only for a fixture with ``post_step=True``)."""
        return out

    # -- CanaryAdapter -------------------------------------------------------------------------

    def canary_spec(self, mode: ForwardMode, bucket: int, batch: object) -> CanarySpec:
        """The shared tables as inputs (the default), the written pools as state."""
        return CanarySpec(state=dict(self.written))

    # -- batches -------------------------------------------------------------------------------

    def make_batch(self, mode: ForwardMode, trial: int) -> torch.Tensor:
        """A deterministic batch for ``trial``: trial ``t`` fits bucket ``t mod 2`` and no
        smaller one, so two consecutive trials replay every bucket. Distinct request rows (a
        request appears once per batch, as in a decode batch)."""
        g = torch.Generator().manual_seed(
            zlib.crc32(f"{ForwardMode.parse(mode).label}:{trial}".encode())
        )
        k = trial % len(BUCKETS)
        low = BUCKETS[k - 1] if k else 0
        n = int(torch.randint(low + 1, BUCKETS[k] + 1, (1,), generator=g))
        rows = torch.randperm(self.reqs, generator=g)[:n]
        pos = torch.randint(0, self.ctx, (n,), generator=g)
        self.scheduled(rows, g)
        return torch.stack([rows, pos], dim=1).to(self.device)

    def scheduled(self, rows: torch.Tensor, generator: torch.Generator) -> None:
        """The scheduler's own writes for a batch of ``rows`` (a fixture with per-batch shared
        state, such as a request-slot table, fills it here)."""

    def tables(self) -> Mapping[str, torch.Tensor]:
        """Every shared table (for the fixture's tests)."""
        return dict(self.shared_buffers)
