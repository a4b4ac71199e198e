"""The CONTENT of the packaged capabilities.yaml (engine decisions are tested in test_engine)."""

from __future__ import annotations

import pytest

from warpolicy.loader import default_registry_path, load_registry
from warpolicy.policy import ForwardMode, WarReadDonePolicy
from warpolicy.registry import Conditions, Registry

P = WarReadDonePolicy
DECODE, EXTEND, VERIFY = ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY

#: SGLang's registered attention backends (REFERENCE.md §1).
SGLANG_BACKENDS = [
    "flashinfer", "triton", "torch_native", "flex_attention", "fa3", "fa4", "flashmla",
    "cutlass_mla", "trtllm_mla", "trtllm_mha", "tokenspeed_mla", "cutedsl_mla", "aiter", "wave",
    "ascend", "dsa", "nsa", "dsv4", "hpc_ops", "intel_amx", "dual_chunk_flash_attn", "intel_xpu",
]
SPECS = ["none", "eagle", "eagle3", "frozen_kv_mtp", "standalone", "ngram", "dflash", "dspark"]


@pytest.fixture(scope="module")
def reg() -> Registry:
    return load_registry([default_registry_path()])


def test_loads_cleanly_and_from_its_own_path(reg):
    assert reg.sources == (str(default_registry_path()),)


def test_every_entry_has_a_one_line_doc(reg):
    entries = [*reg.flags.values(), *reg.spec_algorithms.values(), *reg.backends.values()]
    for entry in entries:
        assert entry.doc.strip(), entry.name
        assert "\n" not in entry.doc
    for gate in reg.gates:
        assert gate.because.strip() and "\n" not in gate.because, gate.id


def test_flags(reg):
    assert set(reg.flags) == {"prefill_read_done", "force_coarse", "hierarchical_cache"}
    assert reg.flag("prefill_read_done").env == ("WARPOLICY_PREFILL_READ_DONE",
                                                 "SGLANG_ENABLE_PREFILL_WAR_READ_DONE")
    assert reg.flag("force_coarse").env == ("WARPOLICY_FORCE_COARSE",
                                            "SGLANG_FORCE_COARSE_WAR_BARRIER")
    assert reg.flag("hierarchical_cache").env == ("WARPOLICY_HIERARCHICAL_CACHE",)
    assert not any(f.default for f in reg.flags.values())
    for flag in reg.flags.values():
        assert flag.env[0].startswith("WARPOLICY_"), flag.name


def test_spec_algorithms(reg):
    assert set(reg.spec_algorithms) == set(SPECS)
    for spec in reg.spec_algorithms.values():
        assert {"target_verify_read_done", "prefill_read_done"} <= set(spec.capabilities)
    verify = {n for n, s in reg.spec_algorithms.items() if s.has("target_verify_read_done")}
    prefill = {n for n, s in reg.spec_algorithms.items() if s.has("prefill_read_done")}
    assert verify == {"dflash", "dspark"}
    assert prefill == {"none", "dflash", "dspark"}
    assert reg.spec("dflash").family == reg.spec("dspark").family == "dflash"
    for name in ["eagle", "eagle3", "frozen_kv_mtp", "standalone"]:
        assert reg.spec(name).family == "eagle"
    assert "draft-extend" in reg.spec("eagle").doc


def test_every_sglang_backend_keeps_the_base_contract(reg):
    base = reg.backend("base")
    assert base.abstract
    assert base.reads_end == {DECODE: P.IN_GRAPH, VERIFY: P.IN_GRAPH}
    for name in SGLANG_BACKENDS:
        backend = reg.backend(name)
        assert backend.inherits == "base" and not backend.abstract, name
        assert not backend.latest_of and not backend.per_mode, name


def test_backend_exceptions(reg):
    declared = {n: dict(reg.backend(n).reads_end) for n in SGLANG_BACKENDS}
    exceptions = {n: d for n, d in declared.items() if d}
    assert exceptions == {"trtllm_mha": {EXTEND: P.PRE_REPLAY},
                          "dsv4": {VERIFY: P.POST_REPLAY}}
    assert "32460" in reg.backend("trtllm_mha").doc


def test_illustrative_wrappers(reg):
    composites = [b for b in reg.backends.values() if b.latest_of]
    per_mode = [b for b in reg.backends.values() if b.per_mode]
    assert len(composites) == 1 and len(per_mode) == 1
    assert set(composites[0].latest_of) <= set(SGLANG_BACKENDS)
    assert set(per_mode[0].per_mode.values()) <= set(SGLANG_BACKENDS)
    assert per_mode[0].per_mode[EXTEND] == "trtllm_mha"
    for wrapper in composites + per_mode:
        assert "llustrates" in wrapper.doc


def test_only_sglang_backends_and_wrappers_are_concrete(reg):
    assert set(reg.concrete_backends()) == set(SGLANG_BACKENDS) | {
        "tbo_fa3", "hybrid_trtllm_mha_flashinfer"}


def test_no_mode_beyond_decode_extend_verify_is_declared(reg):
    for backend in reg.backends.values():
        assert set(backend.reads_end) <= {DECODE, EXTEND, VERIFY}, backend.name
        assert not backend.gates, backend.name


def gate(reg: Registry, gate_id: str):
    (found,) = [g for g in reg.gates if g.id == gate_id]
    return found


def test_gates(reg):
    assert {g.id for g in reg.gates} == {
        "force-coarse", "target-verify-needs-capability", "prefill-opt-in",
        "prefill-needs-capability", "prefill-hierarchical-cache"}
    assert all(g.at_least is P.NONE and g.scope is None for g in reg.gates)
    assert gate(reg, "force-coarse").when == Conditions(flags={"force_coarse": True})
    assert gate(reg, "target-verify-needs-capability").when == Conditions(
        mode=frozenset({VERIFY}), spec_lacks=frozenset({"target_verify_read_done"}))
    assert gate(reg, "prefill-opt-in").when == Conditions(
        mode=frozenset({EXTEND}), flags={"prefill_read_done": False})
    assert gate(reg, "prefill-needs-capability").when == Conditions(
        mode=frozenset({EXTEND}), spec_lacks=frozenset({"prefill_read_done"}))
    assert gate(reg, "prefill-hierarchical-cache").when == Conditions(
        mode=frozenset({EXTEND}), flags={"hierarchical_cache": True})


def test_sound_demotion_is_not_a_gate_in_the_file(reg):
    """It is built into the engine for every registry; no gate tests runner facts."""
    for g in reg.gates:
        assert (g.when.planted, g.when.eager, g.when.external_events) == (None, None, None)
        assert g.when.declared is None
