"""warpolicy.bench.decide: the decision-latency benchmark agrees with the anchor before timing
(figures are printed, never asserted)."""

from __future__ import annotations

from warpolicy.bench.decide import (
    AnchorPerBatchRunner,
    _AnchorBatch,
    _AnchorMode,
    _batches,
    bench_lookup,
    format_decide,
)
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.vocabulary import ForwardMode as M
from warpolicy.registry.vocabulary import WarReadDonePolicy as P


def test_the_per_batch_anchor_matches_the_registry_on_every_batch():
    engine = PolicyEngine.load(environ={})
    step = engine.compile("dsv4", "dspark", {"prefill_read_done": True}, strict=True).per_batch()
    anchor = AnchorPerBatchRunner("dspark")
    for tokens in (1, 11673, 11674, 50000):
        for built in (False, True):
            facts = {"num_qo_tokens": tokens, "sparse_prefill_snapshot": built}
            for mode in (M.DECODE, M.TARGET_VERIFY, M.EXTEND):
                want = anchor.war_read_done_policy_batch(
                    _AnchorMode(mode), _AnchorBatch(tokens, built)
                )
                assert step(mode, facts) is want, (mode, facts)
    assert step(M.EXTEND, {"num_qo_tokens": 50000}) is P.NONE


def test_the_anchor_stages_for_eagle_and_publishes_after_staging():
    anchor = AnchorPerBatchRunner("eagle")
    batch = _AnchorBatch(8, False)
    assert anchor.war_read_done_policy_batch(_AnchorMode(M.EXTEND), batch) is P.NONE
    anchor.stager = lambda _batch: True
    assert anchor.war_read_done_policy_batch(_AnchorMode(M.EXTEND), batch) is P.PRE_REPLAY


def test_batches_cover_both_sides_of_the_threshold():
    steps = _batches(12)
    assert {n > 11673 for n, _ in steps} == {True, False}
    assert {built for _, built in steps} == {True, False}


def test_a_short_run_reports_every_row():
    result = bench_lookup(iterations=400, repeats=1)
    for key in ("engine_ns", "lookup_ns", "baseline_ns", "per_batch_ns", "per_batch_anchor_ns"):
        assert isinstance(result[key], float), key
    result["load"] = {"backends": 1, "gates": 1, "load_s": 0.0, "table_s": 0.0, "table_rows": 1}
    text = format_decide(result)
    assert "CompiledPolicy.per_batch()" in text and "per_batch / baseline" in text
