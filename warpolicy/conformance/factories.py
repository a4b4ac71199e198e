"""Audit subjects on SGLang's real kernels: ``warpolicy audit --factory MODULE:CALLABLE``.

Each callable takes the `Platform` and returns a list of `AuditSubject`, one per (backend,
mode), declared and compiled by the **default registry** (the packaged ``capabilities.yaml``,
no environment flags): ``triton`` and ``trtllm_mha`` both declare decode and target verify
``in_graph`` (the base contract); target verify publishes only for a speculative algorithm
that declares ``target_verify_read_done``, so it is audited under ``dflash`` (decode under
``none``). The kernels come from `warpolicy.conformance.loader` (``scripts/fetch-sglang-
kernels`` first; a missing file is one line at the CLI, exit 2)::

    warpolicy audit --factory warpolicy.conformance.factories:declared            # 4 SAFE
    warpolicy audit --factory warpolicy.conformance.factories:derived             # 2 SAFE
    warpolicy audit --factory warpolicy.conformance.factories:mutants             # 5 UNSAFE
    warpolicy audit --factory warpolicy.conformance.factories:mutants_self_check  # 5 UNSAFE
    warpolicy audit --factory warpolicy.conformance.factories:mutants_derived     # 5 SAFE

* ``declared``: the registry's declarations as SGLang's backends run them (marker placement,
  the runner's default self-check);
* ``derived``: trtllm_mha with derived placement (the node after the graph's last shared
  reader, SGLang's metadata kernel); the Triton backend reads nothing shared in its graph;
* ``mutants``: the late readers (`warpolicy.conformance.adapters.MUTANTS`), declared
  ``in_graph`` with the marker and no self-check, so the dynamic test alone judges them;
* ``mutants_self_check``: the same with the runner's self-check on: it demotes each at
  capture, and the audit reports the refuted declaration (UNSAFE, naming the late kernel);
* ``mutants_derived``: the same with derived placement: the node follows the late reader.

`subject` builds any one of them (other shapes, poisons, configurations).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch

from warpolicy import environment
from warpolicy.audit.poison import PoisonSpec
from warpolicy.audit.subject import AuditSubject
from warpolicy.conformance.adapters import MUTANTS, make_adapter
from warpolicy.conformance.loader import KernelsUnavailable, SGLangKernels, load_kernels
from warpolicy.conformance.paged import DECODE, VERIFY, PagedConfig, PagedState
from warpolicy.registry.decision import Context
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.loader import default_registry_path
from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.runners import DecodeRunner, VerifyRunner

#: The speculative algorithm each mode is audited under.
SPECS: Mapping[ForwardMode, str] = {DECODE: "none", VERIFY: "dflash"}
BACKENDS = ("triton", "trtllm_mha")


@functools.lru_cache(maxsize=1)
def default_engine() -> PolicyEngine:
    """The packaged default registry, with no environment flags (what is audited is the
    registry's own declaration, whatever the shell exports)."""
    return PolicyEngine.load([str(default_registry_path())], environ={})


def check_platform(platform: Any) -> bool:
    """True on CUDA; elsewhere Triton's interpreter must be on (checked before any kernel is
    loaded: a kernel loaded compiled stays compiled in this process), else `KernelsUnavailable`."""
    if platform.name == "cuda":
        return True
    if environment.TRITON_INTERPRET.get() != "1":
        raise KernelsUnavailable(
            f"SGLang's Triton kernels need a CUDA device; on platform {platform.name!r} set "
            "TRITON_INTERPRET=1 (Triton's CPU interpreter: slow; needs numpy < 2)"
        )
    return False


def _runner(
    mode: ForwardMode,
    policy: Any,
    platform: Any,
    name: str,
    draft_tokens: int,
    placement: str | None,
    self_check: str,
    model: Any,
) -> Any:
    kw: dict[str, Any] = {"keep_graphs": True, "placement": placement, "self_check": self_check}
    if mode == VERIFY:
        return VerifyRunner(model, policy, platform, name, draft_tokens=draft_tokens, **kw)
    return DecodeRunner(model, policy, platform, name, **kw)


def subject(
    backend: str,
    mode: Any,
    platform: Any,
    *,
    mutant: str | None = None,
    placement: str | None = None,
    self_check: str = "warn",
    config: PagedConfig | None = None,
    kernels: SGLangKernels | None = None,
    poison: Mapping[str, PoisonSpec] | None = None,
) -> AuditSubject:
    """One `AuditSubject`: ``backend``'s adapter in ``mode`` (``decode`` / ``target_verify``),
    optionally a ``mutant``, with ``placement`` (None: the registry's) and ``self_check``.

    Its name says what it is: ``trtllm_mha``, ``trtllm_mha+late_page_table`` (no self-check),
    ``...@self-check``, ``...@derived``."""
    mode = ForwardMode.parse(mode)
    if mode not in SPECS:
        raise ValueError(f"{mode.label}: only decode and target_verify are audited here")
    on_cuda = check_platform(platform)
    if config is None and not on_cuda:  # the interpreter has no bfloat16 arithmetic
        config = PagedConfig(dtype=torch.float32)
    kernels = kernels if kernels is not None else load_kernels()
    device = torch.device(platform.device) if on_cuda else torch.device("cpu")
    state = PagedState(config, device)
    adapter = make_adapter(backend, state, kernels, mode, mutant=mutant)
    spec = SPECS[mode]
    engine = default_engine()
    policy = engine.compile(
        backend,
        spec,
        platform=platform.name,
        external_events=platform.external_events_supported(),
        strict=True,
    )
    declared = engine.decide(Context(backend, mode, spec))
    name = backend + (f"+{mutant}" if mutant else "")
    if placement == "derived":
        name += "@derived"
    elif mutant and self_check != "off":
        name += "@self-check"
    runner = functools.partial(
        _runner,
        mode,
        policy,
        platform,
        f"{name}:{mode.label}",
        state.cfg.draft_tokens,
        placement,
        self_check,
    )
    return AuditSubject(
        name=name,
        model=adapter,
        runners={mode: runner},
        make_batch=adapter.make_batch,
        platform=platform,
        declared={mode: declared},
        spec=spec,
        poison=dict(poison or {}),
        extra_outputs=state.kv_pools,
    )


def _mutants(platform: Any, **kw: Any) -> list[AuditSubject]:
    check_platform(platform)
    kernels = load_kernels()
    return [
        subject(backend, DECODE, platform, mutant=m, kernels=kernels, **kw)
        for backend in BACKENDS
        for m in MUTANTS[backend]
    ]


def declared(platform: Any) -> list[AuditSubject]:
    """``triton`` and ``trtllm_mha`` in decode and target verify, as the registry declares
    them (each must be SAFE)."""
    check_platform(platform)
    kernels = load_kernels()
    return [subject(b, m, platform, kernels=kernels) for b in BACKENDS for m in (DECODE, VERIFY)]


def derived(platform: Any) -> list[AuditSubject]:
    """``trtllm_mha`` in decode and target verify with derived placement (each must be SAFE)."""
    check_platform(platform)
    kernels = load_kernels()
    return [
        subject("trtllm_mha", m, platform, placement="derived", kernels=kernels)
        for m in (DECODE, VERIFY)
    ]


def mutants(platform: Any) -> list[AuditSubject]:
    """Every late-reader mutant, marker, no self-check (each must be UNSAFE, dynamically)."""
    return _mutants(platform, self_check="off")


def mutants_self_check(platform: Any) -> list[AuditSubject]:
    """Every mutant with the runner's self-check (each demoted at capture: refuted, UNSAFE)."""
    return _mutants(platform, self_check="warn")


def mutants_derived(platform: Any) -> list[AuditSubject]:
    """Every mutant with derived placement (each must be SAFE)."""
    return _mutants(platform, placement="derived")


__all__ = [
    "BACKENDS",
    "SPECS",
    "check_platform",
    "declared",
    "default_engine",
    "derived",
    "mutants",
    "mutants_derived",
    "mutants_self_check",
    "subject",
]
