"""A hybrid linear-attention decode (Qwen3-Next / Nemotron-H shape) for ``bench overlap
--factory warpolicy.bench.hybrid:decode`` and ``audit --factory``.

Layers alternate: a *linear-attention* layer reads each request's recurrent state slot,
mixes it into the hidden state and writes the updated state back (in the graph, every such
layer, so the ``recurrent_state`` reads last the whole forward); an *attention* layer reads the
KV pages the in-graph prep gathered from the page table. The in-graph prep (``graph_prep``)
reads the scheduler's metadata tables (``req_to_token``, ``seq_lens``, ``state_index``) into
the bucket's static inputs, so the ``metadata`` reads end there.

The scheduler, every step (``make_batch``, or per class through `write_class`): retires
``new_per_step`` requests and admits new ones in their request slots, rewriting their
``req_to_token`` rows and ``seq_lens`` (metadata) and initialising their recurrent state slots
(``recurrent_state``: the slot a request of the running step still reads and updates). So:

* ``{metadata: in_graph, recurrent_state: post_replay}`` with one event per class is sound and
  releases the metadata writes at the end of the prep;
* the single event (the latest class, post_replay) is sound and releases nothing early;
* a declaration that omits ``recurrent_state`` (``in_graph`` for everything) corrupts: the new
  requests' state is written while the forward still reads and updates those slots.

Torch ops only (runs on CUDA, and on CPU under the simulated platform for tests).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from warpolicy.audit.subject import AuditSubject
from warpolicy.bench.class_decode import OneBucketDecode, class_decode_subject, positive
from warpolicy.registry.vocabulary import IN_GRAPH, POST_REPLAY, ForwardMode, WarReadDonePolicy
from warpolicy.runtime.platforms import Platform
from warpolicy.runtime.release import ReadDone

DECODE = ForwardMode.DECODE

#: What the shape's reads really are, per class (what the GPU proof supports).
DECLARED_CLASSES: Mapping[str, WarReadDonePolicy] = {
    "metadata": IN_GRAPH,
    "recurrent_state": POST_REPLAY,
}

#: Which class each shared buffer belongs to.
BUFFER_CLASSES: Mapping[str, str] = {
    "req_to_token": "metadata",
    "seq_lens": "metadata",
    "state_index": "metadata",
    "state": "recurrent_state",
}


@attrs.frozen
class HybridConfig:
    """Sizes of the hybrid decode (the defaults: ~0.5 ms per step on an H100)."""

    hidden: int = attrs.field(default=1024, validator=positive)
    ffn: int = attrs.field(default=4096, validator=positive)
    layers: int = attrs.field(default=16, validator=positive)  # even: linear, odd: attention
    batch: int = attrs.field(default=32, validator=positive)
    ctx: int = attrs.field(default=256, validator=positive)
    new_per_step: int = attrs.field(default=4, validator=positive)
    seed: int = 0
    dtype: str = "float32"

    def __attrs_post_init__(self) -> None:
        if self.new_per_step > self.batch:
            raise ValueError("new_per_step must not exceed batch")

    @property
    def kv_slots(self) -> int:
        return self.batch * self.ctx * 2 + 1


class HybridDecode(OneBucketDecode):
    """The hybrid decode as a `ModelAdapter` (one bucket: ``batch``)."""

    BUFFER_CLASSES = BUFFER_CLASSES
    cfg: HybridConfig

    def __init__(self, cfg: HybridConfig, device: Any) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        dtype = getattr(torch, cfg.dtype)
        gen = torch.Generator(device="cpu").manual_seed(cfg.seed)
        scale = 1.0 / math.sqrt(cfg.hidden)

        def weight(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen) * scale).to(self.device, dtype)

        h, b = cfg.hidden, cfg.batch
        self.embed = weight(b, h) * math.sqrt(cfg.hidden)
        self.w_mix = [weight(h, h) for _ in range(cfg.layers)]
        self.w_up = [weight(h, cfg.ffn) for _ in range(cfg.layers)]
        self.w_down = [weight(cfg.ffn, h) * (math.sqrt(cfg.hidden) / math.sqrt(cfg.ffn))]
        self.w_down = self.w_down * cfg.layers
        self.kv = weight(cfg.kv_slots, h) * math.sqrt(cfg.hidden)
        # scheduler-shared state: metadata tables and the recurrent state slots
        self.req_to_token = torch.randint(
            1, cfg.kv_slots, (b, cfg.ctx), generator=gen, dtype=torch.int64
        ).to(self.device)
        self.seq_lens = torch.randint(cfg.ctx // 2, cfg.ctx + 1, (b,), generator=gen).to(
            self.device
        )
        self.state_index = torch.randperm(b, generator=gen).to(self.device)
        self.state = (torch.randn(b, h, generator=gen) * 0.1).to(self.device, dtype)
        self._buckets: dict[int, dict[str, torch.Tensor]] = {}
        self._plans: dict[int, dict[str, torch.Tensor]] = {}

    # -- ModelAdapter ---------------------------------------------------------------------------

    @property
    def shared_buffers(self) -> Mapping[str, torch.Tensor]:
        return {
            "req_to_token": self.req_to_token,
            "seq_lens": self.seq_lens,
            "state_index": self.state_index,
            "state": self.state,
        }

    @property
    def extra_outputs(self) -> Mapping[str, torch.Tensor]:
        """The recurrent state the step updates (compared by the audit besides the output)."""
        return {"state": self.state}

    def prepare_bucket(self, bucket: int) -> None:
        if bucket in self._buckets:
            return
        cfg, dev = self.cfg, self.device
        self._buckets[bucket] = {
            "req": torch.zeros(bucket, dtype=torch.int64, device=dev),
            "slots": torch.arange(bucket, dtype=torch.int64, device=dev) % cfg.batch,
            "locs": torch.ones(bucket, cfg.ctx, dtype=torch.int64, device=dev),
            "lens": torch.full((bucket,), cfg.ctx, dtype=torch.int64, device=dev),
            "positions": torch.arange(cfg.ctx, device=dev),
            "out": torch.zeros(bucket, cfg.hidden, dtype=self.state.dtype, device=dev),
        }

    def graph_prep(self, bucket: int) -> None:
        """The in-graph metadata prep: every read of the metadata tables."""
        s = self._buckets[bucket]
        req = s["req"]
        s["slots"].copy_(self.state_index.index_select(0, req))
        s["locs"].copy_(self.req_to_token.index_select(0, req))
        s["lens"].copy_(self.seq_lens.index_select(0, req))

    def forward(self, bucket: int) -> torch.Tensor:
        s = self._buckets[bucket]
        slots, locs = s["slots"], s["locs"]
        mask = s["positions"][None, :] < s["lens"][:, None]
        x = self.embed.index_select(0, s["req"] % self.cfg.batch)
        for layer in range(self.cfg.layers):
            if layer % 2 == 0:  # linear attention: read, mix and update the recurrent state
                h = self.state.index_select(0, slots)
                y = torch.tanh(x @ self.w_mix[layer] + h)
                self.state.index_copy_(0, slots, 0.5 * h + 0.5 * y)
                x = y
            else:  # attention over the pages the prep gathered
                x = self.attend(layer, x, locs.reshape(-1), mask)
            x = self.feed_forward(layer, x)
        s["out"].copy_(x)
        return s["out"]

    # -- the scheduler --------------------------------------------------------------------------

    def _plan(self, step: int) -> dict[str, torch.Tensor]:
        plan = self._plans.get(step)
        if plan is None:
            cfg = self.cfg
            gen = torch.Generator(device="cpu").manual_seed(cfg.seed * 1_000_003 + step + 1)
            rows = (torch.arange(cfg.new_per_step) + step * cfg.new_per_step) % cfg.batch
            plan = {
                "rows": rows.to(self.device),
                "tokens": torch.randint(
                    1, cfg.kv_slots, (cfg.new_per_step, cfg.ctx), generator=gen
                ).to(self.device),
                "lens": torch.randint(
                    cfg.ctx // 2, cfg.ctx + 1, (cfg.new_per_step,), generator=gen
                ).to(self.device),
                "init": (torch.randn(cfg.new_per_step, cfg.hidden, generator=gen) * 0.1).to(
                    self.device, self.state.dtype
                ),
                "batch": torch.arange(cfg.batch, device=self.device),
            }
            self._plans[step] = plan
        return plan

    def write_class(self, buffer_class: str, step: int, read_done: ReadDone | None = None) -> None:
        """The scheduler's writes of one class for step ``step`` (on the current stream; it
        frees nothing, so ``read_done`` goes unused)."""
        plan = self._plan(step)
        if step == 0:
            return  # the first batch runs on the state the model was built with
        rows = plan["rows"]
        if buffer_class == "metadata":
            self.req_to_token.index_copy_(0, rows, plan["tokens"])
            self.seq_lens.index_copy_(0, rows, plan["lens"])
        elif buffer_class == "recurrent_state":
            self.state.index_copy_(0, self.state_index.index_select(0, rows), plan["init"])
        else:
            raise ValueError(f"the hybrid decode writes no {buffer_class!r}")

    def batch_of(self, step: int) -> torch.Tensor:
        """The batch of ``step``: every request slot (the retired ones hold new requests)."""
        return self._plan(step)["batch"]

    def write_classes(self) -> tuple[str, ...]:
        """The classes the scheduler writes, earliest read end first."""
        return ("metadata", "recurrent_state")

    def make_batch(self, mode: ForwardMode, step: int) -> torch.Tensor:
        """Step ``step``'s writes (every class) and its batch: the request slots."""
        for buffer_class in self.write_classes():
            self.write_class(buffer_class, step)
        return self._plan(step)["batch"]


def subject(
    platform: Platform,
    config: HybridConfig | None = None,
    *,
    declared: Mapping[str, WarReadDonePolicy] | None = None,
    name: str = "hybrid-decode",
    self_check: str = "warn",
) -> AuditSubject:
    """The `AuditSubject` of the hybrid decode, its runner deciding ``declared`` per class
    (default `DECLARED_CLASSES`; the cell is the latest class) with the marker self-check
    ``self_check``."""
    cfg = config or HybridConfig()
    on_cuda = platform.name == "cuda"
    if not on_cuda and cfg == HybridConfig():
        cfg = HybridConfig(hidden=32, ffn=64, layers=4, batch=4, ctx=8, new_per_step=2)
    device = platform.device if on_cuda else "cpu"
    model = HybridDecode(cfg, device)
    return class_decode_subject(
        platform,
        model,
        declared if declared is not None else DECLARED_CLASSES,
        BUFFER_CLASSES,
        name=name,
        self_check=self_check,
    )


def decode(platform: Platform) -> AuditSubject:
    """The hybrid decode declared as it reads: metadata in_graph, recurrent state post_replay."""
    return subject(platform)


def decode_omits_recurrent(platform: Platform) -> AuditSubject:
    """The same decode declared without its recurrent state (what keeping the base declaration
    says): metadata in_graph only, with the marker self-check off (with it on, a walk that sees
    the recurrent reads after the marker demotes the declaration first). Unsound: the audit's
    trials and the canary must catch it."""
    return subject(
        platform, declared={"metadata": IN_GRAPH}, name="hybrid-decode-omits", self_check="off"
    )


__all__ = [
    "BUFFER_CLASSES",
    "DECLARED_CLASSES",
    "HybridConfig",
    "HybridDecode",
    "decode",
    "decode_omits_recurrent",
    "subject",
]
