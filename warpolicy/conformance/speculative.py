"""EAGLE-family speculative steps on SGLang's trtllm_mha metadata kernel, staged and unstaged:
``warpolicy audit --factory warpolicy.conformance.speculative:steps``.

One step runs three forwards on the forward stream, as SGLang's EAGLE worker runs them with the
trtllm_mha backend (sglang 0.5.23, ``layers/attention/trtllm_mha_backend.py``; the kernel's own
docstring lists "2 draft-decode steps + target-verify + draft-extend" per decode step):

1. **draft decode** (DECODE on the draft model): ``update_trtllm_mha_graph_metadata`` in its graph,
   ``seqlen_offset=0``, over the shared ``req_to_token`` and ``full_to_swa``;
2. **target verify** (TARGET_VERIFY on the target model): the same kernel, ``seqlen_offset`` =
   draft tokens (`warpolicy.conformance.adapters.TrtllmMhaAdapter`);
3. **draft extend** (DRAFT_EXTEND_V2 on the draft model, `DraftExtendAdapter`): the kernel with
   ``q_mode=Q_MODE_STRIDED`` (``cu_seqlens_q[1:] = arange * q_stride``, ``q_stride`` = draft tokens
   per request) and ``seqlen_offset`` = draft tokens, then the draft model attends through the page
   tables it built. Its graph has no marker (SGLang's draft-extend runner has none).

The draft model has its own weights and KV pools and shares the scheduler's tables with the target
(SGLang's draft worker shares ``req_to_token_pool``).

**Staged** (multi-layer EAGLE's ``draft_extend_staged``, `warpolicy.runtime.runners.staging`): the
draft extend's shared reads are the metadata kernel's page-table build (``req_to_token`` and the
SWA mapping: the "KV plan") and its SWA write-slot translation (``swa_out_cache_loc``). A `Stager`
runs **the same kernel** for the draft extend's bucket during target verify's per-batch action
(before verify's release), into the draft extend's own page tables and write slots
(`PlanStaging`, `SwaOutStaging`); the draft extend's graph then runs the kernel with
``skip_page_table=True`` (the mode the kernel has for page tables refreshed out of graph) and no
SWA translation, so it reads no scheduler-shared buffer. Under ``skip_page_table`` the kernel does
not read ``req_to_token``; the graph passes it a draft-owned one-row stand-in so the captured graph
holds no pointer into the live table at all. A batch that was not staged is staged late by the
draft extend itself (its host prep): it then releases at its own point, ``pre_replay`` (the
late staging kernels precede the replay; `SpeculativeStep.extend_policy`).

**Lying stager** (the positive control): it stages the page tables but not the SWA write slots,
so the draft extend's graph translates ``out_cache_loc`` through the live ``full_to_swa`` after
verify's release: its KV writes for sliding-window layers race the scheduler.

Subjects (`steps`), each an EAGLE-family `SpecStep` audited at its release, declared and compiled
for ``trtllm_mha`` by the packaged registry (``draft_extend: in_graph``, derived placement: the
declaration this audit proved on an H100, see capabilities.yaml):

* ``trtllm_mha/<spec>`` for EAGLE, EAGLE3 and FROZEN_KV_MTP, unstaged: the step releases at the
  draft extend as the registry declares it;
* ``trtllm_mha/<spec>+staged`` (multi-layer EAGLE staging): verify's in-graph event;
* ``trtllm_mha/eagle+lying_stager``: UNSAFE in every trial.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch

from warpolicy.audit.subject import AuditSubject, stalled_model
from warpolicy.conformance.adapters import TrtllmMhaAdapter, _TrtllmBuffers
from warpolicy.conformance.factories import check_platform
from warpolicy.conformance.loader import SGLangKernels, load_kernels
from warpolicy.conformance.paged import DECODE, VERIFY, PagedBatch, PagedConfig, PagedState
from warpolicy.registry.decision import Context
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.loader import default_registry_path, load_registry
from warpolicy.registry.vocabulary import IN_GRAPH, PRE_REPLAY, ForwardMode, WarReadDonePolicy
from warpolicy.runtime.batch import DRAFT_EXTEND_STAGED
from warpolicy.runtime.manager import new_plugin_manager
from warpolicy.runtime.markers import hookimpl
from warpolicy.runtime.policy import RunnerPolicy, fixed_policy
from warpolicy.runtime.runners import (
    DecodeRunner,
    DraftExtendRunner,
    GraphRunner,
    Phase,
    SpecStep,
    VerifyRunner,
)
from warpolicy.runtime.runners.staging import Stager

DRAFT_EXTEND = ForwardMode.DRAFT_EXTEND
BACKEND = "trtllm_mha"
#: The EAGLE-family algorithms SGLang's EAGLE worker runs (``is_eagle()``), audited here.
SPECS = ("eagle", "eagle3", "frozen_kv_mtp")
#: What a draft extend stages: the page tables (KV plan) and the SWA write slots.
PLAN, SWA_OUT = "kv_plan", "swa_out_cache_loc"


class _DraftExtendBuffers(_TrtllmBuffers):
    def __init__(self, bs: int, tokens: int, cfg: PagedConfig, device: torch.device) -> None:
        super().__init__(bs, tokens, cfg, device)
        self.cu_seqlens_q = torch.zeros(bs + 1, dtype=torch.int32, device=device)


class DraftExtendAdapter(TrtllmMhaAdapter):
    """DRAFT_EXTEND_V2 on trtllm_mha (see the module doc): verify-shaped (each request extends
    over the draft tokens), ``Q_MODE_STRIDED``. ``staged`` names what a stager stages for it
    (`PLAN`, `SWA_OUT`): the graph then leaves those to the staged buffers."""

    def __init__(
        self, state: PagedState, kernels: SGLangKernels, *, staged: Sequence[str] = ()
    ) -> None:
        super().__init__(state, kernels, DRAFT_EXTEND)
        self.verify = True  # the shape of verify: draft token d sees seq_len + d + 1 tokens
        self.queries = self.cfg.draft_tokens
        unknown = set(staged) - {PLAN, SWA_OUT}
        if unknown:
            raise ValueError(f"draft extend: unknown staged reads {sorted(unknown)}")
        self.staged = frozenset(staged)
        # under skip_page_table the kernel reads no req_to_token row: a draft-owned stand-in
        self._no_table = torch.zeros(1, 1, dtype=torch.int32, device=self.device)

    def bucket_sizes(self, mode: ForwardMode) -> Sequence[int]:
        return self.cfg.buckets(VERIFY) if ForwardMode.parse(mode) == DRAFT_EXTEND else ()

    def bucket_for(self, size: int) -> int:
        """The bucket a runner replays for a batch of ``size`` tokens (the smallest that fits)."""
        sizes = sorted(self.bucket_sizes(DRAFT_EXTEND))
        i = bisect.bisect_left(sizes, size)
        if i == len(sizes):
            raise ValueError(f"draft extend: no bucket holds {size} tokens")
        return sizes[i]

    def _buffers(self, bs: int, tokens: int) -> _DraftExtendBuffers:
        return _DraftExtendBuffers(bs, tokens, self.cfg, self.device)

    def _graph_metadata(self, s: _TrtllmBuffers) -> None:
        plan_staged, swa_staged = PLAN in self.staged, SWA_OUT in self.staged
        self._metadata(s, plan=not plan_staged, swa_out=not swa_staged)

    def _metadata(self, s: _TrtllmBuffers, *, plan: bool, swa_out: bool) -> None:
        """The fused kernel as SGLang's draft extend calls it; ``plan``: build the page tables
        (from the live tables), ``swa_out``: translate the write slots (through the live SWA
        mapping). Reads nothing shared when both are False."""
        assert isinstance(s, _DraftExtendBuffers)
        cfg, state = self.cfg, self.state
        swa = state.full_to_swa if (plan or swa_out) else None
        self.kernels.update_trtllm_mha_graph_metadata(
            req_pool_indices=s.req_pool_indices,
            seq_lens=s.seq_lens,
            req_to_token=state.req_to_token if plan else self._no_table,
            cache_seqlens=s.cache_seqlens,
            cu_seqlens_k=s.cu_seqlens_k,
            page_table=s.page_table,
            bs=s.bs,
            seqlen_offset=self.queries,
            max_seq_pages=cfg.page_table_width,
            page_size=cfg.page_size,
            swa_mapping=swa,
            swa_page_table=s.swa_page_table if plan else None,
            out_cache_loc=s.out_cache_loc if swa_out else None,
            swa_out_cache_loc=s.swa_out_cache_loc if swa_out else None,
            cu_seqlens_q=s.cu_seqlens_q,
            qlens=None,
            q_stride=self.queries,
            q_mode=self.kernels.q_mode_strided,
            skip_page_table=not plan,
        )

    # -- staging (before verify's release, on the forward stream) ------------------------------

    def stage(self, batch: PagedBatch, *, plan: bool, swa_out: bool) -> None:
        """Write ``batch`` into its bucket's static inputs (what the draft extend's host prep
        will write too) and run the kernel's ``plan`` / ``swa_out`` parts into its buffers."""
        bucket = self.bucket_for(batch.size)
        self.prepare_bucket(bucket)
        TrtllmMhaAdapter.host_prep(self, batch, bucket)
        self._metadata(self.static[bucket], plan=plan, swa_out=swa_out)

    def make_batch(self, mode: ForwardMode, trial: int) -> PagedBatch:
        return self.state.make_batch(VERIFY, trial)


@functools.lru_cache(maxsize=1)
def packaged_engine() -> PolicyEngine:
    """The packaged registry's engine, no environment flags."""
    return PolicyEngine(load_registry([default_registry_path()]), environ={})


def _plan_bytes(adapter: DraftExtendAdapter) -> int:
    cfg = adapter.cfg
    rows = max(cfg.verify_batches)
    tables = 2 if cfg.swa_window else 1
    return rows * cfg.page_table_width * 4 * tables + (rows + 1) * 4 * 2


@attrs.frozen(eq=False)
class PlanStaging:
    """A `warpolicy.runtime.runners.staging.StagedRead`: the draft extend's page tables (its KV
    plan), built by SGLang's kernel from the live ``req_to_token`` and SWA mapping."""

    adapter: DraftExtendAdapter

    @property
    def name(self) -> str:
        return PLAN

    @property
    def sources(self) -> Mapping[str, Any]:
        return dict(self.adapter.state.shared_buffers)

    @property
    def nbytes(self) -> int:
        return _plan_bytes(self.adapter)

    def copy(self, batch: Any) -> None:
        self.adapter.stage(batch, plan=True, swa_out=False)


@attrs.frozen(eq=False)
class SwaOutStaging:
    """A `StagedRead`: the draft extend's SWA write slots, translated by SGLang's kernel through
    the live SWA mapping."""

    adapter: DraftExtendAdapter

    @property
    def name(self) -> str:
        return SWA_OUT

    @property
    def sources(self) -> Mapping[str, Any]:
        mapping = self.adapter.state.full_to_swa
        return {} if mapping is None else {"full_to_swa": mapping}

    @property
    def nbytes(self) -> int:
        cfg = self.adapter.cfg
        return max(cfg.verify_batches) * cfg.draft_tokens * 8

    def copy(self, batch: Any) -> None:
        self.adapter.stage(batch, plan=False, swa_out=True)


class NoStaging:
    """The per-batch action of an EAGLE worker that does not stage (SGLang's EAGLE, EAGLE3 and
    FROZEN_KV_MTP workers without multi-layer staging): ``draft_extend_staged`` answered False,
    so verify publishes nothing and the draft extend is the step's release."""

    @hookimpl
    def warpolicy_batch_action(
        self, action: str, runner: str, mode: ForwardMode, bucket: int | None, batch: object
    ) -> bool | None:
        return False if action == DRAFT_EXTEND_STAGED else None


def draft_decode_batch(batch: PagedBatch) -> PagedBatch:
    """The first draft decode of a verify batch: one token per request at position
    ``seq_len`` (the first draft token's slot), its length including it."""
    q = batch.queries
    return PagedBatch(
        batch.req_pool_indices,
        batch.seq_lens + 1,
        batch.out_cache_loc[::q].contiguous(),
        batch.input_ids[::q].contiguous(),
        1,
        batch.trial,
    )


class SpeculativeStep:
    """The models of one EAGLE-family step on trtllm_mha (see the module doc) and how to build
    its `SpecStep`. ``staged``: the draft extend reads staged copies; ``lying``: the stager
    leaves out the SWA write slots (``staged`` implied)."""

    def __init__(
        self,
        platform: Any,
        spec: str = "eagle",
        *,
        staged: bool = False,
        lying: bool = False,
        config: PagedConfig | None = None,
        kernels: SGLangKernels | None = None,
        self_check: str = "warn",
    ) -> None:
        on_cuda = check_platform(platform)
        if config is None and not on_cuda:  # the interpreter has no bfloat16 arithmetic
            config = PagedConfig(dtype=torch.float32)
        cfg = config or PagedConfig()
        self.platform = platform
        self.spec = spec
        self.staged = staged or lying
        self.lying = lying
        self.self_check = self_check
        self.kernels = kernels if kernels is not None else load_kernels()
        device = torch.device(platform.device) if on_cuda else torch.device("cpu")
        self.target = PagedState(cfg, device)
        # the draft model: its own weights and KV pools (another seed), the target's tables
        self.draft = PagedState(attrs.evolve(cfg, seed=cfg.seed + 1, layers=2), device)
        self.draft.req_to_token = self.target.req_to_token
        self.draft.full_to_swa = self.target.full_to_swa
        self.draft.shared_buffers = self.target.shared_buffers
        staged_reads = (PLAN,) if lying else (PLAN, SWA_OUT) if self.staged else ()
        if not cfg.swa_window and lying:
            raise ValueError("the lying stager needs sliding-window layers (SWA write slots)")
        self.verify = TrtllmMhaAdapter(self.target, self.kernels, VERIFY)
        self.draft_decode = TrtllmMhaAdapter(self.draft, self.kernels, DECODE)
        self.extend = DraftExtendAdapter(self.draft, self.kernels, staged=staged_reads)
        self.policy = packaged_engine().compile(
            BACKEND,
            spec,
            platform=platform.name,
            external_events=platform.external_events_supported(),
            strict=True,
        )
        self.name = f"{BACKEND}/{spec}" + (
            "+lying_stager" if lying else "+staged" if self.staged else ""
        )

    @property
    def declared(self) -> WarReadDonePolicy:
        """What the step publishes per the registry: verify's in_graph when staged, else the
        draft extend's declaration (the EAGLE family's last reader)."""
        if self.staged:
            return IN_GRAPH
        return packaged_engine().decide(Context(BACKEND, DRAFT_EXTEND, self.spec))

    @property
    def extend_policy(self) -> RunnerPolicy:
        """The draft extend runner's policy. Honestly staged, its graph reads no shared buffer
        (a derived placement would find no reader to place after, and refuse); a batch that was
        not staged is staged late by its host prep, so its shared reads end before the replay:
        ``pre_replay``. Unstaged or lying, the registry's (the graph reads the live tables)."""
        if self.staged and not self.lying:
            return fixed_policy(PRE_REPLAY)
        return self.policy

    @property
    def extra_outputs(self) -> dict[str, Any]:
        """The KV pools both models write."""
        pools = {f"target.{n}": t for n, t in self.target.kv_pools.items()}
        pools.update({f"draft.{n}": t for n, t in self.draft.kv_pools.items()})
        return pools

    def stager(self) -> Stager | None:
        if not self.staged:
            return None
        reads: list[Any] = [PlanStaging(self.extend)]
        if not self.lying:
            reads.append(SwaOutStaging(self.extend))
        return Stager(reads, name=f"{self.name}:stager")

    def step(self, model: Any = None, *, canary: Any = None) -> SpecStep:
        """The step; ``model`` is the verify adapter or the audit's stalled view of it (the
        other phases get the same stall)."""
        model = self.verify if model is None else model
        stall = getattr(model, "stall", None)

        def wrap(adapter: Any) -> Any:
            return adapter if stall is None else stalled_model(adapter, stall)

        pm = new_plugin_manager(load_entry_points=False, environ={})
        stager = self.stager()
        extend: Any = wrap(self.extend)
        if stager is None:
            pm.register(NoStaging(), name="no-staging")
        else:
            pm.register(stager, name="stager")
            extend = stager.consumer(
                extend, state={n: t for n, t in self.extra_outputs.items() if n[:6] == "draft."}
            )
        kw: dict[str, Any] = {
            "observers": pm.observers,
            "keep_graphs": True,
            "self_check": self.self_check,
            "canary": canary,
        }
        p, policy = self.platform, self.policy
        runners: list[GraphRunner] = [
            DecodeRunner(wrap(self.draft_decode), policy, p, "draft_decode", **kw),
            VerifyRunner(
                model,
                policy,
                p,
                "target_verify",
                draft_tokens=self.target.cfg.draft_tokens,
                **kw,
            ),
            DraftExtendRunner(extend, self.extend_policy, p, "draft_extend", **kw),
        ]
        phases = [Phase(runners[0], lambda batch, _: draft_decode_batch(batch))]
        phases += [Phase(r) for r in runners[1:]]
        spec = packaged_engine().spec(self.spec)
        return SpecStep.for_algorithm(phases, spec, name=self.name)


def step_subject(platform: Any, spec: str = "eagle", **kw: Any) -> AuditSubject:
    """One step's `AuditSubject` (keywords: `SpeculativeStep`'s)."""
    step = SpeculativeStep(platform, spec, **kw)
    return AuditSubject(
        name=step.name,
        model=step.verify,
        runners={DRAFT_EXTEND: step.step},
        make_batch=lambda mode, trial: step.target.make_batch(VERIFY, trial),
        platform=platform,
        declared={DRAFT_EXTEND: step.declared},
        spec=spec,
        extra_outputs=step.extra_outputs,
    )


def steps(platform: Any) -> list[AuditSubject]:
    """EAGLE, EAGLE3 and FROZEN_KV_MTP unstaged and staged, and the lying stager."""
    check_platform(platform)
    kernels = load_kernels()
    make = functools.partial(step_subject, platform, kernels=kernels)
    subjects = [make(spec, staged=staged) for spec in SPECS for staged in (False, True)]
    return subjects + [make("eagle", lying=True)]


__all__ = [
    "PLAN",
    "SPECS",
    "SWA_OUT",
    "DraftExtendAdapter",
    "NoStaging",
    "PlanStaging",
    "SpeculativeStep",
    "SwaOutStaging",
    "packaged_engine",
    "draft_decode_batch",
    "step_subject",
    "steps",
]
