"""The CONTENT of the packaged capabilities.yaml (engine decisions are tested in test_engine)."""

from __future__ import annotations

import pytest

from warpolicy.registry.decision import Context
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.loader import Fragment, default_registry_path, load_registry
from warpolicy.registry.model import Conditions, Registry
from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy

P = WarReadDonePolicy
DECODE, EXTEND, VERIFY = ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY
DRAFT_EXTEND = ForwardMode.DRAFT_EXTEND

#: SGLang's registered attention backends (docs/background.md; SGLang's backend list).
SGLANG_BACKENDS = [
    "flashinfer",
    "triton",
    "torch_native",
    "flex_attention",
    "fa3",
    "fa4",
    "flashmla",
    "cutlass_mla",
    "trtllm_mla",
    "trtllm_mha",
    "tokenspeed_mla",
    "cutedsl_mla",
    "aiter",
    "wave",
    "ascend",
    "dsa",
    "nsa",
    "dsv4",
    "hpc_ops",
    "intel_amx",
    "dual_chunk_flash_attn",
    "intel_xpu",
    # registered in sglang-0.5.23 attention_registry.py
    "qsa",
    "llada2_cfg_flashinfer",
    "minicpm_flashattn",
    "minicpm_flashinfer",
]
#: hpc_ops is decode-only and refuses speculative algorithms, so it declares decode alone
#: instead of inheriting base's (dead) target_verify entry.
BASE_CONTRACT = [b for b in SGLANG_BACKENDS if b != "hpc_ops"]
SPECS = [
    "none",
    "eagle",
    "eagle3",
    "frozen_kv_mtp",
    "standalone",
    "ngram",
    "dflash",
    "dspark",
    "uno",
    # sglang #27634: the drafter in another process (coarse until an IPC event is proven)
    "decoupled",
]
#: Backends and wrappers added for SGLang 0.5.23 (SGLang 0.5.23).
NEW_BACKENDS = [
    "minimax_sparse_nvfp4",
    "minimax_sparse",
    "hybrid_linear",
    "hybrid_attention",
    "dots_hybrid",
    "image_prefill_trtllm_mha",  # SGLang main's per-batch router
]
#: Algorithms whose prefill publishes only after the per-batch staging succeeded (SGLang main).
STAGING = ["eagle", "eagle3", "frozen_kv_mtp", "standalone", "ngram", "uno"]
#: Multi-layer EAGLE (is_eagle() in sglang-0.5.23): verify ends the step after draft-extend staging.
MULTI_LAYER_EAGLE = ["eagle", "eagle3", "frozen_kv_mtp"]
#: The last shared reader each algorithm declares (``last_reader:``): the EAGLE family's draft
#: extend rereads shared rows after verify; DFlash, DSpark, UNO and NGRAM read nothing after it.
INTENDED_LAST_READERS = {
    "eagle": DRAFT_EXTEND,
    "eagle3": DRAFT_EXTEND,
    "frozen_kv_mtp": DRAFT_EXTEND,
    "standalone": DRAFT_EXTEND,
    "dflash": VERIFY,
    "dspark": VERIFY,
    "uno": VERIFY,
    "ngram": VERIFY,
}


@pytest.fixture(scope="module")
def reg() -> Registry:
    return load_registry([default_registry_path()])


def test_loads_cleanly_and_from_its_own_path(reg):
    assert reg.sources == (str(default_registry_path()),)


def test_every_entry_has_a_one_line_doc(reg):
    entries = [
        *reg.flags.values(),
        *reg.facts.values(),
        *reg.spec_algorithms.values(),
        *reg.backends.values(),
    ]
    for entry in entries:
        assert entry.doc.strip(), entry.name
        assert "\n" not in entry.doc
    for gate in reg.gates:
        assert gate.because.strip() and "\n" not in gate.because, gate.id


def test_flags(reg):
    assert set(reg.flags) == {
        "prefill_read_done",
        "force_coarse",
        "hierarchical_cache",
        "hicache_storage",
        "lmcache",
        "context_parallel",
        "hisparse",
        "flashmla_sparse_prefill",
    }
    assert reg.flag("prefill_read_done").env == (
        "WARPOLICY_PREFILL_READ_DONE",
        "SGLANG_FORCE_PREFILL_COARSE_WAR_BARRIER",
        "SGLANG_ENABLE_PREFILL_WAR_READ_DONE",
    )
    assert reg.flag("prefill_read_done").inverted == {"SGLANG_FORCE_PREFILL_COARSE_WAR_BARRIER"}
    assert reg.flag("flashmla_sparse_prefill").env == (
        "WARPOLICY_FLASHMLA_SPARSE_PREFILL",
        "SGLANG_OPT_FLASHMLA_SPARSE_PREFILL",
    )
    assert reg.flag("force_coarse").env == (
        "WARPOLICY_FORCE_COARSE",
        "SGLANG_FORCE_COARSE_WAR_BARRIER",
    )
    assert reg.flag("hierarchical_cache").env == ("WARPOLICY_HIERARCHICAL_CACHE",)
    assert not any(f.inverted for n, f in reg.flags.items() if n != "prefill_read_done")
    # no SGLang alias for the new flags: the anchor names none
    for name in ["hicache_storage", "lmcache", "context_parallel", "hisparse"]:
        assert reg.flag(name).env == (f"WARPOLICY_{name.upper()}",), name
    assert not any(f.default for f in reg.flags.values())
    for flag in reg.flags.values():
        assert flag.env[0].startswith("WARPOLICY_"), flag.name


def test_spec_algorithms(reg):
    assert set(reg.spec_algorithms) == set(SPECS)
    for spec in reg.spec_algorithms.values():
        assert {"target_verify_read_done", "prefill_read_done"} <= spec.known_capabilities()
    verify = {n for n, s in reg.spec_algorithms.items() if s.has("target_verify_read_done")}
    prefill = {n for n, s in reg.spec_algorithms.items() if s.has("prefill_read_done")}
    in_replay = {n for n, s in reg.spec_algorithms.items() if s.has("dsv4_verify_in_replay")}
    after = {
        n: dict(s.capabilities_after)
        for n, s in reg.spec_algorithms.items()
        if s.capabilities_after
    }
    # verify publishes for every algorithm whose last reader is target verify
    assert verify == {n for n, r in INTENDED_LAST_READERS.items() if r is VERIFY}
    assert verify == {"dflash", "dspark", "ngram", "uno"}
    assert prefill == {"none", "dflash", "dspark"}
    # SGLang main: these stage before the prefill publishes; multi-layer EAGLE stages draft
    # extend before verify (sglang-0.5.23)
    assert after == {
        n: {
            "prefill_read_done": "prefill_staged",
            **(
                {"target_verify_read_done": "draft_extend_staged"} if n in MULTI_LAYER_EAGLE else {}
            ),
        }
        for n in STAGING
    }
    assert in_replay == {"dspark"}
    assert "35198" in reg.spec("ngram").doc
    assert reg.spec("uno").family is None
    assert reg.spec("dflash").family == reg.spec("dspark").family == "dflash"
    for name in ["eagle", "eagle3", "frozen_kv_mtp", "standalone"]:
        assert reg.spec(name).family == "eagle"
    assert "draft-extend" in reg.spec("eagle").doc


def test_last_readers_are_declared(reg):
    declared = {n: s.last_reader for n, s in reg.spec_algorithms.items()}
    # none: the only phase; decoupled: the step's phases span two processes (every cell coarse)
    assert declared == {**INTENDED_LAST_READERS, "none": None, "decoupled": None}
    # verify may publish exactly where verify is the last reader
    for name, reader in INTENDED_LAST_READERS.items():
        assert reg.spec(name).has("target_verify_read_done") == (reader is VERIFY), name


def test_facts(reg):
    assert {n: f.type.label for n, f in reg.facts.items()} == {
        "num_qo_tokens": "int",
        "sparse_prefill_snapshot": "action",
        "prefill_staged": "action",
        "draft_extend_staged": "action",
        "image_prefill_route": "name",
    }
    assert reg.fact("image_prefill_route").values == {"text", "image"}


def test_every_sglang_backend_keeps_the_base_contract(reg):
    base = reg.backend("base")
    assert base.abstract
    assert base.reads_end == {DECODE: P.IN_GRAPH, VERIFY: P.IN_GRAPH}
    for name in BASE_CONTRACT:
        backend = reg.backend(name)
        assert backend.inherits == "base" and not backend.abstract, name
        assert not backend.latest_of and not backend.per_mode and not backend.routes, name


def test_hpc_ops_declares_decode_only(reg):
    hpc = reg.backend("hpc_ops")
    assert hpc.inherits is None and dict(hpc.reads_end) == {DECODE: P.IN_GRAPH}
    assert "speculative" in hpc.doc


def test_backend_exceptions(reg):
    declared = {n: dict(reg.backend(n).reads_end) for n in BASE_CONTRACT}
    exceptions = {n: d for n, d in declared.items() if d}
    assert exceptions == {
        "trtllm_mha": {EXTEND: P.PRE_REPLAY, DRAFT_EXTEND: P.IN_GRAPH},
        "dsv4": {VERIFY: P.IN_GRAPH, EXTEND: P.PRE_REPLAY},
    }
    assert "32460" in reg.backend("trtllm_mha").doc
    assert not any(b.reads_end_after for b in reg.backends.values())
    scoped = {n: {g.id for g in reg.backend(n).gates} for n in reg.backends if reg.backend(n).gates}
    assert scoped == {
        "dsv4": {
            "dsv4-verify-rereads-segments",
            "dsv4-extend-context-parallel",
            "dsv4-extend-hisparse",
            "dsv4-sparse-prefill-needs-snapshot",
            "dsv4-flashmla-sparse-prefill-needs-snapshot",
        },
        "dots_hybrid": {"dots-hybrid-extend-without-spec"},
    }


def test_wrappers(reg):
    composites = {n: b.latest_of for n, b in reg.backends.items() if b.latest_of}
    per_mode = {n: dict(b.per_mode) for n, b in reg.backends.items() if b.per_mode}
    assert composites == {
        "tbo_fa3": ("fa3",),
        "minimax_sparse": ("fa3",),
        "hybrid_linear": ("fa3", "linear_attn"),
    }
    assert per_mode == {
        "hybrid_trtllm_mha_flashinfer": {EXTEND: "trtllm_mha", DECODE: "flashinfer"},
        "hybrid_attention": {
            EXTEND: "trtllm_mha",
            DECODE: "flashinfer",
            VERIFY: "flashinfer",
            DRAFT_EXTEND: "flashinfer",
        },
        "dots_hybrid": {m: "fa3" for m in (DECODE, EXTEND, VERIFY, DRAFT_EXTEND)},
    }
    for name in ["tbo_fa3", "hybrid_trtllm_mha_flashinfer"]:
        assert "llustrates" in reg.backend(name).doc
    for name in ["minimax_sparse", "hybrid_linear", "hybrid_attention", "dots_hybrid"]:
        assert "0.5.23" in reg.backend(name).doc, name
    linear = reg.backend("linear_attn")
    assert (
        linear.abstract
        and linear.inherits == "base"
        and linear.reads_classes == {"recurrent_state"}
    )
    for mode in (DECODE, VERIFY):  # every class it reads says where its reads end
        assert dict(linear.declared_classes(mode)) == {
            "metadata": P.IN_GRAPH,
            "recurrent_state": P.POST_REPLAY,
        }
    routers = {n: b.routes for n, b in reg.backends.items() if b.routes}
    assert set(routers) == {"image_prefill_trtllm_mha"}
    route = routers["image_prefill_trtllm_mha"]
    assert route.fact == "image_prefill_route" and route.pinned and route.default == "text"
    assert dict(route.children) == {"text": "trtllm_mha", "image": "triton"}
    assert route.modes == {EXTEND}


def test_only_sglang_backends_and_wrappers_are_concrete(reg):
    assert set(reg.concrete_backends()) == set(SGLANG_BACKENDS) | set(NEW_BACKENDS) | {
        "tbo_fa3",
        "hybrid_trtllm_mha_flashinfer",
    }


def test_draft_extend_is_declared_only_where_audited(reg):
    """The draft-extend rule: unknown (none) unless a backend declares it: minimax sparse NVFP4
    (SGLang 0.5.23) and trtllm_mha, whose in_graph (derived) declaration names the audit that
    proved it on a GPU."""
    declared = {n for n, b in reg.backends.items() if DRAFT_EXTEND in b.reads_end}
    assert declared == {"minimax_sparse_nvfp4", "trtllm_mha"}
    assert "warpolicy.conformance.speculative:steps" in reg.backend("trtllm_mha").doc
    for backend in reg.backends.values():
        assert set(backend.reads_end) <= {DECODE, EXTEND, VERIFY, DRAFT_EXTEND}, backend.name
    assert dict(reg.backend("minimax_sparse_nvfp4").reads_end) == {
        m: P.PRE_REPLAY for m in (DECODE, EXTEND, VERIFY, DRAFT_EXTEND)
    }


def test_trtllm_mha_declares_the_draft_extend_in_graph_derived(reg):
    trtllm = reg.backend("trtllm_mha")
    assert dict(trtllm.reads_end) == {EXTEND: P.PRE_REPLAY, DRAFT_EXTEND: P.IN_GRAPH}
    engine = PolicyEngine(reg, environ={})
    assert decide(engine, "trtllm_mha", DRAFT_EXTEND, "eagle") is P.IN_GRAPH
    assert decide(engine, "trtllm_mha", DRAFT_EXTEND, "eagle", planted=False) is P.POST_REPLAY
    placement = engine.compile("trtllm_mha", "eagle", platform="cuda", external_events=True)
    assert placement.placement(DRAFT_EXTEND).value == "derived"
    assert decide(engine, "trtllm_mha", DECODE, "none") is P.IN_GRAPH  # the base contract


def gate(reg: Registry, gate_id: str):
    (found,) = [g for g in reg.gates if g.id == gate_id]
    return found


def test_gates(reg):
    assert {g.id for g in reg.gates} == {
        "force-coarse",
        "target-verify-needs-capability",
        "prefill-opt-in",
        "prefill-needs-capability",
        "prefill-hierarchical-cache",
        "prefill-hicache-storage",
        "prefill-lmcache",
        "decoupled-drafter-other-process",
    }
    assert all(g.at_least is P.NONE and g.scope is None for g in reg.gates)
    assert gate(reg, "decoupled-drafter-other-process").when == Conditions(
        spec=frozenset({"decoupled"})
    )
    assert "27634" in gate(reg, "decoupled-drafter-other-process").because
    assert gate(reg, "force-coarse").when == Conditions(flags={"force_coarse": True})
    assert gate(reg, "target-verify-needs-capability").when == Conditions(
        mode=frozenset({VERIFY}), spec_lacks=frozenset({"target_verify_read_done"})
    )
    assert gate(reg, "prefill-opt-in").when == Conditions(
        mode=frozenset({EXTEND}), flags={"prefill_read_done": False}
    )
    assert gate(reg, "prefill-needs-capability").when == Conditions(
        mode=frozenset({EXTEND}), spec_lacks=frozenset({"prefill_read_done"})
    )
    for flag in ["hierarchical_cache", "hicache_storage", "lmcache"]:
        gate_id = {"hierarchical_cache": "prefill-hierarchical-cache"}.get(
            flag, "prefill-" + flag.replace("_", "-")
        )
        assert gate(reg, gate_id).when == Conditions(mode=frozenset({EXTEND}), flags={flag: True})


def test_sound_demotion_is_not_a_gate_in_the_file(reg):
    """It is built into the engine for every registry; no gate tests runner facts."""
    for g in reg.gates:
        assert (g.when.planted, g.when.eager, g.when.external_events) == (None, None, None)
        assert g.when.declared is None


# -- decisions of the cells added for SGLang 0.5.23 ------------------------------------------------


@pytest.fixture(scope="module")
def engine(reg) -> PolicyEngine:
    return PolicyEngine(reg, environ={})


def decide(engine, backend, mode, spec="none", eager=False, planted=True, **flags):
    return engine.decision(Context(backend, mode, spec, flags, eager=eager, planted=planted)).policy


ON = {"prefill_read_done": True}

#: (backend, mode, spec, flags) -> policy, every new cell of the 0.5.23 registry
CELLS = [
    # DeepSeek-V4 verify: in_graph only under DSpark, post_replay for the rest of DFlash
    ("dsv4", VERIFY, "dspark", {}, P.IN_GRAPH),
    ("dsv4", VERIFY, "dflash", {}, P.POST_REPLAY),
    ("dsv4", VERIFY, "uno", {}, P.POST_REPLAY),
    ("dsv4", VERIFY, "ngram", {}, P.POST_REPLAY),
    ("dsv4", VERIFY, "eagle", {}, P.NONE),
    ("dsv4", DECODE, "dspark", {}, P.IN_GRAPH),
    # DeepSeek-V4 extend: pre_replay (opted in) except under context parallelism or HiSparse,
    # and, per batch, only with its query count or its sparse-prefill snapshot (below): a batch
    # that reports neither is none
    ("dsv4", EXTEND, "none", ON, P.NONE),
    ("dsv4", EXTEND, "dflash", ON, P.NONE),
    ("dsv4", EXTEND, "none", {**ON, "context_parallel": True}, P.NONE),
    ("dsv4", EXTEND, "none", {**ON, "hisparse": True}, P.NONE),
    ("dsv4", EXTEND, "none", {}, P.NONE),
    # minimax sparse NVFP4: pre_replay in every publishing mode
    ("minimax_sparse_nvfp4", DECODE, "none", {}, P.PRE_REPLAY),
    ("minimax_sparse_nvfp4", VERIFY, "dflash", {}, P.PRE_REPLAY),
    ("minimax_sparse_nvfp4", VERIFY, "eagle", {}, P.NONE),
    ("minimax_sparse_nvfp4", EXTEND, "none", ON, P.PRE_REPLAY),
    ("minimax_sparse_nvfp4", DRAFT_EXTEND, "eagle", {}, P.PRE_REPLAY),
    # minimax sparse and hybrid linear: the latest of their children; hybrid linear's
    # linear-attention layers read recurrent state until the forward ends
    ("minimax_sparse", DECODE, "none", {}, P.IN_GRAPH),
    ("minimax_sparse", EXTEND, "none", ON, P.NONE),
    ("hybrid_linear", DECODE, "none", {}, P.POST_REPLAY),
    ("hybrid_linear", VERIFY, "dflash", {}, P.POST_REPLAY),
    ("hybrid_linear", EXTEND, "none", ON, P.NONE),
    ("hybrid_linear", DRAFT_EXTEND, "eagle", {}, P.NONE),
    # hybrid attention: the child chosen for the mode
    ("hybrid_attention", EXTEND, "none", ON, P.PRE_REPLAY),
    ("hybrid_attention", DECODE, "none", {}, P.IN_GRAPH),
    ("hybrid_attention", VERIFY, "dflash", {}, P.IN_GRAPH),
    ("hybrid_attention", DRAFT_EXTEND, "eagle", {}, P.NONE),
    # dots hybrid: extend without spec unknown, other modes delegate
    ("dots_hybrid", EXTEND, "none", ON, P.NONE),
    ("dots_hybrid", DECODE, "none", {}, P.IN_GRAPH),
    ("dots_hybrid", VERIFY, "dflash", {}, P.IN_GRAPH),
    ("dots_hybrid", VERIFY, "uno", {}, P.IN_GRAPH),
    # NGRAM and UNO verify follow the base declaration; their prefill needs staging
    ("fa3", VERIFY, "ngram", {}, P.IN_GRAPH),
    ("fa3", VERIFY, "uno", {}, P.IN_GRAPH),
    ("trtllm_mha", EXTEND, "ngram", ON, P.NONE),
    ("trtllm_mha", EXTEND, "uno", ON, P.NONE),
    ("trtllm_mha", EXTEND, "dflash", ON, P.PRE_REPLAY),
    # prefill gates next to hierarchical cache
    ("trtllm_mha", EXTEND, "none", ON, P.PRE_REPLAY),
    ("trtllm_mha", EXTEND, "none", {**ON, "hierarchical_cache": True}, P.NONE),
    ("trtllm_mha", EXTEND, "none", {**ON, "hicache_storage": True}, P.NONE),
    ("trtllm_mha", EXTEND, "none", {**ON, "lmcache": True}, P.NONE),
    ("trtllm_mha", EXTEND, "none", {}, P.NONE),
    # the draft-extend rule: unknown unless declared (trtllm_mha: proven on a GPU)
    ("fa3", DRAFT_EXTEND, "eagle", {}, P.NONE),
    ("trtllm_mha", DRAFT_EXTEND, "eagle", {}, P.IN_GRAPH),
    # a drafter in another process (sglang #27634): every cell coarse
    ("trtllm_mha", DRAFT_EXTEND, "decoupled", {}, P.NONE),
    ("trtllm_mha", DECODE, "decoupled", {}, P.NONE),
    ("fa3", VERIFY, "decoupled", {}, P.NONE),
    ("trtllm_mha", EXTEND, "decoupled", ON, P.NONE),
    # hpc_ops: decode-only, no speculative algorithm
    ("hpc_ops", DECODE, "none", {}, P.IN_GRAPH),
    ("hpc_ops", VERIFY, "dflash", {}, P.NONE),
    ("hpc_ops", EXTEND, "none", ON, P.NONE),
    # backends registered in 0.5.23 keep the base contract
    ("qsa", DECODE, "none", {}, P.IN_GRAPH),
    ("minicpm_flashinfer", VERIFY, "dflash", {}, P.IN_GRAPH),
    # the image-prefill router, no route reported: the latest of trtllm_mha and triton
    ("image_prefill_trtllm_mha", EXTEND, "none", ON, P.NONE),
    ("image_prefill_trtllm_mha", DECODE, "none", {}, P.IN_GRAPH),
]


@pytest.mark.parametrize(
    "backend,mode,spec,flags,expected",
    CELLS,
    ids=[f"{b}-{m.label}-{s}-{'+'.join(f) or 'default'}" for b, m, s, f, _ in CELLS],
)
def test_new_cells(engine, backend, mode, spec, flags, expected):
    assert decide(engine, backend, mode, spec, **flags) is expected


def test_dsv4_dspark_verify_is_demoted_without_a_node(engine):
    assert decide(engine, "dsv4", VERIFY, "dspark", planted=False) is P.POST_REPLAY


def test_eager_prefill_publishes_too(engine):
    assert decide(engine, "trtllm_mha", EXTEND, "none", eager=True, **ON) is P.PRE_REPLAY


def test_draft_extend_is_none_for_every_backend_but_the_declaring_ones(engine, reg):
    declaring = {
        "minimax_sparse_nvfp4": P.PRE_REPLAY,
        "trtllm_mha": P.IN_GRAPH,
        "image_prefill_trtllm_mha": P.IN_GRAPH,  # routes every mode but extend to trtllm_mha
    }
    for name in reg.concrete_backends():
        expected = declaring.get(name, P.NONE)
        assert decide(engine, name, DRAFT_EXTEND, "eagle") is expected, name


def test_prefill_flag_default_off_with_the_sglang_alias(reg):
    flag = reg.flag("prefill_read_done")
    assert flag.default is False and "0.5.23" in flag.doc
    on = PolicyEngine(reg, environ={"SGLANG_ENABLE_PREFILL_WAR_READ_DONE": "1"})
    assert decide(on, "trtllm_mha", EXTEND) is P.PRE_REPLAY
    assert decide(PolicyEngine(reg, environ={}), "trtllm_mha", EXTEND) is P.NONE


@pytest.mark.parametrize(
    "environ,expected",
    [
        ({"SGLANG_FORCE_PREFILL_COARSE_WAR_BARRIER": "1"}, P.NONE),  # main's opt-out
        ({"SGLANG_FORCE_PREFILL_COARSE_WAR_BARRIER": "0"}, P.PRE_REPLAY),  # main's default, said
        ({"SGLANG_FORCE_PREFILL_COARSE_WAR_BARRIER": ""}, P.NONE),  # blank: unset, our default
        # an explicit opt-out wins over 0.5.23's leftover opt-in
        (
            {
                "SGLANG_FORCE_PREFILL_COARSE_WAR_BARRIER": "1",
                "SGLANG_ENABLE_PREFILL_WAR_READ_DONE": "1",
            },
            P.NONE,
        ),
        # warpolicy's own name wins over both
        (
            {"WARPOLICY_PREFILL_READ_DONE": "1", "SGLANG_FORCE_PREFILL_COARSE_WAR_BARRIER": "1"},
            P.PRE_REPLAY,
        ),
    ],
)
def test_sglang_mains_inverted_prefill_switch(reg, environ, expected):
    assert decide(PolicyEngine(reg, environ=environ), "trtllm_mha", EXTEND) is expected


def test_the_prefill_opt_out_is_not_the_kill_switch(reg):
    engine = PolicyEngine(reg, environ={"SGLANG_FORCE_PREFILL_COARSE_WAR_BARRIER": "1"})
    assert decide(engine, "fa3", DECODE) is P.IN_GRAPH


# -- per-batch cells ------------------------------------------------------------------------------


def per_batch(engine, backend, mode, spec="none", facts=None, **flags):
    ctx = Context(backend, mode, spec, flags, facts=facts or {})
    return engine.decision(ctx).policy


@pytest.mark.parametrize(
    "facts,expected",
    [
        ({}, P.NONE),  # nothing reported: fail closed
        ({"num_qo_tokens": 8192}, P.PRE_REPLAY),  # dense prefill: no snapshot needed
        ({"num_qo_tokens": 11673}, P.PRE_REPLAY),  # the threshold itself is dense
        ({"num_qo_tokens": 11674}, P.NONE),  # sparse, no snapshot
        ({"num_qo_tokens": 11674, "sparse_prefill_snapshot": False}, P.NONE),
        ({"num_qo_tokens": 11674, "sparse_prefill_snapshot": True}, P.PRE_REPLAY),
        ({"sparse_prefill_snapshot": True}, P.PRE_REPLAY),  # built it: any count
    ],
)
def test_dsv4_sparse_prefill_snapshot_per_batch(engine, facts, expected):
    assert per_batch(engine, "dsv4", EXTEND, "none", facts, **ON) is expected


def test_dsv4_forced_sparse_prefill_needs_the_snapshot_at_any_count(engine):
    forced = {**ON, "flashmla_sparse_prefill": True}
    assert per_batch(engine, "dsv4", EXTEND, "none", {"num_qo_tokens": 16}, **forced) is P.NONE
    done = {"num_qo_tokens": 16, "sparse_prefill_snapshot": True}
    assert per_batch(engine, "dsv4", EXTEND, "none", done, **forced) is P.PRE_REPLAY


def test_dsv4_snapshot_never_overrides_context_parallel_or_hisparse(engine):
    done = {"num_qo_tokens": 16, "sparse_prefill_snapshot": True}
    for flag in ["context_parallel", "hisparse"]:
        assert per_batch(engine, "dsv4", EXTEND, "none", done, **ON, **{flag: True}) is P.NONE


@pytest.mark.parametrize("spec", STAGING)
def test_speculative_prefill_publishes_only_after_staging(engine, spec):
    assert per_batch(engine, "trtllm_mha", EXTEND, spec, {}, **ON) is P.NONE
    staged = {"prefill_staged": True}
    assert per_batch(engine, "trtllm_mha", EXTEND, spec, staged, **ON) is P.PRE_REPLAY
    assert per_batch(engine, "trtllm_mha", EXTEND, spec, {"prefill_staged": False}, **ON) is P.NONE
    assert per_batch(engine, "trtllm_mha", EXTEND, spec, staged) is P.NONE  # still opt-in


@pytest.mark.parametrize("spec", ["dflash", "dspark", "none"])
def test_dflash_family_prefill_publishes_without_staging(engine, spec):
    assert per_batch(engine, "trtllm_mha", EXTEND, spec, {}, **ON) is P.PRE_REPLAY


@pytest.mark.parametrize("spec", MULTI_LAYER_EAGLE)
def test_multi_layer_eagle_verify_publishes_after_draft_extend_staging(engine, spec):
    assert per_batch(engine, "fa3", VERIFY, spec) is P.NONE
    assert per_batch(engine, "fa3", VERIFY, spec, {"draft_extend_staged": True}) is P.IN_GRAPH
    assert per_batch(engine, "dsv4", VERIFY, spec, {"draft_extend_staged": True}) is P.POST_REPLAY


def test_standalone_has_no_draft_extend_staging(engine):
    assert per_batch(engine, "fa3", VERIFY, "standalone", {"draft_extend_staged": True}) is P.NONE


@pytest.mark.parametrize(
    "route,expected",
    [(None, P.NONE), ("text", P.PRE_REPLAY), ("image", P.NONE)],
)
def test_image_prefill_router(engine, route, expected):
    facts = {} if route is None else {"image_prefill_route": route}
    assert per_batch(engine, "image_prefill_trtllm_mha", EXTEND, "none", facts, **ON) is expected


def test_default_registry_has_no_hazardous_router():
    from warpolicy.registry.loader import validate_warnings

    assert validate_warnings([default_registry_path()]) == []


@pytest.mark.parametrize(
    "capabilities,expected",
    [
        ("{}", P.NONE),
        ("{prefill_read_done: false}", P.NONE),
        ("{prefill_read_done: true}", P.PRE_REPLAY),
    ],
)
def test_plugin_spec_algorithms_must_opt_in_to_prefill(capabilities, expected):
    fragment = Fragment(
        "plugin:myspec",
        f"""version: 1
spec_algorithms:
  myspec:
    capabilities: {capabilities}
    doc: a plugin algorithm
""",
    )
    registry = load_registry([default_registry_path(), fragment])
    engine = PolicyEngine(registry, environ={})
    assert decide(engine, "trtllm_mha", EXTEND, "myspec", **ON) is expected
    assert decide(engine, "dsv4", VERIFY, "myspec") is P.NONE  # no verify capability either
    staged = Context("trtllm_mha", EXTEND, "myspec", ON, facts={"prefill_staged": True})
    assert engine.decision(staged).policy is expected  # staging alone is no opt-in
