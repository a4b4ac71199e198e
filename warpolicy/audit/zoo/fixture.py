"""The zoo's fixtures: each a bug shape from a public report, with a buggy and a fixed variant.

A `ZooFixture` names the report, the model (a `warpolicy.audit.zoo.model.ZooModel` subclass whose
``buggy`` flag moves the shared read) and the registry each variant declares. `make_subject`
turns one variant into an `AuditSubject` whose runner is compiled from that registry by the
real engine, so ``warpolicy audit``'s dynamic and static audits and the WAR canary judge it like
any backend. ``FIXTURES`` lists them in the order the table prints.

The runners do not self-check (``self_check="off"``): the zoo judges the declaration, as the
synthetic backends do. They get the zoo's `RaceWidener` as their ``widen_race_us`` (on: the
graphs spin at their release points, `warpolicy.runtime.runners.widen`; off: off, whatever the
environment says).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import torch

from warpolicy.audit.subject import AuditSubject
from warpolicy.audit.zoo.hybrid import RecurrentStateReplay, WrapperOneChild
from warpolicy.audit.zoo.model import ZooModel
from warpolicy.audit.zoo.peers import EncoderRingNoWait, PinnedStagingReuse
from warpolicy.audit.zoo.sglang import (
    DraftExtendEarlyPublish,
    LiveMappingReread,
    RequestPoolReuse,
    SwaMappingRecovery,
)
from warpolicy.errors import UnknownNameError
from warpolicy.registry.decision import Context
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.model import Backend, Registry, SpecAlgorithm
from warpolicy.registry.vocabulary import (
    IN_GRAPH,
    POST_REPLAY,
    PRE_REPLAY,
    ForwardMode,
    WarReadDonePolicy,
)
from warpolicy.runtime.runners import DecodeRunner, DraftExtendRunner, PrefillRunner
from warpolicy.runtime.runners.widen import RaceWidener

DECODE, EXTEND, DRAFT_EXTEND = ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.DRAFT_EXTEND

#: The variants of every fixture, in the order the table prints them.
VARIANTS = ("buggy", "fixed")

DeclareFn = Callable[[str, bool], Registry]  # (backend name, buggy) -> the registry


def _registry(backends: Mapping[str, Backend], name: str) -> Registry:
    return Registry(
        backends=dict(backends),
        spec_algorithms={"none": SpecAlgorithm("none")},
        sources=(f"<zoo {name}>",),
    )


@attrs.frozen
class Declares:
    """One backend declaring ``mode``'s read end: ``buggy`` in the buggy variant, ``fixed`` in
    the fixed one (a frozen record, so a fixture pickles into an isolated audit process)."""

    mode: ForwardMode
    buggy: WarReadDonePolicy
    fixed: WarReadDonePolicy

    def __call__(self, name: str, is_buggy: bool) -> Registry:
        policy = self.buggy if is_buggy else self.fixed
        return _registry({name: Backend(name, reads_end={self.mode: policy})}, name)


def wrapper_declares(name: str, is_buggy: bool) -> Registry:
    """The wrapper over a primary (in_graph) and an indexer (post_replay) child: the buggy one
    declares the primary's read end itself, the fixed one takes the latest of both."""
    primary = Backend(f"{name}_primary", reads_end={DECODE: IN_GRAPH})
    indexer = Backend(f"{name}_indexer", reads_end={DECODE: POST_REPLAY})
    wrapper = (
        Backend(name, reads_end={DECODE: IN_GRAPH})
        if is_buggy
        else Backend(name, latest_of=(primary.name, indexer.name))
    )
    return _registry({b.name: b for b in (primary, indexer, wrapper)}, name)


@attrs.frozen
class ZooFixture:
    """One bug shape: the report it reproduces and how each variant is built."""

    name: str
    report: str  # the public report, as REFERENCE.md cites it ("SGLang #18803")
    shape: str  # one line: what goes wrong
    model: Callable[[Any, bool], ZooModel]  # (device, buggy) -> the model
    mode: ForwardMode
    declares: DeclareFn
    runner: Callable[..., Any] = DecodeRunner
    post_step: bool = False  # the step runs eager work after replay (`LiveMappingReread`)
    #: whether the graph walk can name the buggy variant's late reader on CUDA (False: the read
    #: is eager work after replay, invisible to any walk of the graph)
    static_visible: bool = True

    def registry(self, buggy: bool) -> Registry:
        return self.declares(self.name, buggy)


FIXTURES: tuple[ZooFixture, ...] = (
    ZooFixture(
        "req_pool_reuse",
        "SGLang #18803",
        "a request's pool row is reused while the forward still reads it",
        RequestPoolReuse,
        DECODE,
        Declares(DECODE, IN_GRAPH, IN_GRAPH),
    ),
    ZooFixture(
        "swa_mapping_recovery",
        "SGLang #31687",
        "a late layer recovers SWA slots through the live full_to_swa (a -1 sentinel at its end)",
        SwaMappingRecovery,
        DECODE,
        Declares(DECODE, IN_GRAPH, IN_GRAPH),
    ),
    ZooFixture(
        "live_mapping_reread",
        "SGLang #32460",
        "the SWA KV write after replay translates through the live mapping again",
        LiveMappingReread,
        DECODE,
        Declares(DECODE, IN_GRAPH, IN_GRAPH),
        post_step=True,
        static_visible=False,
    ),
    ZooFixture(
        "draft_extend_early_publish",
        "SGLang #37988",
        "the draft extend publishes before its replay; its graph gathers req_to_token",
        DraftExtendEarlyPublish,
        DRAFT_EXTEND,
        Declares(DRAFT_EXTEND, PRE_REPLAY, POST_REPLAY),
        runner=DraftExtendRunner,
    ),
    ZooFixture(
        "encoder_ring_no_wait",
        "vLLM #53057",
        "an encoder-only step reuses a host-visible input ring slot without a wait",
        EncoderRingNoWait,
        EXTEND,
        Declares(EXTEND, PRE_REPLAY, IN_GRAPH),
        runner=PrefillRunner,
    ),
    ZooFixture(
        "pinned_staging_reuse",
        "TensorRT-LLM #15546",
        "a pinned staging buffer is rewritten while its copy to the device is pending",
        PinnedStagingReuse,
        DECODE,
        Declares(DECODE, IN_GRAPH, IN_GRAPH),
    ),
    ZooFixture(
        "recurrent_state_replay",
        "miles #1726, vLLM #51599",
        "linear-attention layers read recurrent state slots during the replay",
        RecurrentStateReplay,
        DECODE,
        Declares(DECODE, IN_GRAPH, POST_REPLAY),
    ),
    ZooFixture(
        "wrapper_one_child",
        "REFERENCE 1f (a fork's wrapper)",
        "a wrapper runs two children but declares only the primary's read end",
        WrapperOneChild,
        DECODE,
        wrapper_declares,
    ),
)

_BY_NAME = {f.name: f for f in FIXTURES}


def fixture_names() -> list[str]:
    return [f.name for f in FIXTURES]


def zoo_fixture(name: str) -> ZooFixture:
    """The fixture called ``name``; `UnknownNameError` (with close matches) otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnknownNameError("zoo fixture", name, fixture_names()) from None


def _device(platform: Any) -> torch.device:
    return torch.device(platform.device) if platform.name == "cuda" else torch.device("cpu")


@attrs.frozen
class Built:
    """One variant built on a platform: the subject and what the canary trial needs."""

    subject: AuditSubject
    model: ZooModel
    policy: Any  # the compiled policy (a `NamedPolicy`: the canary's cell names the backend)
    build_runner: Callable[..., Any]  # (model, **kw) -> an uncaptured runner


def make_subject(
    fixture: ZooFixture,
    buggy: bool,
    platform: Any,
    widener: RaceWidener | None = None,
) -> Built:
    """``fixture``'s buggy (or fixed) variant on ``platform``, its runner widened by
    ``widener`` when that is on. The subject is named ``NAME:buggy`` / ``NAME:fixed``."""
    variant = VARIANTS[0] if buggy else VARIANTS[1]
    label = f"{fixture.name}:{variant}"
    model = fixture.model(_device(platform), buggy)
    engine = PolicyEngine(fixture.registry(buggy), environ={})
    policy = engine.compile(
        fixture.name,
        "none",
        platform=platform.name,
        external_events=platform.external_events_supported(),
        strict=True,
    )
    declared = engine.decide(Context(fixture.name, fixture.mode))
    widen = widener if widener is not None else RaceWidener()
    build = functools.partial(_runner, fixture, policy, platform, label, widen)
    post_step = model.post_step if fixture.post_step else None
    subject = AuditSubject(
        name=label,
        model=model,
        runners={fixture.mode: build},
        make_batch=model.make_batch,
        platform=platform,
        declared={fixture.mode: declared},
        post_step=post_step,
        extra_outputs=dict(model.written),
    )
    return Built(subject, model, policy, build)


def _runner(
    fixture: ZooFixture,
    policy: Any,
    platform: Any,
    label: str,
    widener: RaceWidener,
    model: Any,
    **extra: Any,
) -> Any:
    kw: dict[str, Any] = {"keep_graphs": True, "self_check": "off", **extra}
    kw.setdefault("widen_race_us", widener.us)  # the runner widens (0: off, whatever the env)
    return fixture.runner(model, policy, platform, label, **kw)


def zoo_subjects(platform: Any) -> list[AuditSubject]:
    """Every variant of every fixture as an audit subject, buggy first (a factory:
    ``warpolicy audit --factory warpolicy.audit.zoo:zoo_subjects``; the race widener from
    ``WARPOLICY_WIDEN_RACE_US``)."""
    widener = RaceWidener.resolve()
    return [
        make_subject(f, buggy, platform, widener).subject
        for f in FIXTURES
        for buggy in (True, False)
    ]
