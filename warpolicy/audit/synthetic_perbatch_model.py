"""The per-batch synthetic prefill (issue 21 item 5): a snapshot built only above a threshold.

`PerBatchModel` is the synthetic model (`warpolicy.audit.synthetic_model`) as a prefill whose
shared reads depend on the batch, like DeepSeek-V4's sparse prefill:

* a bucket of at most ``threshold`` tokens (a dense prefill) builds its metadata in
  ``host_prep`` (host-side metadata init, before the release): its graph reads only the copy,
  so ``pre_replay`` holds for it;
* a bigger bucket (a sparse prefill) reads ``req_to_token`` and ``full_to_swa`` **in its
  forward** (after any pre-replay release) unless this batch's snapshot was built before the
  replay (`snapshot`, performed by the per-batch action hook): the graph then uses the copy.
  The choice is a per-bucket device flag that ``host_prep`` clears and `snapshot` sets, so one
  captured graph serves both (``torch.where`` over the copy and the live lookup: the live
  lookup always runs, only a batch without the snapshot uses it).

`make_perbatch` returns the `AuditSubject`: a `PrefillRunner` on the registry's compiled
``perbatch_prefill`` (`warpolicy.audit.synthetic_perbatch`), with a plugin manager whose only
action plugin is `SnapshotAction` of the given kind. Batches cover every bucket, on both sides
of the threshold. ``honest``: SAFE; ``lying`` (True without copying): UNSAFE; ``failing``:
the big buckets publish nothing (coarse: nothing to audit there).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from warpolicy.audit.subject import AuditSubject
from warpolicy.audit.synthetic_model import Layout, SyntheticConfig, SyntheticModel
from warpolicy.audit.synthetic_perbatch import (
    THRESHOLD,
    SnapshotAction,
    perbatch_policy,
)
from warpolicy.registry.vocabulary import PRE_REPLAY, ForwardMode
from warpolicy.runtime.manager import new_plugin_manager, open_platform
from warpolicy.runtime.observers import Observers
from warpolicy.runtime.runners import PrefillRunner

EXTEND = ForwardMode.EXTEND
#: Buckets on both sides of the default threshold (64): two dense, one sparse.
PERBATCH_BUCKETS = (32, 64, 128)


def perbatch_config(**kw: Any) -> SyntheticConfig:
    """The synthetic config with prefill buckets `PERBATCH_BUCKETS` (enough rows and positions
    that a 128-token batch reads a spread of slots)."""
    kw.setdefault("buckets", {EXTEND: PERBATCH_BUCKETS})
    kw.setdefault("reqs", 16)
    kw.setdefault("ctx", 32)
    return SyntheticConfig(**kw)


class PerBatchModel(SyntheticModel):
    """The synthetic prefill whose shared reads move with the batch (module docstring)."""

    def __init__(self, cfg: SyntheticConfig, device: Any, threshold: int = THRESHOLD) -> None:
        super().__init__(Layout(snapshot=True), cfg, torch.device(device))
        self.threshold = threshold
        #: per bucket: whether this batch's snapshot was built (a device flag the graph reads)
        self.flags: dict[int, torch.Tensor] = {}
        #: the action plugin `make_perbatch` registered (its counts say what the hook did)
        self.plugin: SnapshotAction | None = None

    def prepare_bucket(self, bucket: int) -> None:
        super().prepare_bucket(bucket)
        if bucket not in self.flags:
            self.flags[bucket] = torch.zeros(1, dtype=torch.bool, device=self.device)

    def host_prep(self, batch: torch.Tensor, bucket: int) -> None:
        s = self.static[bucket]
        n = int(batch.shape[0])
        self.last_bucket = bucket
        s.rows[:n].copy_(batch[:, 0])
        s.pos[:n].copy_(batch[:, 1])
        s.rows[n:].zero_()
        s.pos[n:].zero_()
        torch.add(s.rows * self.cfg.ctx, s.pos, out=s.flat)
        self.flags[bucket].fill_(False)  # each batch builds its own snapshot, or reads live
        if bucket <= self.threshold:  # dense: host-side metadata init, before the release
            self._prep(s, 0, bucket)

    def snapshot(self, bucket: int) -> None:
        """The per-batch action: copy this batch's shared reads (on the current, forward,
        stream, before the release) and tell the graph to use the copy."""
        self._prep(self.static[bucket], 0, bucket)
        self.flags[bucket].fill_(True)

    def forward(self, bucket: int) -> torch.Tensor:
        if bucket > self.threshold:  # sparse: the live lookup unless snapshotted
            s = self.static[bucket]
            flag = self.flags[bucket]
            live = self.req_to_token.view(-1).index_select(0, s.flat)
            live_swa = self.full_to_swa.index_select(0, live)
            s.loc.copy_(torch.where(flag, s.loc, live))
            s.swa_loc.copy_(torch.where(flag, s.swa_loc, live_swa))
        return super().forward(bucket)


def _runner(
    policy: Any, platform: Any, observers: Observers, label: str, model: Any
) -> PrefillRunner:
    # the audit judges the declaration: no self-check demotes it behind the audit's back
    return PrefillRunner(
        model, policy, platform, label, keep_graphs=True, self_check="off", observers=observers
    )


def make_perbatch(
    platform: Any = None,
    *,
    action: str = "honest",
    threshold: int = THRESHOLD,
    config: SyntheticConfig | None = None,
    device: Any = None,
) -> AuditSubject:
    """The audit subject of the per-batch prefill with a ``action`` snapshot plugin (see
    `SnapshotAction`) on ``platform`` (default: a fresh one for ``device``). Its
    ``model.plugin`` is the action plugin (its counts say what the hook did)."""
    pm = new_plugin_manager(load_entry_points=False, environ={})
    if platform is None:
        platform = open_platform(pm, device or "cuda")
    cfg = config or perbatch_config()
    tensors = torch.device(platform.device) if platform.name == "cuda" else torch.device("cpu")
    model = PerBatchModel(cfg, tensors, threshold)
    plugin = SnapshotAction(model, action)
    pm.register(plugin, name=f"synthetic-snapshot-{action}")
    model.plugin = plugin
    policy = perbatch_policy(
        threshold, platform=platform.name, external_events=platform.external_events_supported()
    )
    label = f"perbatch_prefill[{action}]"
    return AuditSubject(
        name=label,
        model=model,
        runners={EXTEND: functools.partial(_runner, policy, platform, pm.observers, label)},
        make_batch=model.make_batch,
        platform=platform,
        declared={EXTEND: PRE_REPLAY},
        extra_outputs={"kv_pool": model.kv_pool},
    )


__all__ = ["PERBATCH_BUCKETS", "PerBatchModel", "make_perbatch", "perbatch_config"]
