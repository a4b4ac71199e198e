"""Audit subjects for staged speculative steps: ``warpolicy audit --factory
warpolicy.audit.synthetic_staged:staged``.

An EAGLE-family step of two phases on the synthetic model (`warpolicy.audit.synthetic_model`):
target verify (the default registry's trtllm_mha + EAGLE: ``in_graph`` only for a batch whose
``draft_extend_staged`` succeeded) and the draft extend, whose own model reads draft-owned
copies of the scheduler's tables (`warpolicy.runtime.runners.staging`). A `Stager` copies the
live tables into those copies during verify's per-batch action, so the step hands verify's
in-graph event; the draft extend declares ``post_replay`` for the batches that are not staged.

* ``eagle_staged``: the stager copies every table the draft extend reads (must be SAFE);
* ``eagle_staged+lying_stager``: the stager copies one table fewer (``full_to_swa``), which the
  draft extend then reads live, after verify's release: the positive control (must be UNSAFE,
  caught in every trial).

The audit poisons the live tables the moment the step's event fires, on a real GPU or (on the
simulated platform) in program order, exactly as for any other runner: the staging copy is part
of the step it audits.
"""

from __future__ import annotations

from typing import Any

import torch

from warpolicy.audit.subject import AuditSubject, stalled_model
from warpolicy.audit.synthetic_model import Layout, SyntheticConfig, SyntheticModel
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.vocabulary import IN_GRAPH, POST_REPLAY, ForwardMode
from warpolicy.runtime.manager import new_plugin_manager
from warpolicy.runtime.runners import DraftExtendRunner, SpecStep, VerifyRunner
from warpolicy.runtime.runners.staging import Stager, TensorCopy

VERIFY, DRAFT_EXTEND = ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND
#: the table the lying stager leaves out
LYING_SKIPS = "full_to_swa"
BACKEND, SPEC = "trtllm_mha", "eagle"


def _config() -> SyntheticConfig:
    buckets = (8, 16)  # verify: 4 and 8 requests of 2 draft tokens; the draft extend the same
    return SyntheticConfig(buckets={VERIFY: buckets, DRAFT_EXTEND: buckets})


class _FixedPolicy:
    """The draft extend's declaration for unstaged batches (a `PolicyTable`)."""

    backend, spec = BACKEND, SPEC

    def lookup(self, mode: ForwardMode, eager: bool = False, planted: bool = True) -> Any:
        return POST_REPLAY


class StagedEagle:
    """The staged EAGLE step's models and how to build its `SpecStep` (see the module doc):
    ``live`` is verify's model (the scheduler writes its tables), ``own`` the draft extend's
    (its tables are the staged copies; with ``lying``, ``full_to_swa`` is the live one)."""

    def __init__(
        self, platform: Any, *, lying: bool = False, config: SyntheticConfig | None = None
    ) -> None:
        self.platform = platform
        device = torch.device(platform.device) if platform.name == "cuda" else torch.device("cpu")
        self.cfg = cfg = config or _config()
        self.live = live = SyntheticModel(Layout(), cfg, device)
        self.own = own = SyntheticModel(Layout(), cfg, device)
        self.skip: tuple[str, ...] = (LYING_SKIPS,) if lying else ()
        for n in self.skip:  # what the stager leaves out, the draft extend reads live
            setattr(own, n, live.shared_buffers[n])
        own.shared_buffers = {n: live.shared_buffers[n] for n in self.skip}
        self.name = "eagle_staged" + ("+lying_stager" if lying else "")
        self.verify_policy = PolicyEngine.load(environ={}).compile(
            BACKEND,
            SPEC,
            platform=platform.name,
            external_events=platform.external_events_supported(),
            strict=True,
        )

    def step(self, model: Any = None, *, canary: Any = None) -> SpecStep:
        """The step; ``model`` is ``live`` or the audit's stalled view of it (the draft extend
        gets the same stall around its own model); ``canary`` for every runner."""
        live, own = self.live, self.own
        model = live if model is None else model
        stall = getattr(model, "stall", None)
        draft: Any = own if stall is None else stalled_model(own, stall)
        stager = Stager(
            [
                TensorCopy(n, live.shared_buffers[n], getattr(own, n))
                for n in live.shared_buffers
                if n not in self.skip
            ],
            name=f"{self.name}:stager",
        )
        pm = new_plugin_manager(load_entry_points=False, environ={})
        pm.register(stager, name="stager")
        kw: dict[str, Any] = {
            "observers": pm.observers,
            "keep_graphs": True,
            "self_check": "off",
            "canary": canary,
        }
        verify = VerifyRunner(
            model,
            self.verify_policy,
            self.platform,
            "target_verify",
            draft_tokens=self.cfg.draft_tokens,
            **kw,
        )
        extend = DraftExtendRunner(
            stager.consumer(draft, state={"kv_pool": own.kv_pool}),
            _FixedPolicy(),
            self.platform,
            "draft_extend",
            **kw,
        )
        return SpecStep([verify, extend], last_reader=DRAFT_EXTEND, name=self.name)


def staged_subject(
    platform: Any, *, lying: bool = False, config: SyntheticConfig | None = None
) -> AuditSubject:
    """The staged EAGLE step's `AuditSubject`; ``lying``: the stager copies one table fewer."""
    eagle = StagedEagle(platform, lying=lying, config=config)
    live = eagle.live
    return AuditSubject(
        name=eagle.name,
        model=live,
        runners={DRAFT_EXTEND: eagle.step},
        make_batch=lambda mode, trial: live.make_batch(VERIFY, trial),
        platform=platform,
        declared={DRAFT_EXTEND: IN_GRAPH},
        spec=SPEC,
        extra_outputs={"kv_pool": live.kv_pool, "draft_kv_pool": eagle.own.kv_pool},
    )


def staged(platform: Any) -> list[AuditSubject]:
    """The honest staged step (SAFE) and the lying stager (UNSAFE)."""
    return [staged_subject(platform), staged_subject(platform, lying=True)]


__all__ = ["LYING_SKIPS", "StagedEagle", "staged", "staged_subject"]
