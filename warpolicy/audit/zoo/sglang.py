"""Zoo fixtures from SGLang's reports: request-pool reuse, SWA mapping recovery, a live mapping
reread after replay, and a draft extend publishing before its replay.

Each model is a `ZooModel` whose ``buggy`` variant reads scheduler-shared state where the cited
report's engine did; the fixed variant reads it where the fix moved the read (or declares the
read end the fix declared). The mechanisms are rebuilt from the public reports, not from their
code.
"""

from __future__ import annotations

from typing import Any

import torch

from warpolicy.audit.zoo.model import Static, ZooModel
from warpolicy.registry.vocabulary import ForwardMode


class RequestPoolReuse(ZooModel):
    """SGLang #18803: a finished request's pool row is handed to the next request while the
    forward still reads it.

    The batch names its requests by position; ``req_pool_indices`` (scheduler-written per
    batch) maps position ``i`` to the request's pool row, and the in-graph prep gathers each
    token's KV slot through it. Buggy: the attention of the last layer looks the slot up again
    through the live ``req_pool_indices`` and ``req_to_token`` (the scheduler has already freed
    the row and written the next request's slots there). Fixed: the attention reads the slots
    the prep gathered, before the read-done marker."""

    def __init__(self, device: Any, buggy: bool) -> None:
        super().__init__(device, buggy)
        self.req_pool_indices = self.share(
            "req_pool_indices", torch.zeros(8, dtype=torch.long, device=self.device)
        )

    def scheduled(self, rows: torch.Tensor, generator: torch.Generator) -> None:
        # the scheduler assigns pool rows to the batch's requests; the batch then carries
        # positions in the pool-index table rather than rows
        self.req_pool_indices[: rows.numel()].copy_(rows.to(self.device))

    def host_prep(self, batch: torch.Tensor, bucket: int) -> None:
        super().host_prep(batch, bucket)
        s = self.static[bucket]
        n = int(batch.shape[0])
        s.aux[:n].copy_(torch.arange(n, device=self.device))  # the request's batch position
        s.aux[n:].zero_()

    def prep(self, s: Static) -> None:
        torch.index_select(self.req_pool_indices, 0, s.aux, out=s.rows)
        super().prep(s)

    def layer(self, s: Static, index: int, h: torch.Tensor) -> torch.Tensor:
        if index != self.layers - 1:
            return h
        if self.buggy:  # the live pool row, after the release
            rows = self.req_pool_indices.index_select(0, s.aux)
            slots = self.req_to_token.view(-1).index_select(0, rows * self.ctx + s.pos)
        else:
            slots = s.loc
        return h + self.k_full.index_select(0, slots)


class SwaMappingRecovery(ZooModel):
    """SGLang #31687: a sliding-window layer recovers each token's SWA slot from its full slot
    through the scheduler's ``full_to_swa`` mapping.

    The mapping ends in a ``-1`` sentinel (the padding slot has no SWA slot, as in SGLang
    0.5.23); live tokens never index it. Buggy: the last layer recovers the SWA slots from the
    live mapping after the read-done marker (the scheduler remaps evicted slots meanwhile).
    Fixed: the prep translates them before the marker. This is also the fixture of the poison
    regression (issue 30, item 5): a poison that writes the sentinel into a live entry makes
    the buggy variant index out of bounds instead of being caught."""

    swa_slots = 48

    def __init__(self, device: Any, buggy: bool) -> None:
        super().__init__(device, buggy)
        g = self.generator
        mapping = self.mapping(g)
        self.full_to_swa = self.share(
            "full_to_swa", torch.cat([mapping, torch.tensor([-1])]).to(self.device)
        )
        self.k_swa = torch.randn(self.swa_slots, self.hidden, generator=g).to(self.device)

    def mapping(self, generator: torch.Generator) -> torch.Tensor:
        """Full slot -> SWA slot (many to one: the window holds fewer slots)."""
        return torch.randint(0, self.swa_slots, (self.slots,), generator=generator)

    def prep(self, s: Static) -> None:
        super().prep(s)
        if not self.buggy:
            torch.index_select(self.full_to_swa, 0, s.loc, out=s.aux)

    def swa_slots_of(self, s: Static) -> torch.Tensor:
        return self.full_to_swa.index_select(0, s.loc) if self.buggy else s.aux

    def layer(self, s: Static, index: int, h: torch.Tensor) -> torch.Tensor:
        if index != self.layers - 1:
            return h
        return h + self.k_swa.index_select(0, self.swa_slots_of(s))


class LiveMappingReread(SwaMappingRecovery):
    """SGLang #32460: the SWA translation of the live mapping, per layer, wrote KV to the
    wrong slots.

    After the replay the engine writes each token's hidden state into the sliding-window KV
    pool (eager work on the forward stream, `post_step`). Buggy: that write translates the
    token's full slot through the live ``full_to_swa`` again, after the graph published its
    read-done; only the SWA KV pool shows it (the returned output is right). Fixed: it writes
    at the SWA slots the in-graph prep translated. The graph walk cannot see eager work after
    replay: the dynamic audit and the canary catch this one."""

    swa_slots = 128  # one per full slot: two tokens never write one SWA slot (a GPU write race)

    def __init__(self, device: Any, buggy: bool) -> None:
        super().__init__(device, buggy)
        self.swa_kv_pool = self.write(
            "swa_kv_pool", torch.zeros(self.swa_slots, self.hidden, device=self.device)
        )

    def mapping(self, generator: torch.Generator) -> torch.Tensor:
        return torch.randperm(self.slots, generator=generator)

    def prep(self, s: Static) -> None:
        ZooModel.prep(self, s)
        torch.index_select(self.full_to_swa, 0, s.loc, out=s.aux)  # both variants

    def layer(self, s: Static, index: int, h: torch.Tensor) -> torch.Tensor:
        return h

    def post_step(self, mode: ForwardMode, batch: Any, out: torch.Tensor) -> torch.Tensor:
        """The eager SWA KV write after the replay (what `AuditSubject.post_step` runs)."""
        s = self.static[self.last_bucket] if self.last_bucket is not None else None
        if s is None:
            return out
        slots = self.full_to_swa.index_select(0, s.loc) if self.buggy else s.aux
        self.swa_kv_pool.index_copy_(0, slots, out)
        return out


class DraftExtendEarlyPublish(ZooModel):
    """SGLang #37988: the draft extend published its read-done before its replay while its
    graph still gathered ``req_to_token`` rows (an out-of-bounds gather in the field).

    The draft-extend runner's graph has no marker (`DraftExtendRunner`): its prep runs inside
    the captured body. Buggy: the backend declares ``draft_extend: pre_replay`` (it does not
    snapshot its shared reads on the host). Fixed: ``post_replay``, the read end of a graph
    whose prep is not separated from its forward. The model is the same; the declaration is
    the bug."""

    modes = (ForwardMode.DRAFT_EXTEND,)
