"""SGLang's real kernels on the GPU (issue 19 items 3 and 5).

``create_flashinfer_kv_indices_triton`` + ``decode_attention_fwd`` (sglang 0.5.10.post1) and
``update_trtllm_mha_graph_metadata`` + ``build_trtllm_mha_page_table`` (sglang 0.5.23), loaded
by file path from the pinned wheels (`warpolicy.conformance`), run through warpolicy's runners
and audit. Proves: numerics equal a torch reference; the default registry's ``triton`` and
``trtllm_mha`` declarations (decode, target verify) are SAFE; each late-reader mutant is UNSAFE
by the dynamic test alone, demoted by the runner's self-check (the audit reports the refuted
declaration), and SAFE with derived placement, whose node follows SGLang's kernel; and 0.2's
``x + 1`` poison misses a late page-table rebuild on SGLang's kernel while the poison set
catches it (with the two plain-torch positive controls).

Needs the fetched files (``scripts/fetch-sglang-kernels``: ``.sglang/`` at the repository
root), triton and cuda-bindings. Run::

    PYTHONPATH=. python -m pytest -m cuda -q -s tests/gpu/test_conformance_cuda.py

Every test prints ``[conformance cuda] ...`` lines with what it measured.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from gpu_support import NEEDS_BINDINGS, NEEDS_CUDA, NEEDS_SGLANG, NEEDS_TRITON

from warpolicy.audit import run_audit
from warpolicy.audit.dynamic import audit_mode
from warpolicy.audit.poison import plus_one
from warpolicy.audit.report import Verdict
from warpolicy.conformance.controls import KINDS, control_subject
from warpolicy.conformance.factories import SPECS, subject
from warpolicy.conformance.loader import load_kernels
from warpolicy.conformance.paged import DECODE, VERIFY, reference_step
from warpolicy.registry.vocabulary import IN_GRAPH, POST_REPLAY
from warpolicy.runtime.manager import new_plugin_manager, open_platform

pytestmark = [*NEEDS_CUDA, NEEDS_SGLANG, NEEDS_TRITON, NEEDS_BINDINGS]

TRIALS = 20  # per audited declaration (the audit's SAFE needs at least 10 on a GPU)
CONTROL_TRIALS = 30  # the H200 finding was 0/30
MODES = {"decode": DECODE, "verify": VERIFY}
#: per mutant: the kernel the walk must name after the marker (None: an aten gather) and the
#: shared buffer it reads
LATE = {
    "triton+second_metadata": ("create_flashinfer_kv_indices_triton", "req_to_token"),
    "triton+swa_gather": (None, "full_to_swa"),
    "trtllm_mha+second_metadata": ("update_trtllm_mha_graph_metadata_kernel", "req_to_token"),
    "trtllm_mha+swa_gather": (None, "full_to_swa"),
    "trtllm_mha+late_page_table": ("create_trtllm_mha_kv_indices_triton", "req_to_token"),
}
#: the last shared reader derived placement must follow (None: an aten gather kernel)
FRONTIER = {
    "trtllm_mha@derived": "update_trtllm_mha_graph_metadata_kernel",
    "trtllm_mha+second_metadata@derived": "update_trtllm_mha_graph_metadata_kernel",
    "trtllm_mha+late_page_table@derived": "create_trtllm_mha_kv_indices_triton",
    "trtllm_mha+swa_gather@derived": None,
    "triton+second_metadata@derived": "create_flashinfer_kv_indices_triton",
    "triton+swa_gather@derived": None,
}


def say(text: str) -> None:
    print(f"[conformance cuda] {text}", flush=True)


@pytest.fixture(scope="module")
def platform():
    return open_platform(new_plugin_manager(load_entry_points=False, environ={}), "cuda")


@pytest.fixture(scope="module")
def kernels():
    return load_kernels()


def quietly(fn, *args, **kwargs):
    """``fn(...)`` with warnings recorded (runners warn on a demotion; the tests judge it)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    return result, [str(w.message) for w in caught]


def names_of(offenders) -> str:
    return ", ".join(sorted({f"{o.name} ({'/'.join(o.buffers)})" for o in offenders}))


def reads(offenders, kernel, buffer) -> bool:
    """Some offender reads ``buffer`` and (when ``kernel`` is given) is that kernel; without a
    kernel name, an aten index / gather kernel."""
    for o in offenders:
        if buffer not in o.buffers:
            continue
        if kernel is not None and kernel in o.name:
            return True
        if kernel is None and ("index" in o.name.lower() or "gather" in o.name.lower()):
            return True
    return False


# ---------------------------------------------------------------------------------------------
# Numerics
# ---------------------------------------------------------------------------------------------


def metadata_problems(adapter, bucket: int, batch) -> list[str]:
    """The metadata SGLang's kernels left in the bucket's buffers, against torch."""
    s, state = adapter.static[bucket], adapter.state
    table, f2s, window = state.req_to_token, state.full_to_swa, adapter.cfg.swa_window
    verify = adapter.mode == VERIFY
    problems = []
    if adapter.backend == "trtllm_mha":
        lens = batch.seq_lens + (batch.queries if verify else 0)
        n = batch.requests
        if s.cache_seqlens[:n].tolist() != lens.tolist():
            problems.append("cache_seqlens")
        if s.cu_seqlens_k[1 : n + 1].tolist() != torch.cumsum(lens, 0).tolist():
            problems.append("cu_seqlens_k")
        for i in range(n):
            row, pages = int(batch.req_pool_indices[i]), -(-int(lens[i]) // 64)
            starts = table[row, : pages * 64 : 64].long()
            if s.page_table[i, :pages].tolist() != (starts // 64).tolist():
                problems.append(f"page_table row {i}")
            if s.swa_page_table[i, :pages].tolist() != (f2s[starts] // 64).tolist():
                problems.append(f"swa_page_table row {i}")
        if s.swa_out_cache_loc[: batch.size].tolist() != f2s[batch.out_cache_loc].tolist():
            problems.append("swa_out_cache_loc")
        return problems
    spans = []  # triton: one decode row per token (verify: per draft token)
    for i in range(batch.requests):
        for d in range(batch.queries):
            length = int(batch.seq_lens[i]) + (d + 1 if verify else 0)
            spans.append((int(batch.req_pool_indices[i]), length))
    full, win = [], []
    for row, length in spans:
        full.append(table[row, :length].long())
        win.append(f2s[table[row, max(0, length - window) : length].long()])
    full_t, win_t = torch.cat(full), torch.cat(win)
    if s.kv_indices[: full_t.numel()].tolist() != full_t.tolist():
        problems.append("kv_indices")
    if s.window_kv_indices[: win_t.numel()].tolist() != win_t.tolist():
        problems.append("window_kv_indices")
    if s.swa_loc[: batch.size].tolist() != f2s[batch.out_cache_loc].tolist():
        problems.append("swa_loc")
    return problems


@pytest.mark.parametrize("mode_name", list(MODES))
@pytest.mark.parametrize("backend", ["triton", "trtllm_mha"])
def test_numerics_equal_a_torch_reference(platform, kernels, backend, mode_name):
    mode = MODES[mode_name]
    subj = subject(backend, mode, platform, kernels=kernels)
    adapter, state = subj.model, subj.model.state
    runner = subj.runners[mode](adapter)
    _, warned = quietly(runner.capture)
    assert not [w for w in warned if "warpolicy" in w], warned
    policies = {b: c.policy for b, c in runner.captured.items()}
    assert set(policies.values()) == {IN_GRAPH}, policies  # the self-check passed every bucket
    worst = worst_pool = 0.0
    bitwise = steps = 0
    for trial in range(2 * len(runner.buckets)):
        batch = adapter.make_batch(mode, trial)
        before = state.snapshot()
        out = runner.run(batch)
        platform.synchronize()
        bucket = runner.last_step.bucket
        assert bucket is not None and runner.last_step.policy is IN_GRAPH
        got = out[: batch.size].float().clone()
        after = state.snapshot()
        want, want_pools = reference_step(state, batch, mode, before)
        torch.testing.assert_close(got, want.float(), rtol=2e-2, atol=6e-2)
        worst = max(worst, float((got - want.float()).abs().max()))
        for name, pool in want_pools.items():  # page 0 is the sink padded tokens write to
            torch.testing.assert_close(after[name][64:], pool[64:], rtol=2e-2, atol=6e-2)
            worst_pool = max(worst_pool, float((after[name][64:] - pool[64:]).float().abs().max()))
        assert metadata_problems(adapter, bucket, batch) == []
        for name, pool in state.kv_pools.items():  # the same step eagerly, from the same state
            pool.copy_(before[name])
        adapter.host_prep(batch, bucket)
        adapter.graph_prep(bucket)
        eager = adapter.forward(bucket)[: batch.size].float()
        platform.synchronize()
        torch.testing.assert_close(eager, got, rtol=2e-2, atol=6e-2)
        bitwise += bool(torch.equal(eager, got))
        steps += 1
    dtype = str(adapter.cfg.dtype).removeprefix("torch.")
    say(
        f"numerics {backend} {mode.label}: {steps} graph replays over buckets "
        f"{list(runner.buckets)}: max |graph - torch reference| {worst:.3g} ({dtype} output), "
        f"KV writes {worst_pool:.3g}; SGLang's metadata equal to torch's in every step; "
        f"graph == eager bitwise in {bitwise}/{steps}"
    )


# ---------------------------------------------------------------------------------------------
# The audit
# ---------------------------------------------------------------------------------------------


def audit(platform, factory: str, trials: int = TRIALS):
    report, warned = quietly(
        run_audit, factory=f"warpolicy.conformance.factories:{factory}", trials=trials,
        platform=platform,
    )  # fmt: skip
    return report, warned


def test_the_registrys_declarations_are_safe(platform):
    report, _ = audit(platform, "declared")
    for e in report.entries:
        say(
            f"audit {e.backend} {e.mode.label} (spec {e.spec}): declared {e.declared.label}, "
            f"published {e.policy.label}: {e.verdict.name}; dynamic {e.dynamic.summary()} "
            f"({e.dynamic.caught_line()}); static {e.static.summary()} "
            f"({e.static.readers} shared readers in {e.static.nodes} nodes)"
        )
    assert [(e.backend, e.mode, e.spec) for e in report.entries] == [
        (b, m, SPECS[m]) for b in ("triton", "trtllm_mha") for m in (DECODE, VERIFY)
    ]
    for e in report.entries:
        assert e.declared is IN_GRAPH and e.policy is IN_GRAPH, e
        assert e.verdict is Verdict.SAFE, (e.backend, e.mode, e.dynamic, e.static)
        assert not e.static.offenders, e.static
        # SAFE, unless some library kernel after the release hides its parameter layout
        assert e.static.verdict is Verdict.SAFE or (
            e.static.verdict is Verdict.INCONCLUSIVE
            and "could not read the arguments" in e.static.reason
        ), e.static
    assert report.exit_code == 0


def test_mutants_are_unsafe_by_the_dynamic_test_alone(platform):
    report, _ = audit(platform, "mutants")
    assert sorted(e.backend for e in report.entries) == sorted(LATE)
    for e in report.entries:
        say(
            f"mutant {e.backend} (marker, no self-check): published {e.policy.label}; dynamic "
            f"{e.dynamic.summary()} ({e.dynamic.caught_line()}); static names "
            f"{names_of(e.static.offenders) or e.static.summary()}"
        )
    for e in report.entries:
        kernel, buffer = LATE[e.backend]
        assert e.policy is IN_GRAPH
        assert e.dynamic.verdict is Verdict.UNSAFE, (e.backend, e.dynamic)
        assert reads(e.static.offenders, kernel, buffer), (e.backend, e.static)
    assert report.exit_code == 1


def test_the_self_check_demotes_each_mutant_and_the_audit_says_refuted(platform):
    report, warned = audit(platform, "mutants_self_check")
    for e in report.entries:
        late = names_of(e.refuted.late) if e.refuted is not None else "-"
        say(
            f"mutant {e.backend}: runner published {e.policy.label}; verdict {e.verdict.name}, "
            f"refuted at capture by the self-check naming {late}"
        )
    assert len(report.entries) == len(LATE)
    for e in report.entries:
        kernel, buffer = LATE[e.backend.removesuffix("@self-check")]
        assert e.policy is POST_REPLAY, (e.backend, e.policy)  # demoted at capture
        assert e.verdict is Verdict.UNSAFE and e.refuted is not None, (e.backend, e.dynamic)
        assert reads(e.refuted.late, kernel, buffer), (e.backend, e.refuted)
    assert any("demoted to post_replay" in w for w in warned)
    assert report.exit_code == 1


def test_derived_placement_makes_each_mutant_safe_after_sglangs_kernel(platform, kernels):
    report, _ = audit(platform, "mutants_derived")
    declared, _ = audit(platform, "derived")
    entries = list(declared.entries) + list(report.entries)
    for e in entries:
        say(
            f"derived {e.backend} {e.mode.label}: published {e.policy.label}: {e.verdict.name}; "
            f"dynamic {e.dynamic.summary()}; static {e.static.summary()}"
        )
        assert e.policy is IN_GRAPH and e.verdict is Verdict.SAFE, (e.backend, e.dynamic)
    for e in entries:  # where the node went: the capture report of a runner built the same way
        mutant = e.backend.removesuffix("@derived").partition("+")[2] or None
        backend = e.backend.partition("+")[0].removesuffix("@derived")
        subj = subject(
            backend, e.mode, platform, mutant=mutant, placement="derived", kernels=kernels
        )
        runner = subj.runners[e.mode](subj.model)
        _, warned = quietly(runner.capture)
        assert not [w for w in warned if "warpolicy" in w], warned
        want = FRONTIER[e.backend]
        for _bucket, rep in sorted(runner.capture_report.items()):
            assert rep.planted and rep.ok, rep
            if want is not None:
                assert want in rep.detail, rep.detail
            else:
                assert "index" in rep.detail.lower() or "gather" in rep.detail.lower(), rep.detail
        rep = runner.capture_report[max(runner.capture_report)]
        say(f"derived {e.backend} {e.mode.label}, largest bucket: {rep.detail}")


# ---------------------------------------------------------------------------------------------
# Poisons (item 5)
# ---------------------------------------------------------------------------------------------


def test_the_old_poison_misses_sglangs_late_page_table_rebuild(platform, kernels):
    def run(poison):
        s = subject(
            "trtllm_mha", DECODE, platform, mutant="late_page_table", self_check="off",
            kernels=kernels, poison=poison,
        )  # fmt: skip
        entry, _ = quietly(audit_mode, s, DECODE, CONTROL_TRIALS)
        return entry

    missed = run({"req_to_token": plus_one, "full_to_swa": plus_one})
    caught = run(None)
    say(
        f"poison control on SGLang's build_trtllm_mha_page_table after the marker: 0.2's x+1 "
        f"caught {missed.dynamic.corrupted}/{missed.dynamic.trials} ({missed.verdict.name}); "
        f"the poison set {caught.dynamic.corrupted}/{caught.dynamic.trials} "
        f"({caught.dynamic.caught_line()})"
    )
    assert missed.dynamic.trials == CONTROL_TRIALS and missed.dynamic.corrupted == 0
    assert caught.dynamic.verdict is Verdict.UNSAFE
    assert dict(caught.dynamic.caught)["half_turn"] > 0


@pytest.mark.parametrize("kind", KINDS)
def test_poison_positive_controls(platform, kind):
    old = {"req_to_token": plus_one, "seq_lens": plus_one}
    results = {}
    for label, late, poison in (
        ("x+1", True, old),
        ("set", True, None),
        ("set, no late read", False, None),
    ):
        entry, _ = quietly(
            audit_mode, control_subject(kind, platform, late=late, poison=poison), DECODE,
            CONTROL_TRIALS,
        )  # fmt: skip
        results[label] = entry
    say(
        f"control {kind}: "
        + "; ".join(
            f"{label}: {e.verdict.name} {e.dynamic.corrupted}/{e.dynamic.trials}"
            + (f" ({e.dynamic.caught_line()})" if label == "set" else "")
            for label, e in results.items()
        )
    )
    assert results["x+1"].dynamic.corrupted == 0
    assert results["x+1"].dynamic.trials == CONTROL_TRIALS
    assert results["set"].dynamic.verdict is Verdict.UNSAFE
    assert results["set, no late read"].verdict is Verdict.SAFE, results["set, no late read"]
