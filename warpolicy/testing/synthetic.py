"""Synthetic attention backends for the audit's self-test and demos.

Each backend is a tiny decode-like model over two scheduler-shared tables, ``req_to_token``
(request row x position -> KV slot) and ``full_to_swa`` (full KV slot -> sliding-window slot),
plus a declaration of its read end per mode, written as a registry entry would be. The model's
metadata prep translates each token to its full slot (through ``req_to_token``) and then to its
SWA slot (through ``full_to_swa``); the forward gathers KV rows at those slots and runs a few
layers. The variants differ only in *where* those shared reads happen:

============================ ========================== =======================================
name                         declares                   reads shared state
============================ ========================== =======================================
``in_graph``                 in_graph (decode, verify)  in the in-graph prep only (safe)
``pre_replay_snapshot``      pre_replay (decode, extend) in host_prep: snapshots into private
                                                        buffers; the graph reads the snapshot
``late_swa_read``            in_graph                   prep, then a late layer translates
                                                        through the LIVE ``full_to_swa`` after
                                                        the plant (TRTLLM SWA, sglang #32460)
``pre_replay_reads_graph``   pre_replay                 in the in-graph prep, i.e. after the
                                                        pre-replay release
``plant_before_prep``        in_graph                   the prep runs in the forward, after the
                                                        planted node
``composite_late_child``     latest_of(dense, tbo),     the tbo child builds its micro-batch's
                             both in_graph              metadata in the forward, after the plant
``reread_after_replay``      in_graph                   prep, then an eager kernel after replay
                                                        rereads ``req_to_token``
============================ ========================== =======================================

`make_synthetic(name, device)` returns an `AuditSubject` whose runners are built through
`warpolicy.runners` with the policy compiled from that declaration by the real engine.
"""

from __future__ import annotations

import functools
import zlib
from typing import Any, Mapping, Optional, Sequence

import attrs
import torch

from warpolicy.audit.dynamic import AuditSubject
from warpolicy.audit.report import SAFE, UNSAFE, Verdict
from warpolicy.engine import Context, PolicyEngine
from warpolicy.errors import UnknownNameError
from warpolicy.policy import ForwardMode, WarReadDonePolicy
from warpolicy.registry import Backend, Registry, SpecAlgorithm

DECODE, EXTEND, VERIFY = ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY
PRE_REPLAY = WarReadDonePolicy.PRE_REPLAY
IN_GRAPH = WarReadDonePolicy.IN_GRAPH


@attrs.frozen
class SyntheticConfig:
    """Sizes of the synthetic model (small: the audit runs many trials)."""

    reqs: int = 8  # rows of req_to_token
    ctx: int = 16  # positions per row
    swa_slots: int = 64
    hidden: int = 64
    layers: int = 4
    seed: int = 0
    draft_tokens: int = 2
    buckets: Mapping[ForwardMode, tuple[int, ...]] = attrs.field(factory=lambda: {
        DECODE: (4, 8), EXTEND: (16, 32), VERIFY: (8, 16)})


@attrs.frozen
class Layout:
    """Where the model reads shared state (the only thing the variants change)."""

    snapshot: bool = False  # the full prep runs in host_prep (out of graph, before release)
    prep_in_forward: bool = False  # the full prep runs after the plant
    split_prep: bool = False  # second micro-batch's prep runs after the plant (composite)
    late_swa: bool = False  # a late layer translates through the live full_to_swa
    reread_after_replay: bool = False  # post_step rereads req_to_token eagerly


@attrs.frozen
class SyntheticBackend:
    """One synthetic backend: its declaration, its layout and what the audit must find."""

    name: str
    doc: str
    layout: Layout
    reads_end: Mapping[ForwardMode, WarReadDonePolicy] = attrs.field(factory=dict)
    children: Mapping[str, Mapping[ForwardMode, WarReadDonePolicy]] = attrs.field(factory=dict)
    expected: Verdict = SAFE
    static_visible: bool = False  # the static audit can name the late reader
    offender_hint: str = ""  # a substring of the late reader's kernel name

    def registry(self) -> Registry:
        """The declaration as registry entries (a composite takes the latest of its children)."""
        backends = {n: Backend(n, reads_end=r) for n, r in self.children.items()}
        backends[self.name] = Backend(self.name, reads_end=self.reads_end,
                                      latest_of=tuple(self.children))
        return Registry(backends=backends, spec_algorithms={"none": SpecAlgorithm("none")},
                        sources=(f"<synthetic {self.name}>",))


_DECODE_VERIFY_IN_GRAPH = {DECODE: IN_GRAPH, VERIFY: IN_GRAPH}
_PRE_REPLAY = {DECODE: PRE_REPLAY, EXTEND: PRE_REPLAY}

_BACKENDS: tuple[SyntheticBackend, ...] = (
    SyntheticBackend("in_graph", "all shared reads in the in-graph prep", Layout(),
                     _DECODE_VERIFY_IN_GRAPH),
    SyntheticBackend("pre_replay_snapshot", "host_prep snapshots shared state into private "
                     "buffers; the graph reads only the snapshot", Layout(snapshot=True),
                     _PRE_REPLAY),
    SyntheticBackend("late_swa_read", "a late layer translates the KV location through the live "
                     "full-to-SWA mapping after the plant (TRTLLM SWA bug, sglang #32460)",
                     Layout(late_swa=True), _DECODE_VERIFY_IN_GRAPH, expected=UNSAFE,
                     static_visible=True, offender_hint="index"),
    SyntheticBackend("pre_replay_reads_graph", "declares pre_replay but the graph's prep reads "
                     "shared state", Layout(), _PRE_REPLAY, expected=UNSAFE,
                     static_visible=True, offender_hint="index"),
    SyntheticBackend("plant_before_prep", "the read-done node is planted before the metadata "
                     "prep (the prep runs in the forward)", Layout(prep_in_forward=True),
                     _DECODE_VERIFY_IN_GRAPH, expected=UNSAFE, static_visible=True,
                     offender_hint="index"),
    SyntheticBackend("composite_late_child", "a composite of two in_graph children whose tbo "
                     "child builds its micro-batch's metadata after the plant",
                     Layout(split_prep=True),
                     children={"composite_dense_child": _DECODE_VERIFY_IN_GRAPH,
                               "composite_tbo_child": _DECODE_VERIFY_IN_GRAPH},
                     expected=UNSAFE, static_visible=True, offender_hint="index"),
    SyntheticBackend("reread_after_replay", "declares in_graph, but an eager kernel after replay "
                     "rereads req_to_token", Layout(reread_after_replay=True),
                     _DECODE_VERIFY_IN_GRAPH, expected=UNSAFE),
)
_BY_NAME = {b.name: b for b in _BACKENDS}


def synthetic_names() -> list[str]:
    """Every synthetic backend, safe ones first."""
    return [b.name for b in _BACKENDS]


def synthetic_backend(name: str) -> SyntheticBackend:
    """The description of a synthetic backend; `UnknownNameError` for an unknown name."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnknownNameError("synthetic backend", name, synthetic_names()) from None


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------

class _Static:
    """A bucket's static inputs, metadata and output."""

    def __init__(self, n: int, hidden: int, device: torch.device) -> None:
        z = lambda: torch.zeros(n, dtype=torch.long, device=device)  # noqa: E731
        self.rows, self.pos, self.flat, self.loc, self.swa_loc = z(), z(), z(), z(), z()
        self.out = torch.zeros(n, hidden, device=device)


class SyntheticModel:
    """The `ModelAdapter` of a synthetic backend (see the module docstring).

    A batch is an ``[n, 2]`` int64 tensor of (request row, position), on the model's device.
    Padding rows are (0, 0), a valid entry, so padded tokens read shared state too.
    """

    def __init__(self, layout: Layout, cfg: SyntheticConfig, device: torch.device) -> None:
        self.layout = layout
        self.cfg = cfg
        self.device = device
        g = torch.Generator().manual_seed(cfg.seed)
        slots = cfg.reqs * cfg.ctx
        self.req_to_token = torch.randperm(slots, generator=g).view(cfg.reqs, cfg.ctx).to(device)
        self.full_to_swa = torch.randint(0, cfg.swa_slots, (slots,), generator=g).to(device)
        self.shared_buffers = {"req_to_token": self.req_to_token, "full_to_swa": self.full_to_swa}
        self.k_full = torch.randn(slots, cfg.hidden, generator=g).to(device)
        self.k_swa = torch.randn(cfg.swa_slots, cfg.hidden, generator=g).to(device)
        scale = cfg.hidden ** -0.5
        self.weights = [(torch.randn(cfg.hidden, cfg.hidden, generator=g) * scale).to(device)
                        for _ in range(cfg.layers)]
        self.static: dict[int, _Static] = {}
        self.last_bucket: Optional[int] = None

    # -- ModelAdapter ------------------------------------------------------------------------

    def bucket_sizes(self, mode: ForwardMode) -> Sequence[int]:
        return self.cfg.buckets.get(ForwardMode.parse(mode), ())

    def batch_size(self, batch: torch.Tensor) -> int:
        return int(batch.shape[0])

    def prepare_bucket(self, bucket: int) -> None:
        if bucket not in self.static:
            self.static[bucket] = _Static(bucket, self.cfg.hidden, self.device)

    def host_prep(self, batch: torch.Tensor, bucket: int) -> None:
        s = self.static[bucket]
        n = int(batch.shape[0])
        s.rows[:n].copy_(batch[:, 0])
        s.pos[:n].copy_(batch[:, 1])
        s.rows[n:].zero_()
        s.pos[n:].zero_()
        self.last_bucket = bucket
        if self.layout.snapshot:  # host-side metadata init: snapshot before the release
            self._prep(s, 0, bucket)

    def graph_prep(self, bucket: int) -> None:
        s = self.static[bucket]
        lay = self.layout
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
        h = self.k_full.index_select(0, s.loc)
        for i, w in enumerate(self.weights):
            h = torch.tanh(h @ w)
            if i == len(self.weights) - 1:
                swa = (self.full_to_swa.index_select(0, s.loc) if lay.late_swa  # live map
                       else s.swa_loc)
                h = h + self.k_swa.index_select(0, swa)
        s.out.copy_(h)
        return s.out

    # -- shared reads ------------------------------------------------------------------------

    def _prep(self, s: _Static, start: int, end: int) -> None:
        """Metadata prep of tokens ``[start, end)``: the reads of shared state."""
        if end <= start:
            return
        flat = s.flat[start:end]
        torch.add(s.rows[start:end] * self.cfg.ctx, s.pos[start:end], out=flat)
        torch.index_select(self.req_to_token.view(-1), 0, flat, out=s.loc[start:end])
        if not self.layout.late_swa:
            torch.index_select(self.full_to_swa, 0, s.loc[start:end], out=s.swa_loc[start:end])

    def reread(self, mode: ForwardMode, batch: Any, out: torch.Tensor) -> torch.Tensor:
        """The eager post-replay work of ``reread_after_replay``: it reads the live table."""
        s = self.static[self.last_bucket] if self.last_bucket is not None else None
        if s is None or out.shape[0] != s.out.shape[0]:
            return out
        slots = self.req_to_token.view(-1).index_select(0, s.flat)
        return out + 1e-3 * slots.to(out.dtype).unsqueeze(1)

    # -- batches -----------------------------------------------------------------------------

    def make_batch(self, mode: ForwardMode, trial: int) -> torch.Tensor:
        """A deterministic batch for ``trial``: sizes vary across trials and buckets."""
        mode = ForwardMode.parse(mode)
        sizes = self.bucket_sizes(mode)
        largest = max(sizes) if sizes else 1
        g = torch.Generator().manual_seed(zlib.crc32(f"{mode.label}:{trial}".encode()))
        if mode == VERIFY:
            bs = int(torch.randint(1, largest // self.cfg.draft_tokens + 1, (1,), generator=g))
            n = bs * self.cfg.draft_tokens
        else:
            n = int(torch.randint(1, largest + 1, (1,), generator=g))
        rows = torch.randint(0, self.cfg.reqs, (n,), generator=g)
        pos = torch.randint(0, self.cfg.ctx, (n,), generator=g)
        return torch.stack([rows, pos], dim=1).to(self.device)


# ---------------------------------------------------------------------------------------------
# Building an audit subject
# ---------------------------------------------------------------------------------------------

def _tensor_device(platform: Any) -> torch.device:
    if platform.name == "cuda":
        return torch.device(platform.device)
    return torch.device("cpu")


def _runner(mode: ForwardMode, policy: Any, platform: Any, name: str, cfg: SyntheticConfig,
            model: Any) -> Any:
    from warpolicy.runners import DecodeRunner, PrefillRunner, VerifyRunner

    label = f"{name}:{mode.label}"
    if mode == VERIFY:
        return VerifyRunner(model, policy, platform, label, draft_tokens=cfg.draft_tokens,
                            keep_graphs=True)
    cls = PrefillRunner if mode == EXTEND else DecodeRunner
    return cls(model, policy, platform, label, keep_graphs=True)


def make_synthetic(name: str, device: Any = None, *, platform: Any = None,
                   config: Optional[SyntheticConfig] = None) -> AuditSubject:
    """The audit subject of synthetic backend ``name`` on ``device`` (or ``platform``)."""
    backend = synthetic_backend(name)
    if platform is None:
        from warpolicy.platform import Platform

        platform = Platform.for_device(device)
    cfg = config or SyntheticConfig()
    model = SyntheticModel(backend.layout, cfg, _tensor_device(platform))
    engine = PolicyEngine(backend.registry(), environ={})
    policy = engine.compile(backend.name, "none", platform=platform.name,
                            external_events=platform.external_events_supported(), strict=True)
    # the declaration under audit: what the registry says with the node planted on CUDA
    declared = {m: engine.decide(Context(backend.name, m)) for m in (DECODE, EXTEND, VERIFY)}
    modes = [m for m, p in declared.items() if p != WarReadDonePolicy.NONE]
    return AuditSubject(
        name=backend.name,
        model=model,
        runners={m: functools.partial(_runner, m, policy, platform, backend.name, cfg)
                 for m in modes},
        make_batch=model.make_batch,
        platform=platform,
        declared={m: declared[m] for m in modes},
        post_step=model.reread if backend.layout.reread_after_replay else None,
    )
