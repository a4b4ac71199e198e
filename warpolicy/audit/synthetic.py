"""Synthetic attention backends: what ``warpolicy audit --synthetic`` audits.

Each backend is the synthetic model (`warpolicy.audit.synthetic_model`) in one `Layout`, plus a
declaration of its read end per mode, written as a registry entry would be. The variants differ
only in *where* the model reads scheduler-shared state:

============================ =========================== ======================================
name                         declares                    reads shared state
============================ =========================== ======================================
``in_graph``                 in_graph (decode, verify)   in the in-graph prep only (safe)
``pre_replay_snapshot``      pre_replay (decode, extend) in host_prep: snapshots into private
                                                         buffers; the graph reads the snapshot
``late_swa_read``            in_graph                    prep, then a late layer translates
                                                         through the LIVE ``full_to_swa`` after
                                                         the plant (the TRTLLM SWA bug shape)
``late_kv_write``            in_graph                    prep, then the KV write re-reads its
                                                         slots from the LIVE ``req_to_token``:
                                                         the returned output never shows it,
                                                         only the KV pool does
``pre_replay_reads_graph``   pre_replay                  in the in-graph prep, i.e. after the
                                                         pre-replay release
``plant_before_prep``        in_graph                    the prep runs in the forward, after
                                                         the planted node
``composite_late_child``     latest_of(dense, tbo),      the tbo child builds its micro-batch's
                             both in_graph               metadata in the forward, after the
                                                         plant
``reread_after_replay``      in_graph                    prep, then an eager kernel after
                                                         replay rereads ``req_to_token``
``first_layer_rebuild``      in_graph                    prep, then the first layer rebuilds
                                                         the metadata from the LIVE tables
                                                         (DP padding, SGLang's dots-hybrid
                                                         shape): a marker after the prep is
                                                         unsafe, derived placement releases
                                                         after the first layer
============================ =========================== ======================================

Placement (``make_synthetic(..., placement=)``, ``warpolicy audit --placement``): ``declared``
(the default) uses the registry's placement (the marker for every synthetic backend);
``marker`` and ``derived`` force one. With derived placement the runner walks each captured
graph and plants the node after the readers it finds, so every shape whose late reads are in
the graph (``late_swa_read``, ``late_kv_write``, ``plant_before_prep``,
``composite_late_child``, ``first_layer_rebuild``) is safe; ``expected_derived`` says so.
Work the graph does not contain (``reread_after_replay``) or a ``pre_replay`` declaration
(``pre_replay_reads_graph``) stays unsafe whatever the placement. The audit's runners do not
self-check (``self_check="off"``): the audit judges the declaration itself.

`make_synthetic(name, device)` returns an `AuditSubject` whose runners are built through
`warpolicy.runtime.runners` with the policy compiled from that declaration by the real engine; its
``extra_outputs`` name the KV pool, so the audit compares what the step wrote there too.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from warpolicy.audit.report import SAFE, UNSAFE, Verdict
from warpolicy.audit.subject import AuditSubject
from warpolicy.audit.synthetic_model import Layout, SyntheticConfig, SyntheticModel
from warpolicy.errors import InputError, UnknownNameError
from warpolicy.registry.decision import Context
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.model import Backend, Registry, SpecAlgorithm
from warpolicy.registry.vocabulary import (
    IN_GRAPH,
    NONE,
    PRE_REPLAY,
    ForwardMode,
    Placement,
    WarReadDonePolicy,
)
from warpolicy.runtime.manager import open_runtime
from warpolicy.runtime.runners import DecodeRunner, PrefillRunner, VerifyRunner

DECODE, EXTEND, VERIFY = ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY


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
    expected_derived: Verdict | None = None  # with derived placement (None: as ``expected``)

    def expected_with(self, placement: Placement | None) -> Verdict:
        """What the audit must find with ``placement`` (None: the declared one, the marker)."""
        if placement is Placement.DERIVED and self.expected_derived is not None:
            return self.expected_derived
        return self.expected

    def registry(self) -> Registry:
        """The declaration as registry entries (a composite takes the latest of its children)."""
        backends = {n: Backend(n, reads_end=r) for n, r in self.children.items()}
        backends[self.name] = Backend(
            self.name, reads_end=self.reads_end, latest_of=tuple(self.children)
        )
        return Registry(
            backends=backends,
            spec_algorithms={"none": SpecAlgorithm("none")},
            sources=(f"<synthetic {self.name}>",),
        )


_DECODE_VERIFY_IN_GRAPH = {DECODE: IN_GRAPH, VERIFY: IN_GRAPH}
_PRE_REPLAY = {DECODE: PRE_REPLAY, EXTEND: PRE_REPLAY}

_BACKENDS: tuple[SyntheticBackend, ...] = (
    SyntheticBackend(
        "in_graph", "all shared reads in the in-graph prep", Layout(), _DECODE_VERIFY_IN_GRAPH
    ),
    SyntheticBackend(
        "pre_replay_snapshot",
        "host_prep snapshots shared state into private buffers; the graph reads only the snapshot",
        Layout(snapshot=True),
        _PRE_REPLAY,
    ),
    SyntheticBackend(
        "late_swa_read",
        "a late layer translates the KV location through the live "
        "full-to-SWA mapping after the plant (the TRTLLM SWA bug shape)",
        Layout(late_swa=True),
        _DECODE_VERIFY_IN_GRAPH,
        expected=UNSAFE,
        static_visible=True,
        offender_hint="index",
        expected_derived=SAFE,
    ),
    SyntheticBackend(
        "late_kv_write",
        "the KV write re-reads its slots from the live "
        "request-to-token table after the plant; only the KV pool shows it",
        Layout(late_kv_write=True),
        _DECODE_VERIFY_IN_GRAPH,
        expected=UNSAFE,
        static_visible=True,
        offender_hint="index",
        expected_derived=SAFE,
    ),
    SyntheticBackend(
        "pre_replay_reads_graph",
        "declares pre_replay but the graph's prep reads shared state",
        Layout(),
        _PRE_REPLAY,
        expected=UNSAFE,
        static_visible=True,
        offender_hint="index",
    ),
    SyntheticBackend(
        "plant_before_prep",
        "the read-done node is planted before the metadata prep (the prep runs in the forward)",
        Layout(prep_in_forward=True),
        _DECODE_VERIFY_IN_GRAPH,
        expected=UNSAFE,
        static_visible=True,
        offender_hint="index",
        expected_derived=SAFE,
    ),
    SyntheticBackend(
        "composite_late_child",
        "a composite of two in_graph children whose tbo "
        "child builds its micro-batch's metadata after the plant",
        Layout(split_prep=True),
        children={
            "composite_dense_child": _DECODE_VERIFY_IN_GRAPH,
            "composite_tbo_child": _DECODE_VERIFY_IN_GRAPH,
        },
        expected=UNSAFE,
        static_visible=True,
        offender_hint="index",
        expected_derived=SAFE,
    ),
    SyntheticBackend(
        "reread_after_replay",
        "declares in_graph, but an eager kernel after replay rereads req_to_token",
        Layout(reread_after_replay=True),
        _DECODE_VERIFY_IN_GRAPH,
        expected=UNSAFE,
    ),
    SyntheticBackend(
        "first_layer_rebuild",
        "the first layer rebuilds the metadata from the "
        "live tables (DP padding); a marker after the prep releases too early, "
        "derived placement after the first layer",
        Layout(first_layer_rebuild=True),
        _DECODE_VERIFY_IN_GRAPH,
        expected=UNSAFE,
        static_visible=True,
        offender_hint="index",
        expected_derived=SAFE,
    ),
)

#: ``--placement`` values: the registry's own placement, or one forced.
PLACEMENT_CHOICES = ("declared", "marker", "derived")
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
# Building an audit subject
# ---------------------------------------------------------------------------------------------


def _tensor_device(platform: Any) -> torch.device:
    if platform.name == "cuda":
        return torch.device(platform.device)
    return torch.device("cpu")


def parse_placement(text: str | None) -> Placement | None:
    """``declared`` / None -> None (the registry's own); ``marker`` / ``derived`` -> forced."""
    if text is None or text == "declared":
        return None
    if isinstance(text, Placement):
        return text
    if text not in PLACEMENT_CHOICES:
        raise InputError(f"--placement must be one of {', '.join(PLACEMENT_CHOICES)}, not {text!r}")
    return Placement(text)


def _runner(
    mode: ForwardMode,
    policy: Any,
    platform: Any,
    name: str,
    cfg: SyntheticConfig,
    placement: Placement | None,
    model: Any,
) -> Any:
    label = f"{name}:{mode.label}"
    # the audit judges the declaration: no self-check demotes it behind the audit's back
    kw: dict[str, Any] = {"keep_graphs": True, "placement": placement, "self_check": "off"}
    if mode == VERIFY:
        return VerifyRunner(model, policy, platform, label, draft_tokens=cfg.draft_tokens, **kw)
    cls = PrefillRunner if mode == EXTEND else DecodeRunner
    return cls(model, policy, platform, label, **kw)


def make_synthetic(
    name: str,
    device: Any = None,
    *,
    platform: Any = None,
    config: SyntheticConfig | None = None,
    placement: str | None = None,
) -> AuditSubject:
    """The audit subject of synthetic backend ``name`` on ``device`` (or ``platform``), with
    ``placement`` ``declared`` (None), ``marker`` or ``derived``; a derived subject's name
    ends in ``@derived``."""
    backend = synthetic_backend(name)
    forced = parse_placement(placement)
    if platform is None:
        platform = open_runtime(device).platform
    cfg = config or SyntheticConfig()
    model = SyntheticModel(backend.layout, cfg, _tensor_device(platform))
    engine = PolicyEngine(backend.registry(), environ={})
    policy = engine.compile(
        backend.name,
        "none",
        platform=platform.name,
        external_events=platform.external_events_supported(),
        strict=True,
    )
    # the declaration under audit: what the registry says with the node planted on CUDA
    declared = {m: engine.decide(Context(backend.name, m)) for m in (DECODE, EXTEND, VERIFY)}
    modes = [m for m, p in declared.items() if p != NONE]
    label = backend.name + ("@derived" if forced is Placement.DERIVED else "")
    return AuditSubject(
        name=label,
        model=model,
        runners={
            m: functools.partial(_runner, m, policy, platform, label, cfg, forced) for m in modes
        },
        make_batch=model.make_batch,
        platform=platform,
        declared={m: declared[m] for m in modes},
        post_step=model.reread if backend.layout.reread_after_replay else None,
        extra_outputs={"kv_pool": model.kv_pool},
    )
